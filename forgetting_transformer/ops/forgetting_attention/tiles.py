"""The kernels' tile configs, and which of them fit a GPU's shared memory.

Triton kernels (``triton/kernels.py``): ``AUTOTUNE_CONFIGS`` are what the autotuner times on a GPU,
``HEAD_DIM_CONFIGS`` the one config per kernel used with autotuning off, ``INTERPRET_CONFIGS`` the tiles under
triton's CPU interpreter. A config is launched only if ``shared_memory`` (an upper bound of what the compiled
kernel asks for, from its tiles) fits the device's per-block limit: the autotuner's candidates are pruned by it,
and a fixed config that does not fit is replaced by the first autotune config that does (or refused, if named in
the options). Gluon kernels (``gluon/kernels.py``, Hopper): ``GLUON_*_CONFIGS`` per head dim, fixed.
"""

from __future__ import annotations

import functools

from ..options import TileConfig, interpreting

MAX_HEAD_DIM = 256

# (BLOCK_M, BLOCK_N, num_warps, num_stages); the first of each list won on an H200 sweep at D=64 or D=128; the
# last is the fixed config of head dims above 128, so that every head dim keeps a candidate that fits sm80 and sm90
AUTOTUNE_CONFIGS = {kind: tuple(TileConfig(*c) for c in raw) for kind, raw in {
    "fwd": [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 4, 4),
            (64, 64, 4, 2)],
    "dq": [(64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 4), (128, 32, 4, 3), (64, 32, 4, 2)],
    # dkdv: BLOCK_M = query rows per step, BLOCK_N = keys per program
    "dkdv": [(64, 64, 4, 3), (64, 128, 8, 3), (32, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 4), (32, 64, 4, 2)],
}.items()}

# (largest padded head dim, config) per kernel, with autotuning off: one config from the head dim alone
HEAD_DIM_CONFIGS = {
    "fwd": ((64, TileConfig(128, 64, 4, 3)), (128, TileConfig(128, 128, 8, 3)), (256, TileConfig(64, 64, 4, 2))),
    "dq": ((64, TileConfig(64, 64, 4, 3)), (128, TileConfig(128, 64, 8, 3)), (256, TileConfig(64, 32, 4, 2))),
    "dkdv": ((64, TileConfig(64, 64, 4, 3)), (128, TileConfig(64, 128, 8, 3)), (256, TileConfig(32, 64, 4, 2))),
}

# Under the interpreter (which cannot autotune); BLOCK_M != BLOCK_N on purpose (misaligned query / key blocks)
INTERPRET_CONFIGS = {"fwd": TileConfig(32, 16, 4, 1), "dq": TileConfig(16, 32, 4, 1),
                     "dkdv": TileConfig(16, 32, 4, 1)}


def next_pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


def cdiv(a, b):
    return (a + b - 1) // b


def padded_head_dim(head_dim: int) -> int:
    """The Triton kernels' BLOCK_D: the head dim rounded up to a power of two >= 16."""
    return max(16, next_pow2(head_dim))


def shared_memory(kind: str, cfg: TileConfig, block_d: int, elem_bytes: int, arch: int) -> int:
    """An upper bound of the shared memory (bytes) that the Triton kernel ``kind`` compiled with ``cfg`` at padded
    head dim ``block_d``, for inputs of ``elem_bytes`` and compute capability ``arch`` (major * 10 + minor), asks
    for. Triton keeps in shared memory:

    * the tiles loaded once per program that feed a matmul (fwd: Q; dq: Q and dO; dk/dv: K and V);
    * ``bufs`` buffers of the tiles that the key (fwd, dq) or query (dk/dv) loop loads, pipelined: K and V, or Q
      and dO. With wgmma (sm90 and 16-bit inputs; every matmul's rows a multiple of 64: BLOCK_M, or BLOCK_N for
      the dk/dv kernel's transposed products) ``bufs = num_stages``; with mma.sync (sm80, or narrower tiles)
      ``num_stages - 1``, plus the 16-bit P or dS tile, which goes through shared memory to become an operand,
      and 3 KiB of layout-conversion scratch;
    * ``bufs`` copies of the loop's fp32 vectors (log f's prefix sums; for dk/dv also LSE, delta and the rows'
      mask bounds), rounded up to 1 KiB.

    ``python -m benchmarks.attention.compile_kernels --smem`` compares it with what triton's compiler reports for
    every config of the tables at every padded head dim, for sm80 and sm90 (``tests/ops/test_compile.py``): it is
    never below, exact for most wgmma configs (the sm90 configs near the limit), and above by up to 75% on
    sm80 (where the compiler keeps some of these tiles in registers) and for fp32 inputs."""
    m, n, d = cfg.block_m, cfg.block_n, block_d
    rows = n if kind == "dkdv" else m
    wgmma = arch >= 90 and elem_bytes == 2 and rows % 64 == 0 and cfg.num_warps % 4 == 0
    bufs = cfg.num_stages if wgmma else max(cfg.num_stages - 1, 1)
    once, per_buf = {"fwd": (m, 2 * n), "dq": (2 * m, 2 * n), "dkdv": (2 * n, 2 * m)}[kind]
    vectors = 4 * (5 * m if kind == "dkdv" else n)  # fp32 entries per loop iteration
    total = elem_bytes * d * (once + bufs * per_buf) + -(-bufs * vectors // 1024) * 1024
    if not wgmma:
        total += elem_bytes * m * n + 3072
    return total


@functools.lru_cache(maxsize=None)
def device_limits(device_index: int) -> tuple[int, int]:
    """(compute capability major * 10 + minor, shared memory per block in bytes, opt-in maximum) of a CUDA
    device: the limit triton checks a kernel's shared memory against at launch."""
    import torch
    import triton

    major, minor = torch.cuda.get_device_capability(device_index)
    return major * 10 + minor, triton.runtime.driver.active.utils.get_device_properties(device_index)["max_shared_mem"]


def fits(kind, cfg, block_d, elem_bytes, arch, limit) -> bool:
    return shared_memory(kind, cfg, block_d, elem_bytes, arch) <= limit


def fitting(kind, configs, block_d, elem_bytes, arch, limit) -> list[TileConfig]:
    """The configs of ``configs`` that fit; none is an error naming the smallest's need and the limit."""
    out = [c for c in configs if fits(kind, c, block_d, elem_bytes, arch, limit)]
    if not out:
        need = min(shared_memory(kind, c, block_d, elem_bytes, arch) for c in configs)
        raise ValueError(f"no {kind} tile config fits at head dim {block_d} with {elem_bytes}-byte inputs: the "
                         f"smallest needs {need} bytes of shared memory, sm{arch} allows {limit}")
    return out


@functools.lru_cache(maxsize=None)
def _fixed(kind, block_d, elem_bytes, arch, limit, named):
    if named is not None:
        need = shared_memory(kind, named, block_d, elem_bytes, arch)
        if need > limit:
            raise ValueError(f"triton_configs[{kind!r}] = {named} needs {need} bytes of shared memory at head dim "
                             f"{block_d} with {elem_bytes}-byte inputs; sm{arch} allows {limit}")
        return named
    cfg = next(c for d, c in HEAD_DIM_CONFIGS[kind] if block_d <= d)
    if fits(kind, cfg, block_d, elem_bytes, arch, limit):
        return cfg
    return fitting(kind, AUTOTUNE_CONFIGS[kind], block_d, elem_bytes, arch, limit)[0]


def fixed_config(kind: str, block_d: int, elem_bytes: int, device_index, options) -> TileConfig:
    """The config the Triton kernel ``kind`` launches with when it is not autotuned: the options' config for it,
    else (under the interpreter) ``INTERPRET_CONFIGS``, else the head dim's ``HEAD_DIM_CONFIGS`` entry, or the
    first autotune config that fits where that one does not. ``device_index``: the CUDA device's (None: the
    interpreter)."""
    named = options.triton_config(kind)
    if interpreting() or device_index is None:
        return named or INTERPRET_CONFIGS[kind]
    return _fixed(kind, block_d, elem_bytes, *device_limits(device_index), named)


def prune(kind: str, limits=device_limits):
    """The autotuner's ``early_config_prune`` for ``kind``: the configs that fit the device of the call's Q
    (``limits``: device index -> (arch, shared memory limit)). None fitting is an error, raised before any
    launch."""
    def prune_configs(configs, named_args, **kwargs):
        q = named_args["Q"]
        block_d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D"))
        arch, limit = limits(q.device.index)
        keep = {c for c in fitting(kind, [_tile(c) for c in configs], block_d, q.element_size(), arch, limit)}
        return [c for c in configs if _tile(c) in keep]

    return prune_configs


def _tile(c) -> TileConfig:
    """The TileConfig of a ``triton.Config``."""
    return TileConfig(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)


# ------------------------------------------------------------------------------------------------------------
# Gluon kernels (Hopper), fixed per head dim; per-config timings: python -m benchmarks.attention.sweep <kind>
# ------------------------------------------------------------------------------------------------------------

# Forward: (rows per consumer warpgroup, BLOCK_N, NUM_STAGES, consumer warpgroups); three warpgroups at 64 (192
# query rows share each K/V stage)
GLUON_FWD_CONFIGS = {64: (64, 128, 3, 3), 128: (64, 128, 2, 2)}

# dq: (rows per consumer warpgroup, BLOCK_N, NUM_STAGES, consumer warpgroups), the fastest at S1..S4 on an H200
# (three warpgroups at head dim 64; two at 128, which spill with three)
GLUON_DQ_CONFIGS = {64: (64, 64, 4, 3), 128: (64, 64, 2, 2)}

# dk/dv: (BLOCK_M query rows per tile, keys per consumer warpgroup, NUM_STAGES, consumer warpgroups), the fastest
# at S1..S4 on an H200. 64-row tiles at head dim 64 too: the query tile's vectors are read under the score matmul,
# and 128-row tiles spill with that.
GLUON_DKDV_CONFIGS = {64: (64, 64, 2, 2), 128: (64, 64, 2, 2)}

# One-kernel backward: (BLOCK_M, keys per consumer warpgroup, NUM_STAGES, staging slots per consumer warpgroup),
# two consumer warpgroups; two stages were faster than three at S1, S2 and the 760M model's shape (sweep fused).
# Not at 128: with the dS and staging buffers two stages need 258 KB of shared memory (sm90 allows 227), and one
# stage spills (python -m benchmarks.attention.compile_kernels, compile_gluon_fused)
GLUON_FUSED_CONFIGS = {64: (64, 64, 2, 1)}


def gluon_maxnreg(num_warps: int) -> int:
    """Registers per thread at launch so that the compute warps plus the loader's warpgroup fill the 64K register
    file (8 + 4 warps: 168; 12 + 4: 128); ``setmaxnreg`` then moves the loader's share to the compute warps (240
    each for two consumer warpgroups, 160 for three)."""
    return min(255, 65536 // ((num_warps + 4) * 32) // 8 * 8)
