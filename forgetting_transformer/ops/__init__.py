"""Attention ops. Imports nothing from the rest of the package."""

from .forgetting_attention import forgetting_attention
from .options import AttentionOptions, TileConfig, default_options, set_default_options, use_options
from .reference import forgetting_attention_ref

__all__ = ["forgetting_attention", "forgetting_attention_ref", "AttentionOptions", "TileConfig", "default_options",
           "set_default_options", "use_options"]
