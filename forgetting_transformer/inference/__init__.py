"""Fast generation: a paged static KV cache, a decode step that runs as one CUDA graph, and ACP eviction of the
keys the forget gates have decayed past ACP's threshold. See docs/generation.md."""

from .cache import PagedKVCache
from .eviction import evict, thresholds
from .generate import GenerationOutput, decode_step, generate, prefill
from .prompts import left_pad, seq_start_from_mask
from .scoring import cached_loss
from .sampling import Sampler

__all__ = ["PagedKVCache", "GenerationOutput", "Sampler", "cached_loss", "decode_step", "evict", "generate", "left_pad",
           "prefill", "seq_start_from_mask", "thresholds"]
