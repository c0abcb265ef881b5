"""The op's kernels one stage at a time: the surface that the kernel tools (``benchmarks/attention/``) use.

``forgetting_attention`` validates its inputs, picks the kernels (Gluon on Hopper at head dims 64 / 128 without
documents or padding, Triton elsewhere) and chains them. A tool that times, profiles, compiles or compares one
kernel, or runs a tile config the op does not pick, calls it here instead of reaching into the op's modules.
Nothing in the package calls these functions; they call the same launchers the op does, under the default
options (``options.default_options``; ``use_options`` changes them for a block), so what they time is what the
op runs.

Inputs are as the op's kernels take them: q ``(B, Tq, H, D)``, k / v ``(B, Tk, Hkv, D)`` (bf16 / fp16, contiguous),
log_fgate ``(B, Tk, H)`` fp32, causal, no documents or padding; ``sm_scale`` defaults to ``D ** -0.5``. ``acp``
is ``None`` (dense) or the ``(lo, hi)`` tables of ``acp_tables``. ``kernel="gluon"`` needs a Hopper GPU and a
head dim in ``GLUON_CONFIGS[kind]``; ``config`` is one tuple of that table's layout, or for the Triton kernels a
``TileConfig`` / (BLOCK_M, BLOCK_N, warps, stages) (``None``: the op's pick).

    acp_grid        ACP's grid at a head dim
    acp_tables      ACP's (lo, hi) tables and threshold, as the op forms them
    block_prefix    the block-local prefix sums of log f that the kernels read (PK, PQ)
    forward         one forward kernel: (o, lse)
    backward_dq     the dq kernel: (dq, row sums of dS, delta)
    backward_dkdv   the dk/dv kernel: (dk, dv, column sums of dS)
    backward_fused  the one-kernel backward (Gluon, head dim 64): (dq, dk, dv, row sums, column sums)
    dlogf           d log f from the row and column sums
    backward        the whole backward as the op runs it: (dq, dk, dv, d log f)
    triton_config   a context that forces one tile config of a Triton kernel
    shared_memory   the shared memory a Triton kernel's config asks for (the bound the op prunes configs by)
    jit_kernel      a ``@triton.jit`` / ``@gluon.jit`` function by name (for ahead-of-time compiles)
    host_stages     a context that times the op's host-side stages and kernel launches
"""

from __future__ import annotations

import contextlib
import importlib
import time

from .. import launch_cache as _launch_cache
from . import acp as _acp
from . import autograd as _ag
from . import tiles as _tiles
from .gluon import launch as _gl
from ..options import TileConfig, default_options, use_options
from .triton import launch as _tl

DEFAULT_EPS = _acp.DEFAULT_EPS

#: The Gluon kernels' tile configs per head dim: fwd / dq (rows per consumer warpgroup, BLOCK_N, stages, consumer
#: warpgroups), dkdv (query rows per tile, keys per consumer warpgroup, stages, consumer warpgroups), fused (query
#: rows per tile, keys per consumer warpgroup, stages, staging slots per warpgroup; two consumer warpgroups).
GLUON_CONFIGS = {"fwd": _tiles.GLUON_FWD_CONFIGS, "dq": _tiles.GLUON_DQ_CONFIGS, "dkdv": _tiles.GLUON_DKDV_CONFIGS,
                 "fused": _tiles.GLUON_FUSED_CONFIGS}

#: The Gluon kernels' names (as profilers show them) per kind.
GLUON_KERNELS = {"fwd": "fox_fwd_sm90_kernel", "dq": "fox_bwd_dq_sm90_kernel", "dkdv": "fox_bwd_dkdv_sm90_kernel",
                 "fused": "fox_bwd_fused_sm90_kernel"}

#: The Triton kernels' tile configs per kind: what the autotuner times, and (largest padded head dim, config)
#: pairs used with autotuning off.
TRITON_AUTOTUNE_CONFIGS = _tiles.AUTOTUNE_CONFIGS
TRITON_HEAD_DIM_CONFIGS = _tiles.HEAD_DIM_CONFIGS

#: The Triton kernels' names per kind.
TRITON_KERNELS = {"fwd": "_attn_fwd_kernel", "dq": "_attn_bwd_dq_kernel", "dkdv": "_attn_bwd_dkdv_kernel"}

_KINDS = ("triton", "gluon")


def _scale(q, sm_scale):
    return q.shape[-1] ** -0.5 if sm_scale is None else float(sm_scale)


def _kernel_arg(kernel):
    if kernel not in _KINDS:
        raise ValueError(f"kernel must be one of {_KINDS}; got {kernel!r}")
    return kernel == "gluon"


def _options(kind=None, config=None):
    """The default options, with ``config`` forced for the Triton kernel ``kind``."""
    opts = default_options()
    if config is None:
        return opts
    return opts.replace(triton_configs={**dict(opts.triton_configs), kind: config})


def acp_grid(head_dim: int) -> tuple[int, int]:
    """ACP's grid (GM, GN) at ``head_dim``: the pruned region is defined on it (64 x 64 on GPUs for D <= 128)."""
    return _acp.grid(head_dim, default_options().acp_grid)


def acp_tables(q, k, log_fgate, *, sm_scale=None, threshold="auto", eps=DEFAULT_EPS, qk_norm_weights=None):
    """ACP's tables as the op forms them for ``adaptive_threshold=threshold``: (lo (B*H, query blocks), hi (B*H,
    key blocks), delta (B, H)), int32 / int32 / fp32 on ACP's grid (``acp_grid``)."""
    return _ag.acp_tables_for(q, k, log_fgate, _scale(q, sm_scale), threshold, eps, qk_norm_weights,
                              default_options())


def block_prefix(log_fgate, Tq, *, query_side=True, key_side=True):
    """(PK, PQ): the prefix sums of log f within aligned blocks of 16 / 32 / 64 / 128 positions over key positions
    and over query rows, each (4, B*H, T rounded up to 128) fp32 (None for a side not asked for)."""
    return _tl.block_prefix(log_fgate, Tq, query_side=query_side, key_side=key_side)


@contextlib.contextmanager
def triton_config(kind, block_m, block_n, num_warps, num_stages):
    """Within the context, the Triton kernel ``kind`` ("fwd", "dq" or "dkdv") launches with this config instead of
    the autotuner's pick (``use_options`` with ``triton_configs``)."""
    if kind not in _tiles.AUTOTUNE_CONFIGS:
        raise ValueError(f"kind must be 'fwd', 'dq' or 'dkdv'; got {kind!r}")
    with use_options(_options(kind, TileConfig(block_m, block_n, num_warps, num_stages))) as opts:
        yield opts


def shared_memory(kind, config, head_dim, elem_bytes=2, arch=90) -> int:
    """The shared memory (bytes) the Triton kernel ``kind`` asks for with ``config`` (a ``TileConfig`` or tuple) at
    ``head_dim`` with ``elem_bytes``-byte inputs on compute capability ``arch``: the upper bound by which the op
    prunes configs (``tiles.shared_memory``)."""
    cfg = config if isinstance(config, TileConfig) else TileConfig(*config)
    return _tiles.shared_memory(kind, cfg, _tiles.padded_head_dim(head_dim), elem_bytes, arch)


def forward(q, k, v, log_fgate, *, sm_scale=None, kernel="triton", config=None, acp=None):
    """One forward kernel: (o (B, Tq, H, D), lse (B, H, Tq) fp32, base 2)."""
    sm = _scale(q, sm_scale)
    if _kernel_arg(kernel):
        return _gl.fwd_sm90(q, k, v, log_fgate, sm, config, acp_tables=acp, grid=acp_grid(q.shape[-1]))
    return _tl.fwd(q, k, v, log_fgate, None, sm, _options("fwd", config), acp)


def backward_dq(do, q, k, v, log_fgate, pk, o, lse, *, sm_scale=None, kernel="triton", config=None, acp=None):
    """The dq kernel: (dq, row sums of dS (B, Tq, H) fp32, delta = rowsum(o * do) (B, H, Tq) fp32); ``pk`` from
    ``block_prefix``, ``o`` / ``lse`` from ``forward``."""
    sm = _scale(q, sm_scale)
    if _kernel_arg(kernel):
        return _gl.bwd_dq_sm90(do, q, k, v, log_fgate, pk, o, lse, sm, config, acp_tables=acp,
                               grid=acp_grid(q.shape[-1]))
    return _tl.bwd_dq(do, q, k, v, log_fgate, pk, o, lse, None, sm, _options("dq", config), acp)


def backward_dkdv(do, q, k, v, log_fgate, pq, lse, delta, *, sm_scale=None, kernel="triton", config=None,
                  acp=None):
    """The dk/dv kernel: (dk, dv, column sums of dS (B, Tk, H) fp32); ``pq`` from ``block_prefix``, ``delta``
    from ``backward_dq``."""
    sm = _scale(q, sm_scale)
    if _kernel_arg(kernel):
        return _gl.bwd_dkdv_sm90(do, q, k, v, log_fgate, pq, lse, delta, sm, config, acp_tables=acp,
                                 grid=acp_grid(q.shape[-1]))
    return _tl.bwd_dkdv(do, q, k, v, log_fgate, pq, lse, delta, None, None, sm, _options("dkdv", config), acp)


def backward_fused(do, q, k, v, log_fgate, o, lse, *, sm_scale=None, config=None, acp=None):
    """The one-kernel Gluon backward with its set-up launch (Hopper, head dims in ``GLUON_CONFIGS["fused"]``):
    (dq, dk, dv, row sums, column sums of dS). Not bitwise reproducible (the dq adds land in a varying order)."""
    return _gl.bwd_fused_sm90(do, q, k, v, log_fgate, o, lse, _scale(q, sm_scale), config, acp_tables=acp,
                              grid=acp_grid(q.shape[-1]))


def dlogf(drow, dcol):
    """d log f (B, Tk, H) fp32 from the row sums (B, Tq, H) and column sums (B, Tk, H) of dS (two launches)."""
    return _tl.bwd_dlogf(drow, dcol)


def backward(do, q, k, v, log_fgate, o, lse, *, sm_scale=None, acp=None):
    """The whole backward as the op runs it under the default options (the one kernel or the dq and dk/dv kernels,
    per ``fused_backward`` / ``deterministic`` and the device): (dq, dk, dv, d log f)."""
    return _ag.bwd(do, q, k, v, log_fgate, o, lse, None, None, _scale(q, sm_scale), default_options(), acp)


def gluon_runs(kind, q, k, v, *more):
    """Whether the op runs the Gluon kernel ``kind`` ("fwd", "dq", "dkdv" or "fused") for these tensors under the
    default options (``more``: do and o for the backward kinds)."""
    if kind == "fused":
        return _gl.use_fused_bwd(q, k, v, *more, default_options())
    return _gl.use_sm90(q, k, v, GLUON_CONFIGS[kind], default_options(), *more)


def gluon_maxnreg(num_warps: int) -> int:
    """The register limit a Gluon kernel of ``num_warps`` compute warps (plus the loader's warpgroup) launches
    with."""
    return _tiles.gluon_maxnreg(num_warps)


def jit_kernel(name: str):
    """The ``@triton.jit`` function of ``triton/kernels.py`` or the ``@gluon.jit`` function of ``gluon/kernels.py``
    named ``name`` (e.g. ``_attn_fwd_kernel``, ``fox_fwd_sm90_kernel``)."""
    mod = "gluon" if name.startswith("fox_") else "triton"
    module = importlib.import_module(f"{__package__}.{mod}.kernels")
    if not hasattr(module, name):
        raise ValueError(f"no kernel {name!r} in {mod}/kernels.py")
    return getattr(module, name)


#: The op's host-side stages that ``host_stages`` times, as "module.function" (modules of this package; every call
#: between the op's modules goes through the module's attribute, so replacing it there times every call).
HOST_STAGES = ("autograd.forgetting_attention_triton", "autograd.check_inputs", "autograd.check_kernel_inputs",
               "autograd.row_bounds", "autograd.acp_tables_for", "triton.launch.acp_launch", "autograd.fwd_impl",
               "gluon.launch.fwd_sm90", "triton.launch.block_prefix", "autograd.bwd_impl", "autograd.bwd",
               "gluon.launch.use_fused_bwd", "gluon.launch.use_sm90", "gluon.launch.bwd_fused_sm90",
               "gluon.launch.bwd_fused_setup", "triton.launch.bwd_dlogf", "gluon.launch.tma_desc",
               "gluon.launch.tma_vec", "gluon.launch.query_vec")


@contextlib.contextmanager
def host_stages():
    """Within the context, every call of the op's host-side stages (``HOST_STAGES``, keyed by function name) and
    every kernel launch (``launch <kernel name>``: ``launch_cache.launch`` or ``launch_keyed``, i.e. the cache key
    and the driver call, or at a new specialisation triton's binding, specialisation and compilation) adds its
    inclusive wall seconds to the dict the context yields (clear it between timings). Nested stages overlap, so the
    entries do not add up to a call."""
    acc: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    def timed_launch(launch, keyed):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return launch(*a, **kw)
            finally:
                key = f"launch {a[int(keyed)].__name__}"  # (launch_keyed's first argument is the key)
                acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0
        return wrapper

    launches = [(name, getattr(_launch_cache, name)) for name in ("launch", "launch_keyed")]
    stages = [(importlib.import_module(f"{__package__}.{m}"), name) for m, _, name in
              (s.rpartition(".") for s in HOST_STAGES)]
    saved = [(module, name, getattr(module, name)) for module, name in stages]
    try:
        for name, fn in launches:
            setattr(_launch_cache, name, timed_launch(fn, name == "launch_keyed"))
        for module, name, fn in saved:
            setattr(module, name, timed(name, fn))
        yield acc
    finally:
        for name, fn in launches:
            setattr(_launch_cache, name, fn)
        for module, name, fn in saved:
            setattr(module, name, fn)
