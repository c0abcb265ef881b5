"""The decode kernel (Triton, run by triton's interpreter on the CPU in fp32) and its float64 reference against
attention written out per (sequence, head, query) on dense tensors: one and several query tokens, GQA / MQA,
sequences of different lengths, per-head first keys, blocks in shuffled pool order, keys split over programs."""

import math

import pytest
import torch
import torch.nn.functional as F

from forgetting_transformer.ops.decode import forgetting_attention_decode, forgetting_attention_decode_ref


def dense_attention(q, k, v, c, lengths, key_start, sm_scale):
    """o[b, t, h] over keys key_start[b, h] .. lengths[b] - Tq + t of dense k, v (B, S, Hkv, D) and c (B, S, H),
    one softmax at a time in float64."""
    B, Tq, H, D = q.shape
    G = H // k.shape[2]
    o = torch.zeros(B, Tq, H, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for t in range(Tq):
                i = int(lengths[b]) - Tq + t
                if i < int(key_start[b, h]):
                    continue
                js = torch.arange(int(key_start[b, h]), i + 1)
                s = (k[b, js, h // G].double() @ q[b, t, h].double()) * sm_scale
                if c is not None:
                    s = s + c[b, i, h] - c[b, js, h]
                o[b, t, h] = torch.softmax(s, 0) @ v[b, js, h // G].double()
    return o


def paged(k, v, c, lengths, key_start, block_size, seed):
    """Dense (B, S, Hkv, D) keys / values and (B, S, H) cumulative gates as pool blocks in shuffled order, plus
    the block table. Blocks wholly before a kv head's first visible key are left out (table -1); pool slots not
    holding a live key are NaN, so reading one would show."""
    B, S, Hkv, D = k.shape
    H = c.shape[2] if c is not None else key_start.shape[1]
    G = H // Hkv
    MB = -(-S // block_size)
    n_blocks = B * Hkv * MB + 3  # a few blocks nobody owns
    perm = torch.randperm(n_blocks, generator=torch.Generator().manual_seed(seed))
    k_pool = torch.full((n_blocks, block_size, D), float("nan"), dtype=k.dtype)
    v_pool, c_pool = k_pool.clone(), torch.full((n_blocks, G, block_size), float("nan"), dtype=torch.float64)
    table = torch.full((B, Hkv, MB), -1, dtype=torch.int32)
    nxt = 0
    for b in range(B):
        for hk in range(Hkv):
            first = int(key_start[b, hk * G:(hk + 1) * G].min())
            for i in range(first // block_size, -(-int(lengths[b]) // block_size)):
                p = int(perm[nxt])
                nxt += 1
                table[b, hk, i] = p
                lo, hi = max(i * block_size, first), min((i + 1) * block_size, int(lengths[b]))
                sl = slice(lo - i * block_size, hi - i * block_size)
                k_pool[p, sl], v_pool[p, sl] = k[b, lo:hi, hk], v[b, lo:hi, hk]
                if c is not None:
                    c_pool[p, :, sl] = c[b, lo:hi, hk * G:(hk + 1) * G].T.double()
    return k_pool, v_pool, (c_pool if c is not None else None), table


CASES = {
    # B, Tq, H, Hkv, D, lengths, gated, num_splits
    "one_token_gqa_ragged": (3, 1, 4, 2, 16, [37, 5, 20], True, 3),
    "three_tokens_mha_odd_head_dim": (2, 3, 2, 2, 12, [33, 18], True, 2),
    "mqa_softmax_two_tokens": (2, 2, 4, 1, 16, [16, 40], False, 4),
    "chunk_of_twenty_two_query_tiles": (1, 20, 4, 1, 16, [45], True, 2),
}


@pytest.mark.parametrize("name", CASES)
def test_decode_kernel_and_reference_equal_dense_attention(name):
    B, Tq, H, Hkv, D, lengths, gated, splits = CASES[name]
    torch.manual_seed(0)
    S = max(lengths)
    lengths = torch.tensor(lengths)
    k, v = torch.randn(B, S, Hkv, D), torch.randn(B, S, Hkv, D)
    q = torch.randn(B, Tq, H, D)
    c = torch.cumsum(F.logsigmoid(torch.randn(B, S, H, dtype=torch.float64) + 2.0), dim=1) if gated else None
    # first visible keys: left padding of row 0, per-head eviction starts elsewhere, one head seeing only its
    # newest key
    key_start = torch.zeros(B, H, dtype=torch.int64)
    key_start[0] = 3
    key_start[-1, 0] = int(lengths[-1]) - 1
    key_start[-1, -1] = 17
    k_pool, v_pool, c_pool, table = paged(k, v, c, lengths, key_start, 16, seed=1)
    c_q = None
    if gated:
        c_q = torch.stack([c[b, int(lengths[b]) - Tq:int(lengths[b])] for b in range(B)])  # (B, Tq, H)
    want = dense_attention(q, k, v, c, lengths, key_start, 1 / math.sqrt(D))
    kw = dict(c_q=c_q, c_pool=c_pool)
    ref = forgetting_attention_decode_ref(q.double(), k_pool.double(), v_pool.double(), table, lengths, key_start,
                                          **kw)
    torch.testing.assert_close(ref, want, rtol=1e-10, atol=1e-12)
    got = forgetting_attention_decode(q, k_pool, v_pool, table, lengths, key_start, backend="triton",
                                      num_splits=splits, **kw)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # the CPU default is the reference, in the input dtype
    torch.testing.assert_close(forgetting_attention_decode(q, k_pool, v_pool, table, lengths, key_start, **kw),
                               want.float(), rtol=1e-5, atol=1e-5)


def test_decode_query_with_nothing_visible_gives_zero():
    q, k_pool = torch.randn(1, 1, 1, 16), torch.randn(2, 16, 16)
    table, lengths = torch.tensor([[[0, 1]]], dtype=torch.int32), torch.tensor([20])
    for backend in ("triton", "reference"):
        o = forgetting_attention_decode(q, k_pool, k_pool, table, lengths, torch.tensor([[20]]), backend=backend)
        assert torch.equal(o, torch.zeros_like(q)), backend


@pytest.mark.parametrize("change, match", [
    (dict(q=torch.zeros(1, 1, 2, 8)), r"k_pool and v_pool must both be \(n_blocks, block_size, D=8\)"),
    (dict(k_pool=torch.zeros(2, 12, 16), v_pool=torch.zeros(2, 12, 16)), "block_size .* power of two >= 16"),
    (dict(key_start=torch.zeros(1, 3, dtype=torch.int64)), r"key_start must be \(B, H\) = \(1, 2\)"),
    (dict(lengths=torch.tensor([4, 4])), r"lengths must be \(B,\) = \(1,\)"),
    (dict(c_q=torch.zeros(1, 1, 2, dtype=torch.float64)), "pass both c_q and c_pool"),
    (dict(c_q=torch.zeros(1, 1, 2), c_pool=torch.zeros(2, 2, 16)), "must be float64"),
    (dict(block_table=torch.zeros(1, 3, 2, dtype=torch.int32)), r"block_table must be \(B=1, Hkv, max_blocks\)"),
    (dict(backend="cuda"), "backend must be None, 'triton' or 'reference'"),
])
def test_decode_bad_arguments_are_named(change, match):
    args = dict(q=torch.zeros(1, 1, 2, 16), k_pool=torch.zeros(2, 16, 16), v_pool=torch.zeros(2, 16, 16),
                block_table=torch.zeros(1, 1, 2, dtype=torch.int32), lengths=torch.tensor([4]),
                key_start=torch.zeros(1, 2, dtype=torch.int64))
    args.update(change)
    with pytest.raises(ValueError, match=match):
        forgetting_attention_decode(**args)
