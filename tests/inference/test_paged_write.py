"""Writing new tokens into the paged cache: the Triton kernel (run by triton's interpreter on the CPU) and the
PyTorch reference against a loop over (sequence, token, kv head) that places each vector by hand; every other
pool slot must stay as it was."""

import pytest
import torch

from forgetting_transformer.ops.decode import paged_write


def setup(B, T, Hkv, G, D, BS, lengths, gated, seed=0):
    """Pools of NaN in shuffled block order, tables with room for lengths + T positions, new k, v, c."""
    gen = torch.Generator().manual_seed(seed)
    MB = -(-(max(lengths) + T) // BS)
    n_blocks = B * Hkv * MB + 2
    perm = torch.randperm(n_blocks, generator=gen)[: B * Hkv * MB].to(torch.int32)
    table = perm.view(B, Hkv, MB).clone()
    k_pool = torch.full((n_blocks, BS, D), float("nan"))
    v_pool = k_pool.clone()
    c_pool = torch.full((n_blocks, G, BS), float("nan"), dtype=torch.float64) if gated else None
    # k as a transposed view (strides not those of a contiguous (B, T, Hkv, D)), v in float64: the kernel casts
    k = torch.randn(B, Hkv, T, D, generator=gen).transpose(1, 2)
    v = torch.randn(B, T, Hkv, D, generator=gen, dtype=torch.float64)
    c = torch.randn(B, T, Hkv * G, generator=gen, dtype=torch.float64) if gated else None
    return k_pool, v_pool, c_pool, table, torch.tensor(lengths), k, v, c


def by_hand(k_pool, v_pool, c_pool, table, lengths, k, v, c):
    k_pool, v_pool = k_pool.clone(), v_pool.clone()
    c_pool = None if c_pool is None else c_pool.clone()
    B, T, Hkv, _ = k.shape
    BS = k_pool.shape[1]
    for b in range(B):
        for t in range(T):
            p = int(lengths[b]) + t
            for h in range(Hkv):
                blk = int(table[b, h, p // BS])
                k_pool[blk, p % BS] = k[b, t, h].float()
                v_pool[blk, p % BS] = v[b, t, h].float()
                if c_pool is not None:
                    G = c_pool.shape[1]
                    c_pool[blk, :, p % BS] = c[b, t, h * G:(h + 1) * G]
    return k_pool, v_pool, c_pool


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("B,T,Hkv,G,D,BS,lengths,gated", [
    (2, 1, 2, 2, 16, 16, [5, 15], True),        # one decoded token, one sequence at a block's last slot
    (3, 21, 1, 3, 24, 16, [0, 7, 16], True),    # a prompt chunk across blocks, MQA, D and G not powers of two
    (2, 4, 3, 1, 32, 32, [30, 2], False),       # no gate (a Transformer's cache)
])
def test_paged_write_places_every_token_and_nothing_else(backend, B, T, Hkv, G, D, BS, lengths, gated):
    args = setup(B, T, Hkv, G, D, BS, lengths, gated)
    want = by_hand(*args)
    paged_write(*args, backend=backend)
    for got, ref in zip(args[:3], want):
        if ref is not None:
            assert torch.equal(got.isnan(), ref.isnan())  # untouched slots stay NaN
            assert torch.equal(got.nan_to_num(), ref.nan_to_num())


def test_paged_write_bad_arguments():
    k_pool, v_pool, c_pool, table, lengths, k, v, c = setup(1, 1, 1, 1, 16, 16, [0], True)
    with pytest.raises(ValueError, match="c and c_pool go together"):
        paged_write(k_pool, v_pool, None, table, lengths, k, v, c)
    with pytest.raises(ValueError, match="backend must be None, 'triton' or 'reference'; got 'cuda'"):
        paged_write(k_pool, v_pool, c_pool, table, lengths, k, v, c, backend="cuda")
