"""Writing new tokens' keys, values and cumulative gates into the blocks of a paged KV cache.

Token ``t`` of sequence ``b`` goes to position ``p = lengths[b] + t``: slot ``p % BS`` of pool block
``table[b, hkv, p // BS]`` for each kv head ``hkv`` (keys and values), and the same slot of the same block of
``c_pool`` for each of the ``G = H / Hkv`` query heads of that kv head (the cumulative log forget gates).

Layers, top to bottom:
    ``_paged_write_kernel``   the Triton kernel: a program per (sequence, kv head, token), casting on the way;
    ``paged_write_launch``    launches it on tensors;
    ``paged_write``           the public op (picks kernel or reference; an opaque custom op under torch.compile);
    ``paged_write_ref``       the same in PyTorch indexing (the CPU path).

Why a kernel of its own: written as indexing inside a compiled decoding step, the store becomes part of an
Inductor kernel that mutates the pools, and Inductor saves and restores every mutated argument around each
config it times at the step's first call. For pools of tens of GB that is a copy through host memory per kernel
(minutes for a 760M model at 32k x 8). An opaque op keeps the pools out of Inductor's kernels; one launch per
layer writes all three pools, where PyTorch indexing takes a launch per pool and per cast.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import launch_cache


@triton.jit
def _paged_write_kernel(
    K, V, C, KP, VP, CP, TABLE, LENGTHS,
    skb, skt, skh, svb, svt, svh, scb, sct, stb, sth, Hkv, T,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, HAS_GATE: tl.constexpr,
):
    # grid (B * Hkv * T,): one token of one (sequence, kv head); one axis, as a prompt may pass 65,535 tokens
    pid = tl.program_id(0).to(tl.int64)
    t = pid % T
    b = pid // T // Hkv
    h = pid // T % Hkv
    pos = tl.load(LENGTHS + b) + t
    blk = tl.load(TABLE + b * stb + h * sth + pos // BLOCK_SIZE).to(tl.int64)
    slot = pos % BLOCK_SIZE
    d = tl.arange(0, BLOCK_D)
    dm = d < HEAD_DIM
    k = tl.load(K + b * skb + t * skt + h * skh + d, mask=dm)
    v = tl.load(V + b * svb + t * svt + h * svh + d, mask=dm)
    dst = (blk * BLOCK_SIZE + slot) * HEAD_DIM + d
    tl.store(KP + dst, k.to(KP.dtype.element_ty), mask=dm)
    tl.store(VP + dst, v.to(VP.dtype.element_ty), mask=dm)
    if HAS_GATE:
        g = tl.arange(0, BLOCK_G)
        gm = g < G
        c = tl.load(C + b * scb + t * sct + h * G + g, mask=gm)  # query heads h*G .. h*G+G-1
        tl.store(CP + (blk * G + g) * BLOCK_SIZE + slot, c, mask=gm)


def paged_write_launch(k_pool, v_pool, c_pool, table, lengths, k, v, c) -> None:
    """Launch ``_paged_write_kernel`` (arguments as ``paged_write``, already checked)."""
    B, T, Hkv, D = k.shape
    gated = c_pool is not None
    G = c_pool.shape[1] if gated else 1
    cp, cc = (c_pool, c) if gated else (k_pool, k)  # (dummy pointers when there is no gate)
    launch_cache.launch(_paged_write_kernel, (B * Hkv * T,),
        k, v, cc, k_pool, v_pool, cp, table, lengths,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        c.stride(0) if gated else 0, c.stride(1) if gated else 0, table.stride(0), table.stride(1), Hkv, T,
        G=G, HEAD_DIM=D, BLOCK_D=triton.next_power_of_2(D), BLOCK_G=triton.next_power_of_2(G),
        BLOCK_SIZE=k_pool.shape[1], HAS_GATE=gated, num_warps=1,
    )


@torch.library.custom_op("forgetting_transformer::paged_write", mutates_args=("k_pool", "v_pool", "c_pool"))
def paged_write_op(k_pool: torch.Tensor, v_pool: torch.Tensor, c_pool: Optional[torch.Tensor],
                   table: torch.Tensor, lengths: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   c: Optional[torch.Tensor]) -> None:
    """``paged_write_launch`` as a custom op, for traced calls."""
    paged_write_launch(k_pool, v_pool, c_pool, table, lengths, k, v, c)


@paged_write_op.register_fake
def _(k_pool, v_pool, c_pool, table, lengths, k, v, c) -> None:
    return None


def paged_write_ref(k_pool, v_pool, c_pool, table, lengths, k, v, c) -> None:
    """``paged_write`` with PyTorch indexing."""
    B, T, Hkv, _ = k.shape
    BS = k_pool.shape[1]
    pos = lengths[:, None] + torch.arange(T, device=k.device)  # (B, T)
    blocks = table.gather(2, (pos // BS)[:, None, :].expand(B, Hkv, T)).long()  # (B, Hkv, T)
    slots = (pos % BS)[:, None, :]  # (B, 1, T)
    k_pool[blocks, slots] = k.transpose(1, 2).to(k_pool.dtype)  # (B, Hkv, T, D)
    v_pool[blocks, slots] = v.transpose(1, 2).to(v_pool.dtype)
    if c_pool is not None:
        G = c_pool.shape[1]
        g = torch.arange(G, device=k.device)[None, None, :, None]
        c_pool[blocks[:, :, None, :], g, slots[:, :, None, :]] = c.view(B, T, Hkv, G).permute(0, 2, 3, 1)


def paged_write(k_pool: torch.Tensor, v_pool: torch.Tensor, c_pool: Optional[torch.Tensor], table: torch.Tensor,
                lengths: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: Optional[torch.Tensor] = None,
                backend: Optional[str] = None) -> None:
    """Write T new tokens per sequence after its ``lengths`` cached positions, in place.

    k_pool, v_pool: (n_blocks, BS, D) in the cache's dtype; c_pool: (n_blocks, G, BS) float64 or None.
    table: (B, Hkv, max_blocks) int32, the blocks of each (sequence, kv head), allocated up to the last position
        written. lengths: (B,) int64 positions already written per sequence.
    k, v: (B, T, Hkv, D), any float dtype (cast to the pools'); c: (B, T, H) float64, H = G * Hkv, or None (then
        c_pool must be None too).
    backend: None (the kernel on CUDA, the reference elsewhere), "triton" or "reference". Reads nothing back to
    the host, so a step that calls it can be captured in a CUDA graph.
    """
    if (c is None) != (c_pool is None):
        raise ValueError("c and c_pool go together: both tensors (a gated model) or both None")
    if backend not in (None, "triton", "reference"):
        raise ValueError(f"backend must be None, 'triton' or 'reference'; got {backend!r}")
    if backend == "reference" or (backend is None and not k.is_cuda):
        return paged_write_ref(k_pool, v_pool, c_pool, table, lengths, k, v, c)
    args = (k_pool, v_pool, c_pool, table.contiguous(), lengths.contiguous(), _last_dim_dense(k),
            _last_dim_dense(v), None if c is None else _last_dim_dense(c))
    # Under torch.compile one opaque op (the point of the kernel, see above); eager calls skip its dispatch.
    if torch.compiler.is_compiling():
        return paged_write_op(*args)
    return paged_write_launch(*args)


def _last_dim_dense(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()
