"""The one importer of flash-linear-attention (fla) for the models that run its kernels (the baselines, PaTH):
fla imported once, its version checked, its import-time warnings silenced, our Hugging Face auto classes restored
after fla registers its own FoX, and its autotuner kept to one config under the Triton interpreter."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import warnings

FLA_VERSION = "0.6.0"
INSTALL_HINT = f"pip install flash-linear-attention=={FLA_VERSION} fla-core=={FLA_VERSION}"


@contextlib.contextmanager
def quiet_fla():
    """fla warns at import (no flash-attn, no GPU) and per layer (no mamba_ssm / causal_conv1d fast paths) about
    code paths these models do not take; keep the logs readable."""
    logger = logging.getLogger("fla")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


@functools.cache
def import_fla():
    """The fla modules the baselines use; a missing fla raises an ImportError that says how to install it."""
    try:
        with quiet_fla():
            import fla
            from fla import layers, modules
            from fla.layers import mamba as mamba_module
            from fla.modules import layernorm_gated
            from fla.ops.attn.parallel import parallel_attn
            from fla.ops.gla import chunk_gla, fused_recurrent_gla
            from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
    except ImportError as e:
        raise ImportError(f"the fla baselines (model.arch fla_*) and PaTH need flash-linear-attention: {INSTALL_HINT}"
                          f" ({e})") from e
    if fla.__version__ != FLA_VERSION:
        warnings.warn(f"fla {fla.__version__} is installed; the baselines were written and tested against "
                      f"{FLA_VERSION} ({INSTALL_HINT})", stacklevel=3)
    _restore_fox_auto_classes()
    if interpreting():
        _autotune_first_config()
    norms = (modules.RMSNorm, layernorm_gated.RMSNormGated, modules.FusedRMSNormGated)
    return dict(layers=layers, norms=norms, parallel_attn=parallel_attn, chunk_simple_gla=chunk_simple_gla,
                fused_recurrent_simple_gla=fused_recurrent_simple_gla, chunk_gla=chunk_gla,
                fused_recurrent_gla=fused_recurrent_gla, mamba_fast_path=mamba_module.is_fast_path_available)


def _restore_fox_auto_classes() -> None:
    """Importing fla registers fla's own FoX under the model type ``forgetting_transformer`` with transformers'
    ``AutoConfig``, the type our ``forgetting_transformer.hf`` registers: had hf been imported first,
    ``from_pretrained`` of our exports would now build fla's model. Put ours back (if hf is imported later, its
    registration wins anyway). Looked up in ``sys.modules``, not imported: the models never import the HF layer."""
    hf = sys.modules.get("forgetting_transformer.hf")
    if hf is not None:
        from transformers import AutoConfig, AutoModelForCausalLM

        AutoConfig.register(hf.MODEL_TYPE, hf.FoXConfig, exist_ok=True)
        AutoModelForCausalLM.register(hf.FoXConfig, hf.FoXForCausalLM, exist_ok=True)


def _autotune_first_config() -> None:
    """Under the Triton interpreter there is no GPU to time kernels on, so triton's autotuner fails ("0 active
    drivers") on fla's autotuned kernels. Every config computes the same result there: report equal timings so
    the autotuner keeps the first config. Only ever applied when TRITON_INTERPRET=1."""
    from triton.runtime import autotuner

    autotuner.Autotuner._bench = lambda self, *args, config, **kwargs: [0.0, 0.0, 0.0]


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"
