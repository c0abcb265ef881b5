"""The Triton kernels' tile tables against the shared-memory bound (``tiles.shared_memory``; that the bound holds
against triton's compiler is ``test_compile.py``'s): every head dim has a config that fits sm80 and sm90, the
autotuner's prune and the fixed configs never hand on one that does not fit."""

import pytest
import torch

from forgetting_transformer.ops.forgetting_attention import AttentionOptions, TileConfig, tiles

LIMITS = {90: 232448, 80: 166912}  # shared memory per block (opt-in maximum) of H100 / H200 and A100
KINDS = ("fwd", "dq", "dkdv")


@pytest.mark.parametrize("arch", sorted(LIMITS))
def test_every_head_dim_has_a_config_that_fits(arch):
    """For 16-bit inputs at every head dim 1..256, each kernel's fixed config and at least one autotune config
    fit, and the fixed config is one of the autotuner's candidates (so autotuning is never worse than the fixed
    config)."""
    for D in range(1, 257):
        block_d = tiles.padded_head_dim(D)
        for kind in KINDS:
            fit = tiles.fitting(kind, tiles.AUTOTUNE_CONFIGS[kind], block_d, 2, arch, LIMITS[arch])
            fixed = tiles._fixed(kind, block_d, 2, arch, LIMITS[arch], None)
            assert fit and fixed in fit, (kind, D)


def test_the_head_dims_own_configs_fit_on_hopper():
    """On sm90 with 16-bit inputs the fixed config is the head dim's entry of ``HEAD_DIM_CONFIGS`` (no
    fallback), at every padded head dim."""
    for block_d in (16, 32, 64, 128, 256):
        for kind in KINDS:
            own = next(c for d, c in tiles.HEAD_DIM_CONFIGS[kind] if block_d <= d)
            assert tiles._fixed(kind, block_d, 2, 90, LIMITS[90], None) == own, (kind, block_d)


def test_fixed_config_falls_back_and_a_named_config_that_does_not_fit_is_refused():
    own = tiles.HEAD_DIM_CONFIGS["fwd"][1][1]  # head dims 65..128
    need = tiles.shared_memory("fwd", own, 128, 2, 90)
    fallback = tiles._fixed("fwd", 128, 2, 90, need - 1, None)
    assert fallback != own and tiles.shared_memory("fwd", fallback, 128, 2, 90) <= need - 1
    assert fallback == tiles.fitting("fwd", tiles.AUTOTUNE_CONFIGS["fwd"], 128, 2, 90, need - 1)[0]
    big = TileConfig(128, 128, 8, 3)
    with pytest.raises(ValueError, match=r"triton_configs\['fwd'\].*needs \d+ bytes"):
        tiles._fixed("fwd", 256, 2, 90, LIMITS[90], big)
    with pytest.raises(ValueError, match="no dq tile config fits"):
        tiles._fixed("dq", 256, 4, 86, 101376, None)
    opts = AttentionOptions(triton_configs={"dq": (32, 32, 4, 2)})
    assert tiles.fixed_config("dq", 64, 2, None, opts) == TileConfig(32, 32, 4, 2)  # (no device: not checked)


class _Config:
    """The fields of a ``triton.Config`` the prune reads."""

    def __init__(self, cfg):
        self.kwargs = cfg.meta()
        self.num_warps, self.num_stages = cfg.num_warps, cfg.num_stages


@pytest.mark.parametrize("arch", sorted(LIMITS))
def test_the_autotuners_prune_keeps_only_configs_that_fit(arch):
    """At head dim 256 (where most configs do not fit) the prune keeps exactly the configs whose bound fits, down
    to one (which the autotuner then launches without timing), and with none that fits it raises instead of
    handing on a config."""
    q = torch.empty(1, 1, 1, 256, dtype=torch.bfloat16)
    for kind in KINDS:
        configs = [_Config(c) for c in tiles.AUTOTUNE_CONFIGS[kind]]
        kept = tiles.prune(kind, limits=lambda index: (arch, LIMITS[arch]))(configs, {"Q": q}, BLOCK_D=256)
        want = [c for c in tiles.AUTOTUNE_CONFIGS[kind] if tiles.shared_memory(kind, c, 256, 2, arch) <= LIMITS[arch]]
        assert [tiles._tile(c) for c in kept] == want and want, kind
        assert len(want) < len(configs), kind  # (some are pruned at 256)
        one = tiles.shared_memory(kind, want[0], 256, 2, arch)
        kept = tiles.prune(kind, limits=lambda index: (arch, one))(configs, {"Q": q}, BLOCK_D=256)
        assert all(tiles.shared_memory(kind, tiles._tile(c), 256, 2, arch) <= one for c in kept) and kept, kind
        with pytest.raises(ValueError, match=f"no {kind} tile config fits"):
            tiles.prune(kind, limits=lambda index: (arch, 1024))(configs, {"Q": q}, BLOCK_D=256)


def test_the_bound_grows_with_the_tiles():
    """More stages, larger tiles, larger head dims and wider elements never need less shared memory."""
    for kind in KINDS:
        for c in tiles.AUTOTUNE_CONFIGS[kind]:
            for arch in LIMITS:
                base = tiles.shared_memory(kind, c, 128, 2, arch)
                assert tiles.shared_memory(kind, c, 256, 2, arch) > base
                assert tiles.shared_memory(kind, c, 128, 4, arch) > base
                assert tiles.shared_memory(kind, TileConfig(c.block_m, c.block_n, c.num_warps, c.num_stages + 1),
                                           128, 2, arch) > base
