"""Meta-device initialisation (training/parallel.py): a model built on the meta device, then allocated and
initialised, has bit for bit the parameters, buffers and generator state of an eager CPU build
(``torch.manual_seed(seed); build_model(cfg)``, the path runs took before), also FSDP-sharded over 2 gloo ranks;
a tensor that ``reset_parameters()`` leaves alone is reported; a 760M model builds on meta without memory.

Run as a script under torchrun, this file is the FSDP worker of
``test_fsdp_two_ranks_gather_the_single_process_weights``.
"""

import os
import subprocess
import sys
from itertools import chain
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from forgetting_transformer.config import DecoderConfig, StrategyConfig, register_configs
from forgetting_transformer.models import DecoderLM, build_model
from forgetting_transformer.training.parallel import init_weights, parallelize

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
PRO = dict(qk_norm=True, kv_shift=True, output_gate=True, output_norm=True)
VARIANTS = {  # every switch that adds a parameter or a buffer
    "fox_pro": PRO,
    "fox_llama": {},
    "transformer_llama": dict(fgate="none", rope=True),
    "data_independent_gate": dict(PRO, fgate="data_independent", fgate_init=[2, 64]),
    "fixed_gate_buffer": dict(PRO, fgate="fixed", fgate_init=[2, 256]),
}


def tiny(**switches):
    return OmegaConf.structured(DecoderConfig(name="t", vocab_size=61, n_layers=2, d_model=48, head_dim=16,
                                              **switches))


def eager(cfg, seed):
    """The pre-meta path: (model built on the CPU, generator state after the build)."""
    torch.manual_seed(seed)
    model = build_model(cfg)
    return model, torch.get_rng_state()


def on_meta(cfg):
    with torch.device("meta"):
        return build_model(cfg)


def tensors(model):
    return dict(chain(model.named_parameters(), model.named_buffers()))


@pytest.mark.parametrize("switches", VARIANTS.values(), ids=VARIANTS.keys())
def test_meta_build_then_init_gives_the_eager_weights_bitwise(switches):
    reference, rng = eager(tiny(**switches), seed=3)
    model = on_meta(tiny(**switches))
    init_weights(model, CPU, seed=3)
    expected, got = tensors(reference), tensors(model)
    assert got.keys() == expected.keys()
    for name, t in got.items():
        assert t.device == CPU and torch.equal(t, expected[name]), name
    assert torch.equal(torch.get_rng_state(), rng)  # what later draws see (e.g. a resumed run's RNG) is unchanged


def test_another_seed_gives_other_weights():
    reference, _ = eager(tiny(**PRO), seed=3)
    model = on_meta(tiny(**PRO))
    init_weights(model, CPU, seed=4)
    assert not torch.equal(model.lm_head.weight, reference.lm_head.weight)


class WithCache(DecoderLM):
    """A model whose non-persistent buffer is not recomputed by reset_parameters()."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.register_buffer("cache", torch.ones(4), persistent=False)


def test_a_tensor_reset_parameters_misses_is_named():
    with torch.device("meta"):
        model = WithCache(tiny())
    with pytest.raises(RuntimeError, match=r"WithCache.reset_parameters\(\) does not initialise cache"):
        init_weights(model, CPU, seed=0)


def test_a_model_without_reset_parameters_is_refused():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(TypeError, match=r"Sequential has no reset_parameters\(\)"):
        init_weights(model, CPU, seed=0)


def compose_cfg(*overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_760m_builds_on_meta_without_memory():
    cfg = compose_cfg("model/size=760m", "data=longcrawl64", "data.data_dir=unused")
    model = on_meta(cfg.model)
    assert (cfg.model.n_layers, cfg.model.d_model) == (24, 1536)
    assert sum(p.numel() for p in model.parameters()) > 8e8  # docs/params.md: 836.6M
    assert all(t.is_meta for t in tensors(model).values())


TINY = ("data.vocab_size=61", "data.bos_id=0", "model.head_dim=16")
FSDP_MODELS = {  # the decoder with its buffer; Mamba-2, whose fla layers draw at construction and in reset_parameters
    "fox_pro_fixed": ("model=fox_pro_fixed", "model.n_layers=2", "model.d_model=48", *TINY),
    "mamba2": ("model=mamba2", "model.n_layers=1", "model.d_model=64", "model.state_size=16", *TINY),
}


def fsdp_worker(out: Path, model_name: str) -> None:
    """Under torchrun (2 gloo ranks): build on meta, parallelize with FSDP2 and full activation checkpointing,
    then rank 0 saves the gathered weights, the per-rank shard sizes, a loss and the generator state."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo")
    strategy = OmegaConf.structured(StrategyConfig(name="fsdp", activation_checkpointing="full"))
    model = parallelize(on_meta(compose_cfg(*FSDP_MODELS[model_name]).model), strategy, CPU, False, seed=3)
    full, local = {}, torch.zeros(2, dtype=torch.long)
    for name, t in tensors(model).items():
        full[name.replace("._checkpoint_wrapped_module", "")] = t.full_tensor() if isinstance(t, DTensor) else t
        local[dist.get_rank()] += t.to_local().numel() if isinstance(t, DTensor) else 0
    dist.all_reduce(local)
    x = torch.arange(2 * 24).view(2, 24) % 61
    loss = model(x, x).mean().detach()
    if dist.get_rank() == 0:
        torch.save({"tensors": full, "local_numel": local, "loss": loss, "rng": torch.get_rng_state()}, out)
    dist.destroy_process_group()


@pytest.mark.parametrize("model_name", FSDP_MODELS)
def test_fsdp_two_ranks_gather_the_single_process_weights(model_name, tmp_path):
    if model_name == "mamba2":
        pytest.importorskip("fla", reason="the fla baselines need flash-linear-attention")
    out = tmp_path / "fsdp.pt"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          __file__, str(out), model_name], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    got = torch.load(out)
    # One process on the CPU: for the decoder, the eager build's weights (test above).
    reference = on_meta(compose_cfg(*FSDP_MODELS[model_name]).model)
    init_weights(reference, CPU, seed=3)
    rng = torch.get_rng_state()
    expected = tensors(reference)
    assert got["tensors"].keys() == expected.keys()
    for name, t in got["tensors"].items():
        assert torch.equal(t, expected[name]), name
    # Each rank held about half of the parameters (so the shards, not replicas, were initialised).
    n_params = sum(p.numel() for p in reference.parameters())
    assert got["local_numel"].sum() == n_params and got["local_numel"].max() < 0.6 * n_params
    x = torch.arange(2 * 24).view(2, 24) % 61
    torch.testing.assert_close(got["loss"], reference(x, x).mean().detach())  # the sharded model computes with them
    assert torch.equal(got["rng"], rng)


if __name__ == "__main__":
    fsdp_worker(Path(sys.argv[1]), sys.argv[2])
