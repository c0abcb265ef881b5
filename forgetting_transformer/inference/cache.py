"""The static KV cache of decoding: preallocated pools of fixed-size blocks, found through one table per layer.

A *row* is one (sequence, kv head) of one layer. Its positions ``[i * block_size, (i + 1) * block_size)`` live in
pool block ``tables[layer, b, kv_head, i]``; the pools are shared by all rows of all layers:

- ``k_pool``, ``v_pool`` (n_blocks, block_size, D): keys and values after KV-shift, QK-norm and RoPE, exactly as
  attention consumes them;
- ``c_pool`` (n_blocks, G, block_size) float64 (Forgetting Attention only): the cumulative log forget gate
  ``c_j`` of every cached key for each of the ``G = H / Hkv`` query heads of its kv head (float64: the sums grow
  without bound while attention needs their differences).

Per layer: ``key_start`` (B, H), each (sequence, query head)'s first visible key (its left-padding start, moved
forward by ACP eviction), ``c_last`` (B, H), the cumulative gate of the last cached token, and ``shift`` (KV-shift
only), the last token's key and value before the shift. Per sequence: ``lengths`` (B,) positions written (counted
over the left-padded batch, so every row has the same length; the host keeps it too as ``length``) and
``seq_start`` (B,) its first real token.

Every method used by a decoding step (``write``, the layer views' ``attend``) reads and writes device tensors
only, with shapes fixed by the batch, so the step can be captured in a CUDA graph. The host-side methods
(``reserve``, ``release``, ``compact``) run between steps: ``reserve`` hands out blocks from a free list, and grows
the pools when the list may run short; ``release`` puts back the blocks that lie wholly before every query head's
first visible key, so memory that eviction or left padding frees is reused; ``compact`` moves the live blocks to
the front of smaller pools (``version`` counts the reallocations, after which a captured step must be recaptured).
"""

from __future__ import annotations

import math

import torch

from ..ops.decode import forgetting_attention_decode
from ..ops.decode import paged_write


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class PagedKVCache:
    """Blocks of ``block_size`` positions (a power of two >= 16) for ``n_layers`` layers of ``batch_size``
    sequences of up to ``max_len`` positions. ``pool_blocks``: blocks allocated now (default: every block the
    sequences can ever need, so the pools never grow)."""

    def __init__(self, *, n_layers: int, batch_size: int, max_len: int, n_heads: int, n_kv_heads: int,
                 head_dim: int, gated: bool, kv_shift: bool, dtype: torch.dtype, device, block_size: int = 64,
                 pool_blocks: int | None = None):
        self.check_block_size(block_size)
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1; got {max_len}")
        self.n_layers, self.batch_size, self.max_len = n_layers, batch_size, max_len
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.group, self.block_size, self.dtype = n_heads // n_kv_heads, block_size, dtype
        self.device = torch.device(device)
        self.max_blocks = cdiv(max_len, block_size)
        self.full_blocks = n_layers * batch_size * n_kv_heads * self.max_blocks
        n_blocks = self.full_blocks if pool_blocks is None else max(1, min(pool_blocks, self.full_blocks))
        self.k_pool = torch.zeros(n_blocks, block_size, head_dim, dtype=dtype, device=self.device)
        self.v_pool = torch.zeros_like(self.k_pool)
        self.c_pool = (torch.zeros(n_blocks, self.group, block_size, dtype=torch.float64, device=self.device)
                       if gated else None)
        # the free list: ids of free blocks in free_ids[:n_free]; the last slot takes the masked-out pushes
        self.free_ids = torch.arange(n_blocks + 1, dtype=torch.int32, device=self.device)
        self.n_free = torch.tensor(n_blocks, dtype=torch.int64, device=self.device)
        self.tables = torch.full((n_layers, batch_size, n_kv_heads, self.max_blocks), -1, dtype=torch.int32,
                                 device=self.device)
        self.n_freed = torch.zeros(n_layers, batch_size, n_kv_heads, dtype=torch.int64, device=self.device)
        self.key_start = torch.zeros(n_layers, batch_size, n_heads, dtype=torch.int64, device=self.device)
        self.c_last = torch.zeros(n_layers, batch_size, n_heads, dtype=torch.float64, device=self.device)
        self.shift = (torch.zeros(n_layers, 2, batch_size, 1, n_kv_heads, head_dim, dtype=dtype, device=self.device)
                      if kv_shift else None)
        self.lengths = torch.zeros(batch_size, dtype=torch.int64, device=self.device)
        self.seq_start = torch.zeros(batch_size, dtype=torch.int64, device=self.device)
        self.length = 0  # = lengths[b] for every b, on the host
        self.n_alloc = 0  # blocks every row holds a table entry for (allocated, or allocated and released)
        self.used_bound = 0  # an upper bound of the blocks in use, exact after every sync of n_free
        self.version = 0

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int, **kwargs) -> "PagedKVCache":
        """A cache for a ``DecoderLM``: heads, gate and KV-shift from its config; ``kwargs`` as ``__init__``
        (``dtype`` and ``device`` default to the embedding's)."""
        from ..models.decoder import resolve_heads

        head_dim, n_heads, n_kv_heads = resolve_heads(model.cfg)
        kwargs.setdefault("dtype", model.embed.weight.dtype)
        kwargs.setdefault("device", model.embed.weight.device)
        return cls(n_layers=len(model.blocks), batch_size=batch_size, max_len=max_len, n_heads=n_heads,
                   n_kv_heads=n_kv_heads, head_dim=head_dim, gated=model.cfg.fgate != "none",
                   kv_shift=model.cfg.kv_shift, **kwargs)

    @staticmethod
    def check_block_size(block_size) -> None:
        # the decode kernel takes a block as one tile of keys
        if not (isinstance(block_size, int) and block_size >= 16 and block_size & (block_size - 1) == 0):
            raise ValueError(f"block_size must be a power of two >= 16; got {block_size!r}")

    @property
    def pool_blocks(self) -> int:
        return self.k_pool.shape[0]

    @property
    def decode_layer(self) -> type:
        """The class of the views that attend over the cache (a subclass may attend otherwise)."""
        return DecodeLayer

    def layers(self, decode: bool) -> list:
        """The per-layer views to pass as ``cache=`` to the blocks: ``decode=False`` for the prefill of an empty
        cache (the layers attend with their own op over the prompt), ``True`` for tokens after cached ones."""
        # Made per call, not kept: views kept by the cache would form a reference cycle with it, and a cycle is
        # freed only when Python's cyclic collector runs, which the size of the pools does not trigger (a
        # finished generate() would hold tens of GB until then).
        kind = self.decode_layer if decode else CacheLayer
        return [kind(self, i) for i in range(self.n_layers)]

    def begin(self, seq_start: torch.Tensor) -> None:
        """Start the sequences: ``seq_start`` (B,), each one's first real position of the left-padded batch."""
        if self.length:
            raise RuntimeError("begin() needs an empty cache; make a new PagedKVCache for new sequences")
        self.seq_start.copy_(seq_start)
        self.key_start.copy_(seq_start[None, :, None].expand_as(self.key_start))

    def advance(self, n: int, device: bool = True) -> None:
        """Count ``n`` written positions (``device=False``: on the host only; a captured step advances
        ``lengths`` itself)."""
        if device:
            self.lengths += n
        self.length += n

    # ------------------------------------------------------------------ within a step (device tensors only)

    def write(self, layer: int, k, v, log_fgate, shift_state):
        """Store new tokens' k, v (B, T, Hkv, D), log forget gates (B, T, H) or None and pre-shift (k, v) or
        None at positions ``lengths .. lengths + T - 1``. Returns the new tokens' cumulative gates c (B, T, H)
        float64, or None without a gate."""
        c = None
        if self.c_pool is not None:
            c = self.c_last[layer][:, None, :] + torch.cumsum(log_fgate.double(), dim=1)  # (B, T, H)
        paged_write(self.k_pool, self.v_pool, self.c_pool, self.tables[layer], self.lengths, k, v, c)
        if c is not None:
            self.c_last[layer].copy_(c[:, -1])
        if shift_state is not None:
            self.shift[layer, 0].copy_(shift_state[0][:, -1:])
            self.shift[layer, 1].copy_(shift_state[1][:, -1:])
        return c

    # ------------------------------------------------------------------ between steps

    def reserve(self, n_tokens: int) -> None:
        """Give every row blocks for its next ``n_tokens`` positions, growing the pools if the free list may run
        short (the only sync with the device: the blocks eviction released are counted there)."""
        if self.length + n_tokens > self.max_len:
            raise ValueError(f"the cache holds max_len={self.max_len} positions per sequence; "
                             f"{self.length} written + {n_tokens} more do not fit")
        need = cdiv(self.length + n_tokens, self.block_size)
        k = need - self.n_alloc
        if k <= 0:
            return
        count = self.n_layers * self.batch_size * self.n_kv_heads * k
        if self.used_bound + count > self.pool_blocks:
            self.used_bound = self.pool_blocks - int(self.n_free)
            if self.used_bound + count > self.pool_blocks:
                self._grow(self.used_bound + count)
        ids = self.free_ids[self.n_free - count + torch.arange(count, device=self.device)]
        self.tables[..., self.n_alloc:need] = ids.view(self.n_layers, self.batch_size, self.n_kv_heads, k)
        self.n_free -= count
        self.used_bound += count
        self.n_alloc = need

    def _grow(self, min_blocks: int) -> None:
        old = self.pool_blocks
        new = min(self.full_blocks, max(min_blocks, math.ceil(1.5 * old)))
        added = new - old

        def extend(pool):
            return torch.cat([pool, pool.new_zeros((added,) + pool.shape[1:])])

        self.k_pool, self.v_pool = extend(self.k_pool), extend(self.v_pool)
        if self.c_pool is not None:
            self.c_pool = extend(self.c_pool)
        free_ids = torch.empty(new + 1, dtype=torch.int32, device=self.device)
        free_ids[:old] = self.free_ids[:old]
        free_ids[self.n_free + torch.arange(added, device=self.device)] = torch.arange(
            old, new, dtype=torch.int32, device=self.device)
        self.free_ids = free_ids
        self.n_free += added
        self.version += 1

    def release(self) -> None:
        """Return to the free list every block wholly before the first visible key of all query heads of its
        row (left padding, evicted keys). No sync."""
        first = self.key_start.view(self.n_layers, self.batch_size, self.n_kv_heads, self.group).amin(-1)
        # blocks wholly before it, of those allocated (a chunked prefill may not have reached the padding's end)
        target = (first // self.block_size).clamp(max=self.n_alloc)  # (L, B, Hkv)
        i = torch.arange(self.max_blocks, device=self.device)
        mask = (i >= self.n_freed[..., None]) & (i < target[..., None])  # (L, B, Hkv, MB)
        flat = mask.flatten()
        dest = torch.where(flat, self.n_free + torch.cumsum(flat, 0) - 1, self.pool_blocks)
        self.free_ids.scatter_(0, dest, self.tables.flatten())
        self.n_free += flat.sum()
        self.tables.masked_fill_(mask, -1)
        torch.maximum(self.n_freed, target, out=self.n_freed)

    def compact(self, headroom: int) -> bool:
        """Move the blocks in use to the front of pools of (blocks in use + ``headroom``) blocks, if that frees
        at least half of the pools; returns whether it did. Syncs once."""
        in_use = self.pool_blocks - int(self.n_free)
        size = min(self.pool_blocks, in_use + headroom)
        if 2 * size > self.pool_blocks:
            self.used_bound = in_use
            return False
        live = self.tables >= 0
        old_ids = self.tables[live].long()  # (in_use,)
        self.k_pool, self.v_pool = (torch.cat([p[old_ids], p.new_zeros((size - in_use,) + p.shape[1:])])
                                    for p in (self.k_pool, self.v_pool))
        if self.c_pool is not None:
            self.c_pool = torch.cat([self.c_pool[old_ids], self.c_pool.new_zeros((size - in_use,)
                                                                                  + self.c_pool.shape[1:])])
        self.tables[live] = torch.arange(in_use, dtype=torch.int32, device=self.device)
        self.free_ids = torch.arange(size + 1, dtype=torch.int32, device=self.device)
        self.free_ids[:size - in_use] = torch.arange(in_use, size, dtype=torch.int32, device=self.device)
        self.n_free.fill_(size - in_use)
        self.used_bound = in_use
        self.version += 1
        return True

    def stats(self) -> dict:
        """Kept keys and memory now: ``kept`` (L, B, H) positions each (layer, sequence, head) attends to;
        ``tokens`` (B,) real positions per sequence; ``kept_fraction`` (L, H) kept / real tokens summed over the
        batch; ``blocks_in_use`` / ``pool_blocks`` / ``full_blocks`` (the pools without eviction); and bytes
        (keys, values and cumulative gates) of the blocks in use and of the pools; ``reallocations`` of the pools
        (growths and compactions). Syncs."""
        kept = (self.lengths[None, :, None] - self.key_start).clamp(min=0)
        tokens = self.lengths - self.seq_start
        per_block = self.block_size * self.head_dim * self.k_pool.element_size() * 2
        if self.c_pool is not None:
            per_block += self.group * self.block_size * 8
        in_use = int((self.tables >= 0).sum())
        return {
            "kept": kept.cpu(), "tokens": tokens.cpu(),
            "kept_fraction": (kept.sum(1).double() / tokens.sum().clamp(min=1)).cpu(),
            "blocks_in_use": in_use, "pool_blocks": self.pool_blocks, "full_blocks": self.full_blocks,
            "bytes_in_use": in_use * per_block, "pool_bytes": self.pool_blocks * per_block,
            "reallocations": self.version,
        }


class CacheLayer:
    """Layer ``index`` of a ``PagedKVCache`` behind the interface ``Attention`` uses (``LayerCache``'s):
    ``update`` stores the new tokens and returns them as they are, so the layer's own attention op sees exactly
    the prompt (prefill of an empty cache)."""

    def __init__(self, cache: PagedKVCache, index: int):
        self.cache, self.index = cache, index
        self.c_new = None  # the last update's cumulative gates (B, T, H)

    @property
    def shift_state(self):
        c = self.cache
        if c.shift is None or c.length == 0:  # x_{-1} = 0 before the first token
            return None
        return c.shift[self.index, 0], c.shift[self.index, 1]

    def get_seq_length(self) -> int:
        return self.cache.length

    def update(self, k, v, log_fgate, shift_state):
        self.c_new = self.cache.write(self.index, k, v, log_fgate, shift_state)
        return k, v, log_fgate


class DecodeLayer(CacheLayer):
    """A ``CacheLayer`` that also attends: the new tokens' queries over every cached key they can see, with the
    decode kernel (``ops.decode``)."""

    @property
    def shift_state(self):
        # Tokens after cached ones: the cache is never empty here, and reading its host-side length would make a
        # compiled step specialise on it (a second compilation at the second step).
        c = self.cache
        return None if c.shift is None else (c.shift[self.index, 0], c.shift[self.index, 1])

    def attend(self, q, k, v, log_fgate):
        c, i = self.cache, self.index
        o = forgetting_attention_decode(q.to(c.dtype), c.k_pool, c.v_pool, c.tables[i], c.lengths + q.shape[1],
                                        c.key_start[i], c_q=self.c_new, c_pool=c.c_pool)  # (B, T, H, D)
        return o.to(q.dtype)
