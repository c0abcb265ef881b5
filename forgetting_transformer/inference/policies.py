"""KV-cache eviction policies over the paged cache, behind one interface, and scoring through what they keep.

A prompt of T tokens is prefilled once into a full ``PagedKVCache`` (``prefill_prefix``), which also computes the
statistics the policies rank positions by. A policy then picks which prompt positions each *row* (layer,
sequence, kv head) keeps (``Policy.select`` → ``Selection``); ``evicted_cache`` copies the kept keys, values and
cumulative gates into a fresh cache, through which ``continuation_loss`` scores later tokens (teacher forcing)
and ``greedy_tokens`` decodes.

The policies (``POLICIES``):

- ``Acp``: ACP's bound (``eviction.thresholds``) at ``eps`` or at an explicit threshold: query head h drops the
  keys j with ``c_T - c_j < delta_h`` (at most ``eps`` of the attention mass of any later row); a row keeps what
  any of its query heads keeps. The kept count is an outcome, not a target.
- ``Streaming`` (StreamingLLM): the first ``sink`` positions (attention sinks) and the most recent ones.
- ``H2O`` (heavy hitters): the most recent ``recent_share`` of the budget, and the earlier positions with the most
  attention accumulated over every query of the prompt.
- ``SnapKV``: the last ``window`` positions (the observation window), and the earlier positions the window's
  queries attend to most, after a max-pool over ``kernel`` neighbours (which keeps the context of a chosen key).

Scores are the model's real attention probabilities: queries as the layer computes them (``Attention.project``:
QK-norm, RoPE), keys and cumulative gates read back from the cache, and for FoX the decay ``c_i - c_j`` added to
the logits before the softmax (plain softmax for a Transformer). A kv head's score of a position is the sum over
its query heads. Computed in float32, or float64 for a float64 model.

Budgets. A targeted policy takes ``fraction`` (of the T prompt positions) or ``kv_bytes`` (for the whole cache);
every row then keeps exactly K positions: ``K = max(1, floor(fraction * T + 1/2))``, with ``fraction`` taken as
the decimal it prints as (halves round up, at least one position), or ``K = min(T, floor(kv_bytes / (rows *
bytes_per_position)))`` (an error if that is 0). Equal scores go to the later position.
"""

from __future__ import annotations

import abc
import math
from dataclasses import asdict, dataclass
from fractions import Fraction
from functools import partial
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..models.decoder import chunked_cross_entropy
from .cache import PagedKVCache, cdiv
from .eviction import DEFAULT_EPS, thresholds
from .generate import decoder_of, prefill

SCORE_ELEMENTS = 1 << 26  # attention probabilities held at once while scoring (sequences x heads x queries x keys)


def round_half_up(share: float, n: int) -> int:
    """``floor(share * n + 1/2)`` with ``share`` read as the decimal it prints as (0.35 * 10 is 4, not 3)."""
    return math.floor(Fraction(repr(float(share))) * n + Fraction(1, 2))


# ---------------------------------------------------------------------------------------------- attention scores

def attention_probs(q: torch.Tensor, k: torch.Tensor, c: torch.Tensor | None, q_start: int,
                    sm_scale: float) -> torch.Tensor:
    """Causal attention probabilities (B, H, Tq, T) of queries q (B, H, Tq, D) at positions ``q_start .. q_start +
    Tq - 1`` over keys k (B, Hkv, T, D) at ``0 .. T - 1``, with the decay ``c_i - c_j`` of c (B, H, T) float64
    added to the logits (None: softmax attention). float32, or float64 for float64 inputs."""
    B, H, Tq, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    dt = torch.promote_types(q.dtype, torch.float32)
    logits = torch.einsum("bkgqd,bktd->bkgqt", q.to(dt).view(B, Hkv, H // Hkv, Tq, D), k.to(dt))
    logits = logits.reshape(B, H, Tq, T) * sm_scale
    if c is not None:
        # the difference in float64 (c grows without bound), then the logits' dtype, as the kernels do
        logits = logits + (c[:, :, q_start:q_start + Tq, None] - c[:, :, None, :]).to(dt)
    pos_q = q_start + torch.arange(Tq, device=q.device)
    future = torch.arange(T, device=q.device)[None, :] > pos_q[:, None]  # (Tq, T)
    return logits.masked_fill(future, float("-inf")).softmax(-1)


class Statistic(abc.ABC):
    """What a policy ranks positions by: per layer, from its queries q (B, H, T, D), cached keys k (B, Hkv, T, D)
    and cumulative gates c (B, H, T) float64 or None, a score (B, Hkv, T) per (sequence, kv head, position)."""

    @abc.abstractmethod
    def compute(self, q: torch.Tensor, k: torch.Tensor, c: torch.Tensor | None, sm_scale: float) -> torch.Tensor:
        ...


@dataclass(frozen=True)
class AccumulatedAttention(Statistic):
    """H2O's score: the attention each key receives, summed over every query of the prompt and over the query
    heads of its kv head."""

    def compute(self, q, k, c, sm_scale):
        B, H, T, _ = q.shape
        step = max(1, SCORE_ELEMENTS // (B * H * T))  # queries per pass: bounded memory at long prompts
        total = torch.zeros(B, H, T, dtype=torch.promote_types(q.dtype, torch.float32), device=q.device)
        for s in range(0, T, step):
            total += attention_probs(q[:, :, s:s + step], k, c, s, sm_scale).sum(2)
        return total.view(B, k.shape[1], -1, T).sum(2)


@dataclass(frozen=True)
class WindowAttention(Statistic):
    """SnapKV's score: the attention each key receives from the last ``window`` queries of the prompt (every query
    if there are fewer), summed over them and over the query heads of its kv head."""

    window: int

    def compute(self, q, k, c, sm_scale):
        B, H, T, _ = q.shape
        w = min(self.window, T)
        return attention_probs(q[:, :, T - w:], k, c, T - w, sm_scale).sum(2).view(B, k.shape[1], -1, T).sum(2)


# ---------------------------------------------------------------------------------------------- the prefilled prompt

def dense_layer(cache: PagedKVCache, layer: int, T: int):
    """Positions ``0 .. T - 1`` of one layer of ``cache`` as dense tensors: k, v (B, Hkv, T, D) and c (B, H, T)
    float64 (None without a gate)."""
    B, Hkv, G, BS = cache.batch_size, cache.n_kv_heads, cache.group, cache.block_size
    nb = cdiv(T, BS)
    idx = cache.tables[layer, :, :, :nb].long()  # (B, Hkv, nb)
    k = cache.k_pool[idx].reshape(B, Hkv, nb * BS, -1)[:, :, :T]
    v = cache.v_pool[idx].reshape(B, Hkv, nb * BS, -1)[:, :, :T]
    c = None
    if cache.c_pool is not None:
        c = cache.c_pool[idx].permute(0, 1, 3, 2, 4).reshape(B, Hkv * G, nb * BS)[:, :, :T]  # (B, H, T)
    return k, v, c


@dataclass
class Prefix:
    """A prompt (B, T) prefilled into a full cache, and what the policies rank its positions by.

    model: the ``DecoderLM``. cache: every prompt position (left as it is: evicted caches are copies).
    logits: (B, V) at the prompt's last position. stats: each ``Statistic`` computed → (L, B, Hkv, T).
    max_len: the positions a continuation may reach (the room of evicted caches; ACP's bound is taken at it)."""

    model: torch.nn.Module
    cache: PagedKVCache
    logits: torch.Tensor
    stats: dict
    max_len: int

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def rows(self) -> int:
        """(layer, sequence, kv head) rows of the cache."""
        return self.cache.n_layers * self.cache.batch_size * self.cache.n_kv_heads

    @property
    def bytes_per_position(self) -> int:
        """Bytes a kept position takes in one row: its key and value, and (FoX) its cumulative gate for each query
        head of the row, float64."""
        c = self.cache
        gates = c.group * 8 if c.c_pool is not None else 0
        return 2 * c.head_dim * c.k_pool.element_size() + gates


@torch.no_grad()
def prefill_prefix(model, input_ids: torch.Tensor, *, statistics=(), max_len: int | None = None,
                   block_size: int = 64) -> Prefix:
    """Prefill ``input_ids`` (B, T) (no padding) into a full ``PagedKVCache`` in the model's dtype, with
    ``generate.prefill`` (the layers' own attention), and compute each of ``statistics`` layer by layer on the way.
    ``max_len``: positions a continuation may reach (default T + 1). ``model``: a ``DecoderLM`` or a
    ``FoXForCausalLM``."""
    lm = decoder_of(model)
    B, T = input_ids.shape
    max_len = T + 1 if max_len is None else max_len
    if max_len <= T:
        raise ValueError(f"max_len must exceed the prompt's {T} tokens; got {max_len}")
    cache = PagedKVCache.for_model(lm, B, T, block_size=block_size)
    stats = {s: [] for s in dict.fromkeys(statistics)}

    def score(layer, attn, args, kwargs, output):
        # the layer has written its keys and gates into the cache; its queries are recomputed from its input
        q = attn.project(args[0], positions=kwargs.get("positions"))[0].transpose(1, 2)  # (B, H, T, D)
        k, _, c = dense_layer(cache, layer, T)
        for stat, per_layer in stats.items():
            per_layer.append(stat.compute(q, k, c, 1.0 / math.sqrt(q.shape[-1])))

    hooks = ([b.attn.register_forward_hook(partial(score, i), with_kwargs=True) for i, b in enumerate(lm.blocks)]
             if stats else [])
    try:
        logits = prefill(lm, cache, input_ids, torch.zeros(B, dtype=torch.int64, device=input_ids.device))
    finally:
        for h in hooks:
            h.remove()
    return Prefix(lm, cache, logits, {s: torch.stack(v) for s, v in stats.items()}, max_len)


# ---------------------------------------------------------------------------------------------- policies

@dataclass
class Selection:
    """What each row keeps of the prompt: ``keep`` (L, B, Hkv, T) bool; ``start`` (L, B, H) or None: each query
    head's first visible position (ACP: a query head sees the row's kept keys from its own bound on; None: every
    kept key)."""

    keep: torch.Tensor
    start: torch.Tensor | None = None

    @property
    def kept_fraction(self) -> float:
        return float(self.keep.double().mean())

    def kv_bytes(self, prefix: Prefix) -> int:
        """Bytes of the kept positions (keys, values, gates) over the whole cache."""
        return int(self.keep.sum()) * prefix.bytes_per_position


def row_mask(prefix: Prefix, value: bool) -> torch.Tensor:
    """(L, B, Hkv, T) bool, every entry ``value``."""
    c = prefix.cache
    return torch.full((c.n_layers, c.batch_size, c.n_kv_heads, prefix.length), value, dtype=torch.bool,
                      device=c.device)


def keep_all(prefix: Prefix) -> Selection:
    """Every prompt position (the full cache, copied)."""
    return Selection(row_mask(prefix, True))


def top_positions(scores: torch.Tensor, n: int, keep: torch.Tensor) -> None:
    """Set ``keep`` (..., T) at the ``n`` highest of ``scores`` (..., T') (positions ``0 .. T' - 1``, T' <= T);
    equal scores go to the later position."""
    if n <= 0:
        return
    # a stable sort of the reversed scores lists equal ones latest position first
    order = torch.sort(scores.flip(-1), dim=-1, descending=True, stable=True).indices[..., :n]
    keep.scatter_(-1, scores.shape[-1] - 1 - order, True)


class Policy(abc.ABC):
    """An eviction policy: ``select(prefix)`` → ``Selection``. ``statistic``: what it ranks positions by (computed
    during the prefill; None: nothing)."""

    name: ClassVar[str]
    statistic = None

    @abc.abstractmethod
    def select(self, prefix: Prefix) -> Selection:
        ...

    def describe(self) -> dict:
        """The policy's name and settings, e.g. ``{"policy": "h2o", "fraction": 0.1, "kv_bytes": None, ...}``."""
        return {"policy": self.name, **asdict(self)}


@dataclass(frozen=True)
class Acp(Policy):
    """ACP's bound at ``eps`` (in (0, 1); default e^-10, ACP's), or at an explicit ``threshold`` delta < 0 for
    every head instead (for models without QK-norm); one of the two. Needs a forget gate."""

    name: ClassVar[str] = "acp"
    eps: float | None = None
    threshold: float | None = None

    def __post_init__(self):
        if self.eps is not None and self.threshold is not None:
            raise ValueError(f"acp: give eps or threshold, not both; got eps={self.eps}, threshold={self.threshold}")
        if self.threshold is None and self.eps is None:
            object.__setattr__(self, "eps", DEFAULT_EPS)
        if self.eps is not None and not 0 < self.eps < 1:
            raise ValueError(f"acp: eps must be in (0, 1); got {self.eps}")
        if self.threshold is not None and not self.threshold < 0:
            raise ValueError(f"acp: threshold must be < 0 (the newest key, with decay 0, is always kept); got "
                             f"{self.threshold}")

    def select(self, prefix):
        cache, T = prefix.cache, prefix.length
        deltas = thresholds(prefix.model, prefix.max_len, self.eps, self.threshold)  # (L, H) float64
        c = torch.stack([dense_layer(cache, i, T)[2] for i in range(cache.n_layers)])  # (L, B, H, T)
        # c never increases, so the keys below the bound are a prefix: the first kept key is their count
        start = ((c[..., -1:] - c) < deltas[:, None, :, None]).sum(-1)  # (L, B, H)
        first = start.view(*start.shape[:2], cache.n_kv_heads, cache.group).amin(-1)  # (L, B, Hkv)
        return Selection(torch.arange(T, device=c.device) >= first[..., None], start)


@dataclass(frozen=True)
class Targeted(Policy):
    """A policy that keeps exactly K positions per row: ``fraction`` of the prompt or ``kv_bytes`` in all (give
    one; the rounding rule is in the module docstring)."""

    fraction: float | None = None
    kv_bytes: int | None = None

    def __post_init__(self):
        if (self.fraction is None) == (self.kv_bytes is None):
            raise ValueError(f"{self.name}: give exactly one of fraction and kv_bytes; got fraction="
                             f"{self.fraction}, kv_bytes={self.kv_bytes}")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"{self.name}: fraction must be in (0, 1]; got {self.fraction}")
        if self.kv_bytes is not None and not (isinstance(self.kv_bytes, int) and self.kv_bytes >= 1):
            raise ValueError(f"{self.name}: kv_bytes must be an int >= 1; got {self.kv_bytes!r}")

    def count(self, prefix: Prefix) -> int:
        """K, the positions every row keeps."""
        T = prefix.length
        if self.fraction is not None:
            return max(1, round_half_up(self.fraction, T))
        per_position = prefix.rows * prefix.bytes_per_position
        if self.kv_bytes < per_position:
            raise ValueError(f"{self.name}: kv_bytes={self.kv_bytes} holds no position: one position in each of "
                             f"the {prefix.rows} (layer, sequence, kv head) rows takes {per_position} bytes")
        return min(T, self.kv_bytes // per_position)


@dataclass(frozen=True)
class Streaming(Targeted):
    """StreamingLLM: the first ``sink`` positions (all K if K <= sink) and the K - sink most recent."""

    name: ClassVar[str] = "streaming"
    sink: int = 4

    def __post_init__(self):
        super().__post_init__()
        if not (isinstance(self.sink, int) and self.sink >= 0):
            raise ValueError(f"streaming: sink must be an int >= 0; got {self.sink!r}")

    def select(self, prefix):
        K, T = self.count(prefix), prefix.length
        sink = min(self.sink, K)
        pos = torch.arange(T, device=prefix.cache.device)
        keep = (pos < sink) | (pos >= T - (K - sink))  # (T,)
        return Selection(row_mask(prefix, False) | keep)


@dataclass(frozen=True)
class H2O(Targeted):
    """H2O: the ``r = floor(recent_share * K + 1/2)`` most recent positions, and the K - r earlier ones with the
    most accumulated attention (``AccumulatedAttention``)."""

    name: ClassVar[str] = "h2o"
    recent_share: float = 0.5
    statistic = AccumulatedAttention()

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.recent_share <= 1:
            raise ValueError(f"h2o: recent_share must be in [0, 1]; got {self.recent_share}")

    def select(self, prefix):
        K, T = self.count(prefix), prefix.length
        recent = round_half_up(self.recent_share, K)
        keep = row_mask(prefix, False)
        keep[..., T - recent:] = True
        top_positions(prefix.stats[self.statistic][..., :T - recent], K - recent, keep)
        return Selection(keep)


@dataclass(frozen=True)
class SnapKV(Targeted):
    """SnapKV: the last ``min(window, K)`` positions, and the K - window earlier ones with the highest
    ``WindowAttention`` max-pooled over ``kernel`` (odd) neighbours among the positions before the window."""

    name: ClassVar[str] = "snapkv"
    window: int = 32
    kernel: int = 7

    def __post_init__(self):
        super().__post_init__()
        if not (isinstance(self.window, int) and self.window >= 1):
            raise ValueError(f"snapkv: window must be an int >= 1; got {self.window!r}")
        if not (isinstance(self.kernel, int) and self.kernel >= 1 and self.kernel % 2):
            raise ValueError(f"snapkv: kernel must be an odd int >= 1; got {self.kernel!r}")

    @property
    def statistic(self) -> WindowAttention:
        return WindowAttention(self.window)

    def select(self, prefix):
        K, T = self.count(prefix), prefix.length
        w = min(self.window, T)
        keep = row_mask(prefix, False)
        keep[..., T - min(w, K):] = True
        if K > w:
            scores = prefix.stats[self.statistic][..., :T - w]  # (L, B, Hkv, T - w)
            pooled = F.max_pool1d(scores.reshape(-1, 1, T - w), self.kernel, stride=1, padding=self.kernel // 2)
            top_positions(pooled.view_as(scores), K - w, keep)
        return Selection(keep)


POLICIES = {p.name: p for p in (Acp, Streaming, H2O, SnapKV)}


# ---------------------------------------------------------------------------------------------- the evicted cache

@torch.no_grad()
def evicted_cache(prefix: Prefix, selection: Selection) -> PagedKVCache:
    """A fresh cache holding the kept positions of ``prefix.cache`` only, with room for ``prefix.max_len - T``
    more tokens. Each row's kept keys, values and gates sit in order, right-aligned so that every row ends at K
    (the most any row keeps); the query heads' ``key_start`` hide the slots before a row's first kept key (and,
    with ``selection.start``, the kept keys before a head's own start). RoPE was applied before caching and the
    gates travel with their keys, so attention over the kept positions is what it was; later tokens need their
    true positions (T, T + 1, ...) passed to the model."""
    src, keep = prefix.cache, selection.keep
    L, B, Hkv, T = keep.shape
    G, BS = src.group, src.block_size
    counts = keep.sum(-1)  # (L, B, Hkv)
    K = int(counts.max())
    dst = PagedKVCache(n_layers=L, batch_size=B, max_len=K + prefix.max_len - T, n_heads=src.n_heads,
                       n_kv_heads=Hkv, head_dim=src.head_dim, gated=src.c_pool is not None,
                       kv_shift=src.shift is not None, dtype=src.dtype, device=src.device, block_size=BS)
    dst.begin(torch.zeros(B, dtype=torch.int64, device=src.device))
    dst.reserve(K)
    slot = (K - counts)[..., None] + keep.cumsum(-1) - 1  # (L, B, Hkv, T): each kept position's slot
    for layer in range(L):
        k, v, c = dense_layer(src, layer, T)
        b, h, j = keep[layer].nonzero(as_tuple=True)  # (N,) each
        s = slot[layer, b, h, j]
        blk, off = dst.tables[layer, b, h, s // BS].long(), s % BS
        dst.k_pool[blk, off] = k[b, h, j]
        dst.v_pool[blk, off] = v[b, h, j]
        if c is not None:
            dst.c_pool[blk, :, off] = c.reshape(B, Hkv, G, T)[b, h, :, j]  # (N, G)
    start = torch.zeros_like(src.key_start) if selection.start is None else selection.start  # (L, B, H)
    visible = keep.repeat_interleave(G, dim=2) & (torch.arange(T, device=keep.device) >= start[..., None])
    dst.key_start.copy_(K - visible.sum(-1))
    dst.c_last.copy_(src.c_last)
    if dst.shift is not None:
        dst.shift.copy_(src.shift)
    dst.advance(K)
    return dst


def _forward(lm, cache: PagedKVCache, tokens: torch.Tensor, position: int) -> torch.Tensor:
    """Tokens (B, t) at true positions ``position ..`` through ``cache`` (which takes their keys) → final hidden
    states (B, t, d_model)."""
    t = tokens.shape[1]
    cache.reserve(t)
    h = lm.hidden_states(tokens, cache=cache.layers(decode=True),
                         positions=position + torch.arange(t, device=tokens.device))
    cache.advance(t)
    return h


@torch.no_grad()
def continuation_loss(prefix: Prefix, selection: Selection, input_ids: torch.Tensor, labels: torch.Tensor, *,
                      chunk: int = 512) -> torch.Tensor:
    """Per-token loss (B, C) float32 of ``labels`` (B, C) after ``input_ids`` (B, C), the tokens at positions
    T .. T + C - 1 after the prompt, fed ``chunk`` at a time through ``evicted_cache(prefix, selection)``."""
    lm, T = prefix.model, prefix.length
    cache = evicted_cache(prefix, selection)
    losses = []
    for s in range(0, input_ids.shape[1], chunk):
        h = _forward(lm, cache, input_ids[:, s:s + chunk], T + s)
        losses.append(chunked_cross_entropy(h, lm.lm_head.weight, labels[:, s:s + chunk], lm.cfg.loss_chunk))
    return torch.cat(losses, dim=1).float()


@torch.no_grad()
def greedy_tokens(prefix: Prefix, selection: Selection, n: int, forced: torch.Tensor | None = None) -> torch.Tensor:
    """The greedy choices (B, n) of n steps through ``evicted_cache(prefix, selection)``. Step 0 feeds, at position
    T, the token the prompt's last position picks (``prefix.logits``: before eviction, the same for every
    policy); step i > 0 feeds the choice of step i - 1, or ``forced[:, i - 1]`` (``forced`` (B, n): another run's
    choices, so that every step of two runs is compared in the same context)."""
    lm = prefix.model
    cache = evicted_cache(prefix, selection)
    token = prefix.logits.argmax(-1)[:, None]  # (B, 1)
    out = []
    for i in range(n):
        out.append(lm.lm_head(_forward(lm, cache, token, prefix.length + i)[:, -1]).argmax(-1))  # (B,)
        token = (out[-1] if forced is None else forced[:, i])[:, None]
    return torch.stack(out, dim=1)
