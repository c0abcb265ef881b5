"""``generate()``: batched decoding of a ``DecoderLM`` over the paged static cache (``cache.py``).

The prompt runs once (prefill: the model's own attention over the whole prompt, or ``prefill_chunk`` tokens at a
time through the cache); then every step feeds one token per sequence. A step (``Decoder.step``: the blocks with
the decode kernel, the token choice, the stop flags) reads and writes only preallocated device tensors, so on a
GPU it is captured once as a CUDA graph and replayed. Between steps, once per ``block_size`` tokens, the host
hands out cache blocks and, with ACP eviction, drops the keys the forget gates have decayed past the threshold
(``eviction.py``) and compacts the pools.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass, field

import torch

from ..ops.forgetting_attention.acp import DEFAULT_EPS
from .cache import PagedKVCache, cdiv
from .eviction import evict, sequence_thresholds
from .prompts import batch_prompts
from .sampling import Sampler

WARMUP_STEPS = 2  # eager steps before a CUDA graph is captured (kernels compiled, workspaces allocated)
STOP_CHECK_EVERY = 16  # steps between looks at the stop flags (each look waits for the device)


@dataclass
class GenerationOutput:
    """``sequences`` (B, P + N): the prompts as passed (left-padded) and the new tokens, ``pad_token_id`` after a
    sequence's eos; N stops at the step where every sequence has ended. ``logits`` (B, N, V) float32 (with
    ``output_logits``): what each new token was chosen from. ``stats``: the cache's at the end
    (``PagedKVCache.stats``) plus ``acp_eviction``. ``timings``: ``prefill_s``, and ``decode_s`` over
    ``decode_steps`` steps from the first replay of a captured graph (or the second eager step) on: the steady
    state, without compilation and capture."""

    sequences: torch.Tensor
    logits: torch.Tensor | None
    stats: dict
    timings: dict = field(default_factory=dict)


class Clock:
    """Marks on the device's timeline (CUDA events: no wait while marking) or the host's; read at the end."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks = {}

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[name] = event
        else:
            self.marks[name] = time.perf_counter()

    def seconds(self, start: str, end: str) -> float:
        if start not in self.marks or end not in self.marks:
            return float("nan")
        if self.cuda:
            self.marks[end].synchronize()
            return self.marks[start].elapsed_time(self.marks[end]) / 1e3
        return self.marks[end] - self.marks[start]


def _graphs_compiled() -> int:
    """Graphs torch.compile has compiled in this process."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def decoder_of(model):
    """The ``DecoderLM`` of a ``DecoderLM`` or a ``FoXForCausalLM``."""
    inner = getattr(model, "model", model)
    if getattr(getattr(inner, "cfg", None), "arch", None) != "decoder" or not hasattr(inner, "blocks"):
        raise TypeError(f"model must be a DecoderLM (model.arch=decoder) or a FoXForCausalLM; got "
                        f"{type(model).__name__}")
    if getattr(inner.cfg, "mixer", "softmax") != "softmax":
        raise NotImplementedError(f"model.mixer={inner.cfg.mixer} ({inner.cfg.name}): the paged static cache holds "
                                  "softmax attention's keys only; decode with FoXForCausalLM.generate() and its "
                                  "default cache (no cache_implementation='static', no acp_eviction)")
    return inner


def prefill(model, cache: PagedKVCache, input_ids, seq_start, chunk: int | None = None, deltas=None):
    """Run the prompt (B, P) into an empty cache; returns the logits (B, V) of its last position. ``chunk``: that
    many tokens per forward through the cache (bounds the memory of long prompts, with eviction after each);
    ``deltas``: eviction thresholds (L, H) or (L, B, H), or None."""
    model.check_token_ids(input_ids)
    cache.begin(seq_start)
    padded = seq_start if bool((seq_start > 0).any()) else None
    P = input_ids.shape[1]
    for s in range(0, P, chunk or P):
        part = input_ids[:, s:s + (chunk or P)]
        cache.reserve(part.shape[1])
        # an empty cache: the layers' own attention over the prompt; else the decode kernel over the cache
        h = model.hidden_states(part, cache=cache.layers(decode=s > 0), seq_start=padded)
        cache.advance(part.shape[1])
        if deltas is not None:
            evict(cache, deltas)  # (releases the blocks of evicted keys and of the left padding)
    if padded is not None:
        cache.release()  # the blocks of the left padding
    return model.lm_head(h[:, -1])


def decode_step(model, cache: PagedKVCache, tokens: torch.Tensor) -> torch.Tensor:
    """``tokens`` (B, T) after the cached positions → logits (B, V) of the last one; the cache takes them. Device
    tensors only (no host sync, no shape that depends on values): capturable in a CUDA graph."""
    T = tokens.shape[1]
    x = model.embed(tokens)  # (B, T, d_model)
    positions = (cache.lengths[:, None] + torch.arange(T, device=tokens.device) - cache.seq_start[:, None]).clamp(
        min=0)  # (B, T) RoPE positions from each sequence's first real token
    for block, layer in zip(model.blocks, cache.layers(decode=True)):
        x = block(x, cache=layer, positions=positions)
    cache.lengths += T
    return model.lm_head(model.norm(x[:, -1:]))[:, 0]


def mark_sizes_dynamic(cache: PagedKVCache, tokens: torch.Tensor) -> None:
    """Mark the sizes that differ between calls of ``generate()`` (the batch, the table length that the longest
    sequence sets, the pools' blocks, which eviction's compaction also changes) as dynamic for ``torch.compile``,
    so that the compiled step serves them all: else every new size is one more compilation of the whole step
    (tens of seconds to minutes for a large model), and past dynamo's cache limit the step runs uncompiled.
    A batch of one is still compiled on its own (dynamo specialises sizes 0 and 1)."""
    mark = torch._dynamo.maybe_mark_dynamic
    for t in (cache.k_pool, cache.v_pool, cache.c_pool, cache.lengths, cache.seq_start, tokens):
        if t is not None:
            mark(t, 0)
    mark(cache.tables, 1)
    mark(cache.tables, 3)
    for t in (cache.key_start, cache.c_last, cache.n_freed):
        mark(t, 1)
    if cache.shift is not None:
        mark(cache.shift, 2)


class Decoder:
    """The decoding loop's state: preallocated output tokens (and logits), stop flags and the next input."""

    def __init__(self, model, cache, sampler, eos, pad_token_id, max_new_tokens, output_logits, deltas,
                 compile_step: bool = False):
        B, dev = cache.batch_size, cache.device
        self.model, self.cache, self.sampler, self.deltas = model, cache, sampler, deltas
        self.eos = eos  # (n_eos,) int64 on the device, or None
        self.pad = pad_token_id
        self.tokens = torch.full((B, max_new_tokens), pad_token_id, dtype=torch.int64, device=dev)
        self.logits = (torch.zeros(B, max_new_tokens, model.cfg.vocab_size, device=dev) if output_logits
                       else None)
        self.last = torch.zeros(B, 1, dtype=torch.int64, device=dev)
        self.done = torch.zeros(B, dtype=torch.bool, device=dev)
        self.count = torch.zeros((), dtype=torch.int64, device=dev)  # tokens chosen so far
        self.emitted = 0  # the same, on the host
        self.clock = Clock(dev)
        self.timed_steps = 0
        # Fused by Inductor, a step launches a fraction of the eager step's kernels (norms, gates, shifts and
        # casts become one kernel each); the CUDA graph then replays the compiled kernels.
        self.decode = torch.compile(decode_step, dynamic=None) if compile_step else decode_step
        self.graphs_before = _graphs_compiled()

    def generate(self, input_ids, seq_start, prefill_chunk: int | None, cuda_graph: bool) -> GenerationOutput:
        """Prefill the prompts (B, P) (left padding before ``seq_start`` (B,)) into the empty cache, then decode
        until every sequence has ended or the output is full."""
        self.clock.mark("prefill")
        logits = prefill(self.model, self.cache, input_ids, seq_start, prefill_chunk, self.deltas)
        self.clock.mark("prefilled")
        if self.deltas is not None:
            self.cache.compact(headroom=2 * self.cache.n_layers * self.cache.batch_size * self.cache.n_kv_heads)
        self.emit(logits)
        self.emitted = 1
        self.run(self.tokens.shape[1] - 1, cuda_graph)
        out = self.result(input_ids)
        if self.decode is not decode_step and _graphs_compiled() != self.graphs_before:
            # Compiling the step leaves torch.compile's trace objects in reference cycles that hold the cache's
            # pools (tens of GB), and nothing but the cyclic collector frees them.
            gc.collect()
        return out

    def emit(self, logits: torch.Tensor) -> None:
        """Choose the next tokens from logits (B, V) and record them. Device tensors only."""
        nxt = torch.where(self.done, self.pad, self.sampler(logits))  # (B,)
        self.tokens.scatter_(1, self.count.expand(self.tokens.shape[0], 1), nxt[:, None])
        if self.logits is not None:
            self.logits.index_copy_(1, self.count.view(1), logits.float()[:, None])
        if self.eos is not None:
            self.done |= (nxt[:, None] == self.eos).any(-1)
        self.last.copy_(nxt[:, None])
        self.count += 1

    def step(self) -> None:
        if self.decode is not decode_step:
            mark_sizes_dynamic(self.cache, self.last)
        self.emit(self.decode(self.model, self.cache, self.last))

    def maintain(self) -> None:
        """Before a step that enters a new block: with eviction, drop what the gates decayed past the
        threshold (and compact the pools if that freed half of them); then blocks for the next block_size
        tokens."""
        cache = self.cache
        if self.deltas is not None:
            evict(cache, self.deltas)
            cache.compact(headroom=2 * cache.n_layers * cache.batch_size * cache.n_kv_heads)
        cache.reserve(min(cache.block_size, cache.max_len - cache.length))

    def run(self, steps: int, cuda_graph: bool) -> None:
        """Up to ``steps`` steps, fewer if every sequence has ended (looked at every ``STOP_CHECK_EVERY``)."""
        graph, version = None, None
        timed_from = WARMUP_STEPS + 1 if cuda_graph else 1
        for s in range(steps):
            if s == timed_from:
                self.clock.mark("steady")
            if self.cache.length + 1 > self.cache.n_alloc * self.cache.block_size:
                self.maintain()
            if cuda_graph and s >= WARMUP_STEPS:
                if graph is None or version != self.cache.version:  # the pools were reallocated
                    graph = None  # (its memory goes back before the new capture takes some)
                    graph, version = self._capture(), self.cache.version
                graph.replay()
            elif cuda_graph:
                self._side_stream_step()
            else:
                self.step()
            self.cache.advance(1, device=False)
            self.emitted += 1
            self.timed_steps += s >= timed_from
            if self.eos is not None and (s + 1) % STOP_CHECK_EVERY == 0 and bool(self.done.all()):
                break
        self.clock.mark("end")

    def _side_stream_step(self) -> None:
        # Eager steps before a capture run on a side stream, as CUDA graph capture asks of its warm-up.
        stream = torch.cuda.Stream(self.cache.device)
        stream.wait_stream(torch.cuda.current_stream(self.cache.device))
        with torch.cuda.stream(stream):
            self.step()
        torch.cuda.current_stream(self.cache.device).wait_stream(stream)

    def _capture(self):
        graph = torch.cuda.CUDAGraph()
        # autocast's cache of cast weights would be freed at the end of the caller's autocast block, under the graph
        autocast = (torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)
                    if torch.is_autocast_enabled("cuda") else contextlib.nullcontext())
        with torch.cuda.graph(graph), autocast:
            self.step()
        return graph

    def result(self, input_ids: torch.Tensor) -> GenerationOutput:
        """The sequences (and logits) up to the step where every sequence had ended."""
        n = self.emitted
        tokens = self.tokens[:, :n]
        if self.eos is not None:
            ended = (tokens[..., None] == self.eos).any(-1).cummax(dim=1).values.all(dim=0)  # (n,)
            if bool(ended.any()):
                n = int(ended.nonzero()[0]) + 1
        logits = None if self.logits is None else self.logits[:, :n]
        stats = dict(self.cache.stats(), acp_eviction=self.deltas is not None)
        timings = {"prefill_s": self.clock.seconds("prefill", "prefilled"), "decode_steps": self.timed_steps,
                   "decode_s": self.clock.seconds("steady", "end")}
        return GenerationOutput(torch.cat([input_ids, self.tokens[:, :n]], dim=1), logits, stats, timings)


def _token_ids(value, name: str, vocab_size: int, device) -> torch.Tensor | None:
    if value is None:
        return None
    ids = [value] if isinstance(value, int) else list(value)
    if not ids or not all(isinstance(i, int) and 0 <= i < vocab_size for i in ids):
        raise ValueError(f"{name} must be a token id or a list of them in [0, {vocab_size}); got {value!r}")
    return torch.tensor(ids, dtype=torch.int64, device=device)


CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # generate()'s dtype


def _check(max_new_tokens, prefill_chunk, cuda_graph, dtype, device) -> bool:
    if dtype is not None and dtype not in CACHE_DTYPES:
        raise ValueError(f"dtype must be None or one of {', '.join(map(str, CACHE_DTYPES))}; got {dtype!r}")
    if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
        raise ValueError(f"max_new_tokens must be an int >= 1; got {max_new_tokens!r}")
    if prefill_chunk is not None and not (isinstance(prefill_chunk, int) and prefill_chunk >= 1):
        raise ValueError(f"prefill_chunk must be None or an int >= 1; got {prefill_chunk!r}")
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs the model on a CUDA device; it is on {device}")
    return device.type == "cuda" if cuda_graph is None else bool(cuda_graph)


@torch.no_grad()
def generate(model, input_ids, attention_mask=None, *, max_new_tokens: int, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             eos_token_id=None, pad_token_id: int | None = None, acp_eviction: bool | None = None,
             acp_eps: float | None = None, eviction_threshold: float | None = None, block_size: int = 64,
             prefill_chunk: int | None = None, cuda_graph: bool | None = None, compile_step: bool | None = None,
             output_logits: bool = False, dtype: torch.dtype | None = None) -> GenerationOutput:
    """Generate up to ``max_new_tokens`` tokens after each prompt of a batch.

    model: a ``DecoderLM`` (FoX or Transformer, any config) or a ``FoXForCausalLM``.
    input_ids: (B, T) token ids, left-padded under ``attention_mask`` (B, T) 0/1; or a list of prompts (token
        lists or 1-D tensors of any lengths), left-padded here with ``pad_token_id``.
    do_sample, temperature, top_k, top_p: greedy by default, else sampling (``Sampler``; seed with
        ``torch.manual_seed``).
    eos_token_id: an id or a list; a sequence that emits one ends (``pad_token_id`` after it, default the first
        eos, else 0), and generation stops once every sequence has ended.
    acp_eviction: drop keys the forget gates have decayed below ACP's threshold, for good (``eviction.py``;
        default ``model.cfg.acp_eviction``): at most ``acp_eps`` (default ``model.cfg.acp_eps``) of any row's
        attention mass is dropped. Needs a forget gate, and QK-norm unless ``eviction_threshold`` (a delta < 0
        for every head) is given.
    block_size: positions per cache block (a power of two >= 16). prefill_chunk: prompt tokens per forward
        (default: the whole prompt at once). cuda_graph: replay each step as a CUDA graph (default: on CUDA).
        compile_step: compile the decoding step with ``torch.compile`` (default: on CUDA): Inductor fuses the
        step's small kernels (norms, gates, shifts, casts), which halves the time per token at small batches;
        the first call compiles (tens of seconds); later calls of other batch sizes, lengths and pools reuse it.
    dtype: of the cached keys and values, a floating ``torch.dtype`` (``CACHE_DTYPES``; default: the autocast
        dtype if autocast is on, else the model's).
    Returns a ``GenerationOutput``.
    """
    lm = decoder_of(model)
    device = lm.embed.weight.device
    cuda_graph = _check(max_new_tokens, prefill_chunk, cuda_graph, dtype, device)
    sampler = Sampler(do_sample, temperature, top_k, top_p)
    eos = _token_ids(eos_token_id, "eos_token_id", lm.cfg.vocab_size, device)
    pad = pad_token_id if pad_token_id is not None else (int(eos[0]) if eos is not None else 0)
    _token_ids(pad, "pad_token_id", lm.cfg.vocab_size, device)
    ids, seq_start = batch_prompts(input_ids, attention_mask, pad, device)
    eviction = bool(getattr(lm.cfg, "acp_eviction", False) if acp_eviction is None else acp_eviction)
    if eviction_threshold is not None and not eviction:
        raise ValueError("eviction_threshold is the threshold of ACP eviction: pass acp_eviction=True with it")
    B, P = ids.shape
    max_len = P + max_new_tokens
    eps = getattr(lm.cfg, "acp_eps", DEFAULT_EPS) if acp_eps is None else acp_eps
    # each sequence's own bound (its real tokens + max_new_tokens): the batch does not change what it drops
    deltas = (sequence_thresholds(lm, P - seq_start + max_new_tokens, eps, eviction_threshold) if eviction
              else None)
    if dtype is None:
        dtype = (torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type)
                 else lm.embed.weight.dtype)
    pool = _first_pool(lm, B, P, max_new_tokens, block_size, prefill_chunk) if eviction else None  # None: all
    cache = PagedKVCache.for_model(lm, B, max_len, block_size=block_size, dtype=dtype, pool_blocks=pool)
    compile_step = device.type == "cuda" if compile_step is None else bool(compile_step)
    dec = Decoder(lm, cache, sampler, eos, pad, max_new_tokens, output_logits, deltas, compile_step)
    return dec.generate(ids, seq_start, prefill_chunk, cuda_graph)


def _first_pool(model, batch_size, prompt_len, new_tokens, block_size, chunk) -> int:
    """Blocks for the first prefill forward, for the new tokens up to as many again, and one more block per row:
    with eviction the pools start there and grow only as far as the kept keys need. The room for new tokens
    means that a prompt whose gates drop nothing decodes as many tokens as it has without a growth, which would
    reallocate the pools and re-capture the step's CUDA graph; capped at the prefill's blocks, so that a long
    generation from a short prompt does not allocate the full cache that eviction exists to avoid (the
    compaction after the prefill gives the room back when eviction has freed half the pools)."""
    from ..models.decoder import resolve_heads

    rows = model.cfg.n_layers * batch_size * resolve_heads(model.cfg)[2]
    prefill = cdiv(min(prompt_len, chunk or prompt_len), block_size)
    return rows * (prefill + min(cdiv(new_tokens, block_size), prefill) + 1)
