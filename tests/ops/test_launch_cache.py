"""The launch cache (``ops/launch_cache.py``): its key against triton's own specialisation of each argument (CPU;
triton's native specialiser runs without a GPU), and on a GPU its direct launches against triton's."""

import itertools

import pytest
import torch

from forgetting_transformer.ops import launch_cache


def _specialise(arg):
    """Triton's specialisation of one runtime argument, as its launcher computes it for a CUDA kernel."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    return native_specialize_impl(CUDABackend, arg, False, True, True)


def _descriptors():
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    from triton.tools.tensor_descriptor import TensorDescriptor

    out = []
    for dtype, block in ((torch.bfloat16, [64, 64]), (torch.bfloat16, [128, 64]), (torch.float16, [64, 64]),
                         (torch.float32, [64, 32])):
        gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[dtype]
        base = torch.empty(256, 64, dtype=dtype)
        for layout in (gl.NVMMASharedLayout.get_default_for(block, gdt),
                       gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=8 * base.element_size(),
                                            rank=2)):
            out.append(GluonDescriptor(base, [256, 64], [64, 1], block, layout))
        out.append(TensorDescriptor(base, [256, 64], [64, 1], block))
    return out


def _arguments():
    buf = torch.empty(64)
    ints = [0, 1, 2, 15, 16, 17, 32, -1, -16, -17, 2 ** 31 - 16, 2 ** 31 - 1, 2 ** 31, 2 ** 31 + 16, -2 ** 31,
            -2 ** 31 - 16, 2 ** 63 - 16, 2 ** 63, 2 ** 63 + 1, 2 ** 64 - 16]
    tensors = [buf, buf[1:], buf[4:], buf[2:], torch.empty(8, dtype=torch.bfloat16)[1:],
               torch.empty(16, dtype=torch.bfloat16), torch.empty(4, dtype=torch.int32),
               torch.empty(4, dtype=torch.int64), torch.empty(4, dtype=torch.float64), torch.nn.Parameter(buf[1:])]
    return ints + tensors + [0.5, 1.0, -2.0, True, False, None] + _descriptors()


def test_the_key_is_at_least_as_fine_as_tritons_specialisation():
    """Two arguments with the same key part specialise alike in triton: a kernel kept under a key is the kernel
    triton would pick. (The key splits further where that is cheaper, e.g. ints by int32 / int64 range.) It fails
    if the key drops a fact: the alignment of a tensor, an int's value 1 or divisibility by 16, its width, a
    descriptor's dtype, block or layout."""
    args = _arguments()
    keys = [launch_cache.arg_key(a) for a in args]
    specs = [_specialise(a) for a in args]
    for (ka, sa, a), (kb, sb, b) in itertools.combinations(zip(keys, specs, args), 2):
        if ka == kb:
            assert sa == sb, (a, b, ka, sa, sb)
    assert len(set(keys)) >= len(set(map(str, specs)))


@pytest.mark.parametrize("arg", [(1, 2), [1], "x", torch.float32, object()])
def test_arguments_the_key_does_not_cover_take_tritons_path(arg):
    with pytest.raises(launch_cache._Uncached):
        launch_cache.arg_key(arg)


def test_under_the_interpreter_every_launch_takes_tritons_path():
    """The interpreter's kernels are not ``JITFunction``s: ``launch`` runs them through triton and keeps nothing."""
    from forgetting_transformer.ops.forgetting_attention.triton import kernels as tk
    from forgetting_transformer.ops.forgetting_attention.triton import launch as TL

    if torch.cuda.is_available():
        pytest.skip("the interpreter runs only on machines without CUDA")
    lf = -torch.rand(1, 70, 2)
    before = dict(launch_cache._CACHE)
    pk, _ = TL.block_prefix(lf, 70, query_side=False)
    assert launch_cache._spec(tk._block_prefix_kernel) is None
    assert launch_cache._CACHE == before
    c = torch.cumsum(lf.double(), 1)  # (1, 70, 2): within the first 128-block, the block-local prefix sums
    assert torch.allclose(pk[3, :, :70].double(), c[0].T, atol=1e-5)


def test_aligned_bits_and_static_values():
    """``aligned``: one bit per tensor, 1 where its address is 16-byte aligned (a launcher's key part);
    ``static``: the first value built for a key, not built again."""
    buf = torch.empty(64)
    assert launch_cache.aligned(buf, buf[1:], buf[4:], buf[2:]) == 0b1010
    assert launch_cache.aligned() == 0
    built = []
    key = ("test static", object())
    for _ in range(3):
        assert launch_cache.static(key, lambda: built.append(1) or len(built)) == 1
    assert built == [1]


def test_keyed_launches_under_the_interpreter_take_tritons_path():
    """The interpreter's kernels are not ``JITFunction``s: a keyed launch runs through triton and keeps nothing."""
    from forgetting_transformer.ops.forgetting_attention.triton import launch as TL

    if torch.cuda.is_available():
        pytest.skip("the interpreter runs only on machines without CUDA")
    drow, dcol = torch.randn(1, 70, 2), torch.randn(1, 70, 2)
    before = (dict(launch_cache._CACHE), dict(launch_cache._KEYED))
    dlf = TL.bwd_dlogf(drow, dcol)
    assert (dict(launch_cache._CACHE), dict(launch_cache._KEYED)) == before
    want = (drow - dcol).double().flip(1).cumsum(1).flip(1)
    assert torch.allclose(dlf.double(), want, atol=1e-5)
