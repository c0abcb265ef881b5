"""``AttentionOptions``: validation, the default and its scopes, the environment read once, the form the custom ops
take, and that a call's options reach the kernels it launches (under the CPU interpreter)."""

import os
import subprocess
import sys

import pytest
import torch

from accuracy import on
from forgetting_transformer.ops.forgetting_attention import (AttentionOptions, TileConfig, default_options,
                                                             forgetting_attention, set_default_options, use_options)
from forgetting_transformer.ops import options as O
from kernel_cases import make


def test_fields_are_validated_and_configs_normalised():
    o = AttentionOptions(triton_configs={"dq": (64, 32, 4, 2), "fwd": TileConfig(32, 16)}, acp_grid=[16, 32])
    assert o.triton_configs == (("dq", TileConfig(64, 32, 4, 2)), ("fwd", TileConfig(32, 16, 4, 2)))
    assert o.triton_config("dq") == TileConfig(64, 32, 4, 2) and o.triton_config("dkdv") is None
    assert o.acp_grid == (16, 32) and hash(o) == hash(o.replace())
    for bad, match in ((dict(backend="cuda"), "backend"), (dict(autotune=1), "autotune"),
                       (dict(triton_configs={"fused": (64, 64, 4, 2)}), "kind"),
                       (dict(triton_configs={"fwd": (48, 64, 4, 2)}), "block_m"),
                       (dict(triton_configs={"fwd": (64, 64, 3, 2)}), "num_warps"),
                       (dict(triton_configs={"fwd": (64, 64, 4, 0)}), "num_stages"),
                       (dict(acp_grid=(16, 0)), "acp_grid")):
        with pytest.raises(ValueError, match=match):
            AttentionOptions(**bad)


def test_token_round_trip():
    o = AttentionOptions(backend="triton", autotune=False, gluon=False, fused_backward=False, deterministic=True,
                         triton_configs={"dkdv": (32, 64, 4, 3)}, acp_grid=(32, 64))
    assert O.from_token(o.token) == o and O.from_token(AttentionOptions().token) == AttentionOptions()


def test_default_scopes_restore():
    base = default_options()
    with use_options(gluon=False) as inner:
        assert default_options() is inner and not inner.gluon and inner.autotune == base.autotune
        with use_options(AttentionOptions(deterministic=True)):
            assert default_options() == AttentionOptions(deterministic=True)
        assert default_options() is inner
    assert default_options() is base
    previous = set_default_options(autotune=False)
    try:
        assert previous is base and default_options() == base.replace(autotune=False)
    finally:
        set_default_options(previous)
    assert default_options() is base
    with pytest.raises(TypeError, match="AttentionOptions"):
        set_default_options({"autotune": False})


def test_environment_overrides_are_read_once_at_import():
    """FOX_AUTOTUNE / FOX_GLUON / FOX_FUSED_BWD set the default when the module is imported; changing the
    environment afterwards changes nothing."""
    code = ("import os; from forgetting_transformer.ops.forgetting_attention import default_options as d; "
            "a = d(); "
            "os.environ['FOX_GLUON'] = '1'; os.environ['FOX_AUTOTUNE'] = '0'; "
            "print(a.autotune, a.gluon, a.fused_backward, d() is a)")
    env = dict(os.environ, FOX_AUTOTUNE="1", FOX_GLUON="0", FOX_FUSED_BWD="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False", "False", "True"]


def test_the_backend_is_an_option():
    q, k, v, lf = make(1, 10, 10, 2, 2, 16)
    ref = forgetting_attention(q, k, v, lf, options=on("reference"))
    assert torch.equal(forgetting_attention(q, k, v, lf, options=AttentionOptions(backend="reference")), ref)
    with use_options(backend="reference"):
        assert torch.equal(forgetting_attention(q, k, v, lf), ref)
    with pytest.raises(ValueError, match="backend"):
        forgetting_attention(q, k, v, lf, options=AttentionOptions(backend="cuda-magic"))
    with pytest.raises(TypeError, match="backend"):  # the backend is an option, not an argument of its own
        forgetting_attention(q, k, v, lf, backend="reference")
    with pytest.raises(TypeError, match="AttentionOptions"):
        forgetting_attention(q, k, v, lf, options={"backend": "reference"})


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the kernels under the CPU interpreter")
def test_a_calls_options_pick_its_tiles_and_its_backward_keeps_them(monkeypatch):
    """``triton_configs`` of a call's options are the tiles its kernels launch with, in the forward and in the
    backward (which runs after the ``use_options`` block has ended)."""
    from forgetting_transformer.ops.forgetting_attention.triton import launch as TL

    seen = []
    raw = TL.raw_kernel

    def spy(kind):
        fn = raw(kind)

        class Grid:
            def __getitem__(self, grid):
                def launch(*args, **kw):
                    seen.append((kind, kw["BLOCK_M"], kw["BLOCK_N"]))
                    return fn[grid](*args, **kw)
                return launch
        return Grid()

    monkeypatch.setattr(TL, "raw_kernel", spy)
    q, k, v, lf = (t.requires_grad_() for t in make(1, 40, 40, 2, 2, 16))
    with use_options(triton_configs={"fwd": (16, 32, 4, 1), "dq": (32, 16, 4, 1), "dkdv": (32, 64, 4, 1)}):
        o = forgetting_attention(q, k, v, lf, options=on("triton"))
    o.sum().backward()
    assert seen == [("fwd", 16, 32), ("dq", 32, 16), ("dkdv", 32, 64)]
