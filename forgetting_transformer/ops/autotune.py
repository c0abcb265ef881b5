"""Launching the Triton attention kernels with a tile config: autotuned on a GPU, fixed otherwise.

Autotuned launches time the configs of ``tiles.AUTOTUNE_CONFIGS`` that fit the device's shared memory (the
others are pruned before any launch) once per shape class, then launch the pick directly, which saves the
autotuner's per-call Python (~45 us of host time per launch on the H200 machines).
"""

from __future__ import annotations

from . import launch_cache, tiles
from .options import interpreting

_KERNELS = {}  # kind -> the autotuned jit function
_TUNED = {}  # (kind, tune key, meta) -> the autotuner's pick (a triton.Config)


def raw_kernel(kind):
    """The ``@triton.jit`` function of ``kind`` ("fwd", "dq" or "dkdv")."""
    from . import triton_kernels as tk

    return {"fwd": tk._attn_fwd_kernel, "dq": tk._attn_bwd_dq_kernel, "dkdv": tk._attn_bwd_dkdv_kernel}[kind]


def tuned_kernel(kind):
    """``kind``'s kernel under ``triton.autotune`` over the configs that fit (``tiles.prune``)."""
    if kind not in _KERNELS:
        import triton

        configs = [triton.Config(c.meta(), num_warps=c.num_warps, num_stages=c.num_stages)
                   for c in tiles.AUTOTUNE_CONFIGS[kind]]
        _KERNELS[kind] = triton.autotune(
            configs=configs,
            key=["HEAD_DIM", "T_BUCKET", "GROUP", "HAS_START", "IEEE", "HAS_HI" if kind == "dkdv" else "HAS_LO"],
            prune_configs_by={"early_config_prune": tiles.prune(kind)},
        )(raw_kernel(kind))
    return _KERNELS[kind]


def autotuned(kind, options) -> bool:
    """Whether ``kind`` is autotuned under ``options`` (never under the interpreter, nor with a named config)."""
    return options.autotune and not interpreting() and options.triton_config(kind) is None


def launch(kind, options, grid_fn, tune_key, *args, **meta):
    """Launch ``kind`` on ``args`` (Q first). Autotuned: the autotuner runs once per (``tune_key`` = (device, T
    bucket, GROUP, dtype), ``meta``), at least as fine as its own key; later calls launch its pick. Else the
    config of ``tiles.fixed_config``."""
    q = args[0]
    if not autotuned(kind, options):
        cfg = tiles.fixed_config(kind, meta["BLOCK_D"], q.element_size(), q.device.index if q.is_cuda else None,
                                 options)
        launch_cache.launch(raw_kernel(kind), grid_fn(cfg.meta()), *args, **meta, **cfg.meta(),
                            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return
    key = (kind, tune_key, tuple(sorted(meta.items())))
    best = _TUNED.get(key)
    if best is None:
        tuned = tuned_kernel(kind)
        tuned[grid_fn](*args, **meta)
        _TUNED[key] = tuned.best_config
    else:
        launch_cache.launch(raw_kernel(kind), grid_fn(best.kwargs), *args, **meta, **best.all_kwargs())
