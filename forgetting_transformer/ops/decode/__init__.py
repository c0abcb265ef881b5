"""Decoding over a paged KV cache, used by ``forgetting_transformer.inference``: Forgetting Attention for a few new
query tokens per sequence (``attention.py``) and the writer that puts new tokens' keys, values and cumulative gates
into the cache's blocks (``write.py``). Each has a Triton kernel, a PyTorch reference and one public function."""

from .attention import forgetting_attention_decode, forgetting_attention_decode_ref
from .write import paged_write, paged_write_ref

__all__ = ["forgetting_attention_decode", "forgetting_attention_decode_ref", "paged_write", "paged_write_ref"]
