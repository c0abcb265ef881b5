"""parallelize(): activation checkpointing and torch.compile change nothing numerically and keep checkpoint
parameter names, so runs can switch them on and off across a resume; it takes meta-device models only.
Initialisation itself (eager-build weights on any device and sharding) is tests/training/test_init.py."""

import copy

import pytest
import torch
from omegaconf import OmegaConf

from forgetting_transformer.config import DecoderConfig, StrategyConfig
from forgetting_transformer.models import build_model
from forgetting_transformer.training.checkpoint import TrainState, load_model_weights, save_checkpoint
from forgetting_transformer.training.optim import build_optimizer
from forgetting_transformer.training.parallel import parallelize


class NoData:
    def state_dict(self):
        return {}

    def load_state_dict(self, sd):
        pass


CFG = OmegaConf.structured(DecoderConfig(name="t", vocab_size=61, n_layers=3, d_model=32, head_dim=16,
                                         qk_norm=True, kv_shift=True, output_gate=True))


def setup(**strategy):
    """(an eager build, the same model built on meta and parallelized): the same weights."""
    torch.manual_seed(0)
    reference = build_model(CFG)
    with torch.device("meta"):
        model = build_model(CFG)
    wrapped = parallelize(model, OmegaConf.structured(StrategyConfig(**strategy)), torch.device("cpu"), False, seed=0)
    return reference, wrapped


@pytest.mark.parametrize("strategy", [dict(activation_checkpointing="full"),
                                      dict(activation_checkpointing="selective", ac_every=2),
                                      dict(compile=True)])
def test_same_loss_and_gradients(strategy):
    reference, wrapped = setup(**strategy)
    x = torch.randint(0, 61, (2, 24))
    loss_ref, loss = reference(x, x).mean(), wrapped(x, x).mean()
    torch.testing.assert_close(loss, loss_ref)
    loss_ref.backward()
    loss.backward()
    grads = dict(reference.named_parameters())
    for name, p in wrapped.named_parameters():
        clean = name.replace("._checkpoint_wrapped_module", "").replace("._orig_mod", "")
        torch.testing.assert_close(p.grad, grads[clean].grad, msg=lambda m: f"{name}: {m}")


def test_activation_checkpointing_wraps_the_chosen_blocks():
    _, full = setup(activation_checkpointing="full")
    _, sel = setup(activation_checkpointing="selective", ac_every=2)
    wrapped = lambda m: [type(b).__name__ == "CheckpointWrapper" for b in m.blocks]  # noqa: E731
    assert wrapped(full) == [True, True, True] and wrapped(sel) == [True, False, True]


def test_checkpoints_keep_plain_parameter_names(tmp_path):
    reference, wrapped = setup(activation_checkpointing="full")
    path = save_checkpoint(TrainState(wrapped, build_optimizer(wrapped, OmegaConf.create(
        dict(weight_decay=0.1, betas=[0.9, 0.95], eps=1e-8))), NoData()), tmp_path, keep=1)
    plain = copy.deepcopy(reference)
    for p in plain.parameters():
        p.data.zero_()
    load_model_weights(plain, path)
    for (n, a), (_, b) in zip(plain.named_parameters(), reference.named_parameters()):
        assert torch.equal(a, b), n


def test_a_materialised_model_is_refused():
    with pytest.raises(ValueError, match=r"torch.device\('meta'\), but embed.weight is on cpu"):
        parallelize(build_model(CFG), OmegaConf.structured(StrategyConfig()), torch.device("cpu"), False, seed=0)


def test_compiled_chunk_loss_under_checkpointing():
    """With compile on, the LM head + cross-entropy of each loss chunk runs compiled (and is recomputed under
    activation checkpointing in the backward pass): same loss and gradients as the eager model."""
    reference, wrapped = setup(compile=True)
    assert wrapped.chunk_loss is not reference.chunk_loss and hasattr(wrapped.chunk_loss, "_torchdynamo_orig_callable")
    assert reference.cfg is wrapped.cfg is CFG  # one config object: restore it below
    old, CFG.loss_chunk = CFG.loss_chunk, 8  # 24 tokens: three chunks
    try:
        x = torch.randint(0, 61, (2, 24))
        loss_ref, loss = reference(x, x), wrapped(x, x)
        torch.testing.assert_close(loss, loss_ref)
        loss_ref.mean().backward()
        loss.mean().backward()
    finally:
        CFG.loss_chunk = old
    grads = dict(reference.named_parameters())
    for name, p in wrapped.named_parameters():
        torch.testing.assert_close(p.grad, grads[name.replace("._orig_mod", "")].grad, msg=lambda m: f"{name}: {m}")


def test_fsdp_prefetch_and_reshard_options_reach_fsdp2(tmp_path):
    """strategy.fsdp_prefetch / reshard_after_forward set FSDP2's per-block schedule (read back from its private
    state: the public API has setters only). The last block is never resharded after its forward. That they
    change no numbers is tests/training/test_distributed.py (2 ranks)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        schedules = []
        for extra in ({}, dict(fsdp_prefetch=2, reshard_after_forward=False)):
            _, model = setup(name="fsdp", **extra)
            states = [block._get_fsdp_state() for block in model.blocks]
            schedules.append([(len(s._states_to_forward_prefetch), len(s._states_to_backward_prefetch),
                               s._fsdp_param_group.post_forward_mesh_info is not None) for s in states])
    finally:
        dist.destroy_process_group()
    assert schedules[0] == [(0, 0, True), (0, 0, True), (0, 0, False)]  # FSDP2's implicit prefetching
    assert schedules[1] == [(2, 0, False), (1, 1, False), (0, 2, False)]
