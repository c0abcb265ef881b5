"""GPU tests of the launch cache (``ops/launch_cache.py``): direct launches compute what triton's own launches
compute, launch the kernel triton picks (``verify()``, on for every GPU test by ``tests/conftest.py``), and a
change in any specialised fact (alignment, an int's value 1 or divisibility by 16, dtype, constexpr) reaches a
new kernel."""

import pytest
import torch

from forgetting_transformer.ops.forgetting_attention import AttentionOptions, forgetting_attention
from forgetting_transformer.ops import launch_cache

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (direct launches)"),
]


def _axpy_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def axpy(x, y, out, n, alpha, stride, BLOCK: tl.constexpr, SQUARE: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        a = tl.load(x + i * stride, mask=i < n).to(tl.float32)
        if SQUARE:
            a = a * a
        b = tl.load(y + i * stride, mask=i < n).to(tl.float32)
        tl.store(out + i * stride, (alpha * a + b).to(out.dtype.element_ty), mask=i < n)

    return axpy


def test_direct_launches_compute_what_tritons_launches_compute():
    """The same kernel launched over arguments whose specialisation differs one fact at a time (a misaligned
    view, n = 1 / 16 / 17, stride 1 / 2, another dtype, a constexpr): every launch is right against PyTorch, the
    repeats are direct launches, and each is the kernel triton picks (``verify``)."""
    axpy = _axpy_kernel()
    buf = torch.randn(3, 4099, device="cuda")
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        for offset in (0, 1, 4):
            for n in (1, 16, 17, 1000):
                for stride in (1, 2):
                    for square in (False, True):
                        cases.append((dtype, offset, n, stride, square))
    with launch_cache.verify() as counts:
        for repeat in range(2):
            for dtype, offset, n, stride, square in cases:
                x, y = (buf[r].to(dtype)[offset:] for r in (0, 1))
                out = torch.zeros_like(y)
                launch_cache.launch(axpy, (-(-n // 128),), x, y, out, n, 0.5, stride, BLOCK=128, SQUARE=square)
                a = x[: n * stride: stride].float()
                want = 0.5 * (a * a if square else a) + y[: n * stride: stride].float()
                got = out[: n * stride: stride].float()
                assert torch.allclose(got, want.to(dtype).float(), rtol=0, atol=0), (repeat, dtype, offset, n)
    # every repeat launched directly, and so did the first pass's launches of a specialisation seen before in it
    assert len(cases) <= counts["direct"] < 2 * len(cases)


@pytest.mark.parametrize("gluon", [True, False])
@pytest.mark.parametrize("acp", [False, True])
def test_the_ops_repeated_calls_launch_directly_and_compute_the_same(gluon, acp):
    """A deterministic forward + backward called twice (the second through direct launches only): bitwise the
    same outputs and gradients, and direct launches happened."""
    torch.manual_seed(0)
    B, T, H, D = 2, 1031, 4, 64
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    lf = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda") + 3).requires_grad_()
    options = AttentionOptions(gluon=gluon, deterministic=True)
    do = torch.randn_like(q)
    runs = []
    with launch_cache.verify() as counts:
        for _ in range(2):
            o = forgetting_attention(q, k, v, lf, adaptive_threshold=-8.0 if acp else None, options=options)
            runs.append((o, *torch.autograd.grad(o, (q, k, v, lf), do)))
    assert counts["direct"] >= 5
    for first, second in zip(*runs):
        assert torch.equal(first, second)


def test_keyed_launches_are_direct_and_a_key_that_misses_a_fact_is_caught():
    """``launch_keyed``: repeats under a launcher's key launch directly and compute what triton's launches do; a
    key that leaves out a fact triton specialises on (here a tensor's alignment) finds a kernel the full key does
    not, which ``verify()`` reports instead of launching it."""
    axpy = _axpy_kernel()
    buf = torch.randn(2, 4099, device="cuda")
    n = 1000

    def call(key, offset):
        x, y = buf[0][offset:], buf[1][offset:]
        out = torch.zeros_like(y)
        launch_cache.launch_keyed(key, axpy, (-(-n // 128),), x, y, out, n, 0.5, 1, BLOCK=128, SQUARE=False)
        assert torch.equal(out[:n], 0.5 * x[:n] + y[:n])

    with launch_cache.verify() as counts:
        for offset in (0, 1, 0, 1):
            call(("axpy", launch_cache.aligned(buf[0][offset:], buf[1][offset:])), offset)
        assert counts["direct"] == 2
        call(("axpy, alignment left out",), 0)
        with pytest.raises(AssertionError, match="misses a fact"):
            call(("axpy, alignment left out",), 1)
    call(("axpy", launch_cache.aligned(buf[0], buf[1])), 0)  # (outside verify: the direct path)
    assert launch_cache.aligned(buf[0], buf[0][1:], buf[0][4:]) == 0b101
