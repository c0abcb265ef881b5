"""GPU tests of decoding: the decode kernel in bf16 at model sizes against its float64 reference, the cache-write
kernel against PyTorch indexing at model sizes, and generate() with CUDA graph replay against eager steps, with
and without ACP eviction.

Run on a GPU machine: ``python -m pytest -m gpu tests/inference -q``.
"""

import pytest
import torch
import torch.nn.functional as F

from inference_models import LOCAL, VARIANTS, tiny
from test_decode_kernel import paged
from forgetting_transformer.inference import generate
from forgetting_transformer.ops.decode import forgetting_attention_decode, forgetting_attention_decode_ref
from forgetting_transformer.ops.decode import paged_write, paged_write_ref

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (kernel and graphs on hardware)"),
]


@pytest.mark.parametrize("B, Tq, H, Hkv, D, S", [(4, 1, 12, 12, 64, 3000), (8, 1, 16, 4, 128, 1100),
                                                 (2, 4, 8, 2, 64, 700)])
def test_decode_kernel_bf16_matches_float64_reference(B, Tq, H, Hkv, D, S):
    torch.manual_seed(0)
    lengths = torch.randint(S // 2, S + 1, (B,))
    lengths[0] = S
    k, v = torch.randn(B, S, Hkv, D), torch.randn(B, S, Hkv, D)
    c = torch.cumsum(F.logsigmoid(torch.randn(B, S, H, dtype=torch.float64) + 4.0), dim=1)
    key_start = torch.randint(0, S // 4, (B, H))
    k_pool, v_pool, c_pool, table = paged(k, v, c, lengths, key_start, 64, seed=1)
    c_q = torch.stack([c[b, int(lengths[b]) - Tq:int(lengths[b])] for b in range(B)])
    args = [t.cuda() for t in (k_pool.nan_to_num(), v_pool.nan_to_num(), table, lengths, key_start)]
    q = torch.randn(B, Tq, H, D, device="cuda")
    want = forgetting_attention_decode_ref(q.double(), args[0].double(), args[1].double(), *args[2:],
                                           c_q=c_q.cuda(), c_pool=c_pool.nan_to_num().cuda())
    got = forgetting_attention_decode(q.bfloat16(), args[0].bfloat16(), args[1].bfloat16(), *args[2:],
                                      c_q=c_q.cuda(), c_pool=c_pool.nan_to_num().cuda())
    rel = (got.double() - want).norm() / want.norm()
    assert rel < 1e-2, rel


@pytest.mark.parametrize("B, T, Hkv, G, D, BS", [
    (8, 2100, 4, 3, 128, 64),   # a prompt chunk of a GQA model over many blocks, ragged lengths
    (8, 1, 12, 1, 64, 256),     # one decoded token per sequence, 12 kv heads (125M)
    (1, 70000, 1, 2, 64, 128),  # more programs than a grid's second axis allows (65,535)
])
def test_paged_write_kernel_matches_indexing_at_model_sizes(B, T, Hkv, G, D, BS):
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 3 * BS, (B,), generator=gen)
    n_per_row = -(-(int(lengths.max()) + T) // BS)
    n_blocks = B * Hkv * n_per_row + 3
    table = torch.randperm(n_blocks, generator=gen)[: B * Hkv * n_per_row].to(torch.int32).view(B, Hkv, n_per_row)
    pools = [torch.full((n_blocks, BS, D), float("nan"), dtype=torch.bfloat16),
             torch.full((n_blocks, BS, D), float("nan"), dtype=torch.bfloat16),
             torch.full((n_blocks, G, BS), float("nan"), dtype=torch.float64)]
    k = torch.randn(B, T, Hkv, D, generator=gen)  # float32: cast to the pools' bf16 on the way
    v = torch.randn(B, Hkv, T, D, generator=gen).transpose(1, 2)  # strides not those of a contiguous tensor
    c = torch.randn(B, T, Hkv * G, generator=gen, dtype=torch.float64)
    pools = [t.cuda() for t in pools]
    table, lengths, k, v, c = (t.cuda() for t in (table, lengths, k, v, c))
    want = [p.clone() for p in pools]
    paged_write_ref(*want, table, lengths, k, v, c)
    paged_write(*pools, table, lengths, k, v, c)  # the default on CUDA: the Triton kernel
    for got, ref in zip(pools, want):
        assert torch.equal(got.isnan(), ref.isnan())  # every slot written, nothing else touched
        assert torch.equal(got.nan_to_num(), ref.nan_to_num())


@pytest.mark.parametrize("name, eviction", [("fox_pro_rope_gqa", False), ("transformer_pro_gqa", False),
                                            ("local", True)])
def test_graph_replay_generates_what_eager_steps_generate(name, eviction):
    model = tiny(LOCAL if name == "local" else VARIANTS[name], dtype=torch.bfloat16).cuda()
    prompts = [torch.randint(1, 97, (n,)) for n in (40, 7, 23)]
    kw = dict(max_new_tokens=150, block_size=16, output_logits=True, acp_eviction=eviction)
    eager = generate(model, prompts, cuda_graph=False, **kw)
    graph = generate(model, prompts, cuda_graph=True, **kw)
    assert torch.equal(graph.sequences, eager.sequences)
    # the same kernels, though cuBLAS may choose other algorithms under capture
    torch.testing.assert_close(graph.logits, eager.logits, rtol=2e-2, atol=2e-2)
    if eviction:
        assert (graph.stats["kept"] < graph.stats["tokens"][None, :, None]).all()
