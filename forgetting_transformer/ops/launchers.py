"""The op's kernels one stage at a time: the surface that the kernel tools (``benchmarks/attention/``) use.

``forgetting_attention`` validates its inputs, picks the kernels (Gluon on Hopper at head dims 64 / 128 without
documents or padding, Triton elsewhere) and chains them. A tool that times, profiles, compiles or compares one
kernel, or runs a tile config the op does not pick, calls it here instead of reaching into the op's module.
Nothing in the package calls these functions; they call the same launchers the op does, so what they time is
what the op runs.

Inputs are as the op's kernels take them: q ``(B, Tq, H, D)``, k / v ``(B, Tk, Hkv, D)`` (bf16 / fp16, contiguous),
log_fgate ``(B, Tk, H)`` fp32, causal, no documents or padding; ``sm_scale`` defaults to ``D ** -0.5``. ``acp``
is ``None`` (dense) or the ``(lo, hi)`` tables of ``acp_tables``. ``kernel="gluon"`` needs a Hopper GPU and a
head dim in ``GLUON_CONFIGS[kind]``; ``config`` is one tuple of that table's layout (``None``: the op's pick).

    acp_tables      ACP's (lo, hi) tables and threshold, as the op forms them
    block_prefix    the block-local prefix sums of log f that the kernels read (PK, PQ)
    forward         one forward kernel: (o, lse)
    backward_dq     the dq kernel: (dq, row sums of dS, delta)
    backward_dkdv   the dk/dv kernel: (dk, dv, column sums of dS)
    backward_fused  the one-kernel backward (Gluon, head dim 64): (dq, dk, dv, row sums, column sums)
    dlogf           d log f from the row and column sums
    backward        the whole backward as the op runs it: (dq, dk, dv, d log f)
    triton_config   a context that forces one tile config of a Triton kernel
    jit_kernel      a ``@triton.jit`` / ``@gluon.jit`` function by name (for ahead-of-time compiles)
    host_stages     a context that times the op's host-side stages and kernel launches
"""

from __future__ import annotations

import contextlib
import importlib
import time

from . import acp as _acp

_fa = importlib.import_module(f"{__package__}.forgetting_attention")  # the module (the package exports the op)

DEFAULT_EPS = _acp.DEFAULT_EPS

#: The Gluon kernels' tile configs per head dim: fwd / dq (rows per consumer warpgroup, BLOCK_N, stages, consumer
#: warpgroups), dkdv (query rows per tile, keys per consumer warpgroup, stages, consumer warpgroups), fused (query
#: rows per tile, keys per consumer warpgroup, stages, staging slots per warpgroup; two consumer warpgroups).
GLUON_CONFIGS = {"fwd": _fa._SM90_CONFIGS, "dq": _fa._SM90_DQ_CONFIGS, "dkdv": _fa._SM90_BWD_CONFIGS,
                 "fused": _fa._SM90_FUSED_CONFIGS}

#: The Gluon kernels' names (as profilers show them) per kind.
GLUON_KERNELS = {"fwd": "fox_fwd_sm90_kernel", "dq": "fox_bwd_dq_sm90_kernel", "dkdv": "fox_bwd_dkdv_sm90_kernel",
                 "fused": "fox_bwd_fused_sm90_kernel"}

_KINDS = ("triton", "gluon")


def _scale(q, sm_scale):
    return q.shape[-1] ** -0.5 if sm_scale is None else float(sm_scale)


def _kernel_arg(kernel):
    if kernel not in _KINDS:
        raise ValueError(f"kernel must be one of {_KINDS}; got {kernel!r}")
    return kernel == "gluon"


def acp_grid(head_dim: int) -> tuple[int, int]:
    """ACP's grid (GM, GN) at ``head_dim``: the pruned region is defined on it (64 x 64 on GPUs for D <= 128)."""
    return _fa._acp_grid(max(16, _fa._next_pow2(head_dim)))


def acp_tables(q, k, log_fgate, *, sm_scale=None, threshold="auto", eps=DEFAULT_EPS, qk_norm_weights=None):
    """ACP's tables as the op forms them for ``adaptive_threshold=threshold``: (lo (B*H, query blocks), hi (B*H,
    key blocks), delta (B, H)), int32 / int32 / fp32 on ACP's grid (``acp_grid``)."""
    return _fa._acp_tables_for(q, k, log_fgate, _scale(q, sm_scale), threshold, eps, qk_norm_weights)


def block_prefix(log_fgate, Tq, *, query_side=True, key_side=True):
    """(PK, PQ): the prefix sums of log f within aligned blocks of 16 / 32 / 64 / 128 positions over key positions
    and over query rows, each (4, B*H, T rounded up to 128) fp32 (None for a side not asked for)."""
    return _fa._block_prefix(log_fgate, Tq, query_side=query_side, key_side=key_side)


@contextlib.contextmanager
def triton_config(kind, block_m, block_n, num_warps, num_stages):
    """Within the context, the Triton kernel ``kind`` ("fwd", "dq" or "dkdv") launches with this config instead of
    the autotuner's pick."""
    if kind not in ("fwd", "dq", "dkdv"):
        raise ValueError(f"kind must be 'fwd', 'dq' or 'dkdv'; got {kind!r}")
    saved = _fa._FORCE_CONFIGS.get(kind)
    _fa._FORCE_CONFIGS[kind] = (dict(BLOCK_M=block_m, BLOCK_N=block_n), num_warps, num_stages)
    try:
        yield
    finally:
        if saved is None:
            _fa._FORCE_CONFIGS.pop(kind, None)
        else:
            _fa._FORCE_CONFIGS[kind] = saved


def _triton(kind, config, call):
    if config is None:
        return call()
    with triton_config(kind, *config):
        return call()


def forward(q, k, v, log_fgate, *, sm_scale=None, kernel="triton", config=None, acp=None):
    """One forward kernel: (o (B, Tq, H, D), lse (B, H, Tq) fp32, base 2). ``config``: Gluon (rows per warpgroup,
    BLOCK_N, stages, warpgroups) or Triton (BLOCK_M, BLOCK_N, warps, stages)."""
    sm = _scale(q, sm_scale)
    if _kernel_arg(kernel):
        return _fa._fwd_launch_sm90(q, k, v, log_fgate, sm, config, acp_tables=acp)
    return _triton("fwd", config, lambda: _fa._fwd_launch(q, k, v, log_fgate, None, sm, acp))


def backward_dq(do, q, k, v, log_fgate, pk, o, lse, *, sm_scale=None, kernel="triton", config=None, acp=None):
    """The dq kernel: (dq, row sums of dS (B, Tq, H) fp32, delta = rowsum(o * do) (B, H, Tq) fp32); ``pk`` from
    ``block_prefix``, ``o`` / ``lse`` from ``forward``."""
    sm = _scale(q, sm_scale)
    if _kernel_arg(kernel):
        return _fa._bwd_dq_sm90(do, q, k, v, log_fgate, pk, o, lse, sm, config, acp_tables=acp)
    return _triton("dq", config, lambda: _fa._bwd_dq(do, q, k, v, log_fgate, pk, o, lse, None, sm, acp))


def backward_dkdv(do, q, k, v, log_fgate, pq, lse, delta, *, sm_scale=None, kernel="triton", config=None,
                  acp=None):
    """The dk/dv kernel: (dk, dv, column sums of dS (B, Tk, H) fp32); ``pq`` from ``block_prefix``, ``delta``
    from ``backward_dq``."""
    sm = _scale(q, sm_scale)
    if _kernel_arg(kernel):
        return _fa._bwd_dkdv_sm90(do, q, k, v, log_fgate, pq, lse, delta, sm, config, acp_tables=acp)
    return _triton("dkdv", config,
                   lambda: _fa._bwd_dkdv(do, q, k, v, log_fgate, pq, lse, delta, None, None, sm, acp))


def backward_fused(do, q, k, v, log_fgate, o, lse, *, sm_scale=None, config=None, acp=None):
    """The one-kernel Gluon backward with its set-up launch (Hopper, head dims in ``GLUON_CONFIGS["fused"]``):
    (dq, dk, dv, row sums, column sums of dS). Not bitwise reproducible (the dq adds land in a varying order)."""
    return _fa._bwd_fused_sm90(do, q, k, v, log_fgate, o, lse, _scale(q, sm_scale), config, acp_tables=acp)


def dlogf(drow, dcol):
    """d log f (B, Tk, H) fp32 from the row sums (B, Tq, H) and column sums (B, Tk, H) of dS (two launches)."""
    return _fa._bwd_dlogf(drow, dcol)


def backward(do, q, k, v, log_fgate, o, lse, *, sm_scale=None, acp=None):
    """The whole backward as the op runs it (the one kernel or the dq and dk/dv kernels, per ``FOX_FUSED_BWD``,
    deterministic algorithms and the device): (dq, dk, dv, d log f)."""
    return _fa._bwd_launch(do, q, k, v, log_fgate, o, lse, None, None, _scale(q, sm_scale), acp)


def gluon_runs(kind, q, k, v, *more):
    """Whether the op runs the Gluon kernel ``kind`` ("fwd", "dq", "dkdv" or "fused") for these tensors (``more``:
    do and o for the backward kinds)."""
    if kind == "fused":
        return _fa._use_fused_bwd(q, k, v, *more)
    return _fa._use_sm90(q, k, v, GLUON_CONFIGS[kind], *more)


def gluon_maxnreg(num_warps: int) -> int:
    """The register limit a Gluon kernel of ``num_warps`` compute warps (plus the loader's warpgroup) launches
    with."""
    return _fa._sm90_maxnreg(num_warps)


def jit_kernel(name: str):
    """The ``@triton.jit`` function of ``ops/triton_kernels.py`` or the ``@gluon.jit`` function of
    ``ops/gluon_kernels.py`` named ``name`` (e.g. ``_attn_fwd_kernel``, ``fox_fwd_sm90_kernel``)."""
    mod = "gluon_kernels" if name.startswith("fox_") else "triton_kernels"
    module = importlib.import_module(f"{__package__}.{mod}")
    if not hasattr(module, name):
        raise ValueError(f"no kernel {name!r} in ops/{mod}.py")
    return getattr(module, name)


#: The op's host-side stages that ``host_stages`` times (functions of ``ops/forgetting_attention.py``).
HOST_STAGES = ("_forgetting_attention_triton", "check_inputs", "_check_kernel_inputs", "_row_bounds",
               "_acp_tables_for", "_acp_launch", "_fwd_impl", "_fwd_launch_sm90", "_block_prefix", "_bwd_impl",
               "_bwd_launch", "_use_fused_bwd", "_use_sm90", "_bwd_fused_sm90", "_bwd_fused_setup", "_bwd_dlogf",
               "_tma_desc", "_tma_vec", "_query_vec")


@contextlib.contextmanager
def host_stages():
    """Within the context, every call of the op's host-side stages (``HOST_STAGES``) and every kernel launch
    (``launch <kernel name>``: triton's argument binding and specialisation, TMA descriptors, the driver call)
    adds its inclusive wall seconds to the dict the context yields (clear it between timings). Nested stages
    overlap, so the entries do not add up to a call."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    acc: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    def timed_run(run):
        def wrapper(self, *a, **kw):
            t0 = time.perf_counter()
            try:
                return run(self, *a, **kw)
            finally:
                key = f"launch {self.fn.__name__}"
                acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0
        return wrapper

    runs = {cls: cls.run for cls in (JITFunction, InterpretedFunction)}  # (the interpreter's: CPU runs)
    saved = {name: getattr(_fa, name) for name in HOST_STAGES}
    try:
        for cls, run in runs.items():
            cls.run = timed_run(run)
        for name in HOST_STAGES:
            setattr(_fa, name, timed(name, saved[name]))
        yield acc
    finally:
        for cls, run in runs.items():
            cls.run = run
        for name, fn in saved.items():
            setattr(_fa, name, fn)

