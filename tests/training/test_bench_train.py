"""scripts/bench_train.py's SDPA pin, its ratio column and its kernel groups (the rest of the script needs a GPU:
docs/benchmarks.md)."""


import pytest
import torch

from tests.script_modules import load_script

bench_train = load_script("bench_train")
_pin_sdpa, _sdpa_choice = bench_train._pin_sdpa, bench_train._sdpa_choice

FLAGS = ("flash_sdp_enabled", "cudnn_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled")


@pytest.fixture
def restore_sdpa_flags():
    saved = {f: getattr(torch.backends.cuda, f)() for f in FLAGS}
    yield
    for f, on in saved.items():
        getattr(torch.backends.cuda, "enable_" + f.removesuffix("_enabled"))(on)


def test_pin_leaves_only_the_named_backend(restore_sdpa_flags):
    before = {f: getattr(torch.backends.cuda, f)() for f in FLAGS}
    _pin_sdpa("default")
    assert {f: getattr(torch.backends.cuda, f)() for f in FLAGS} == before
    _pin_sdpa("flash")
    assert [getattr(torch.backends.cuda, f)() for f in FLAGS] == [True, False, False, False]
    assert _sdpa_choice(1, 2, 64, 16, "cpu") == "flash_attention"  # what the dispatcher picks, by name
    _pin_sdpa("cudnn")
    assert [getattr(torch.backends.cuda, f)() for f in FLAGS] == [False, True, False, False]
    with pytest.raises(ValueError, match="--sdpa='flex'"):
        _pin_sdpa("flex")


def test_each_model_is_compared_with_the_transformer_of_its_flavour_and_size():
    rows = [{"model": m, "size": z, "tok_s": t} for m, z, t in (
        ("fox_pro", "125m", 90.0), ("transformer_pro", "125m", 100.0), ("fox_llama", "125m", 80.0),
        ("fox_pro", "760m", 30.0), ("transformer_pro", "760m", 40.0), ("path_fox_pro", "760m", 10.0))]
    assert bench_train.against_transformer(rows) == ["0.900×", "–", "–", "0.750×", "–", "0.250×"]


def test_kernels_fall_into_groups_by_name_and_the_table_sums_them():
    names = {"fox_fwd_sm90_kernel": "Forgetting Attention", "_attn_bwd_dkdv_kernel": "Forgetting Attention",
             "_acp_tables_kernel": "Forgetting Attention", "flash_fwd_kernel": "SDPA attention",
             "cudnn_generated_fort_native_sdpa_sm90": "SDPA attention", "nvjet_tst_128x256_64x4": "GEMM",
             "sm90_xmma_gemm_bf16bf16_bf16f32": "GEMM", "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0":
             "Inductor fused (norms, gates, elementwise)", "multi_tensor_apply_kernel": "optimizer",
             "void at::native::vectorized_elementwise_kernel<4>": "eager elementwise and reductions",
             "Memcpy DtoD (Device -> Device)": "other"}
    assert {n: bench_train.kernel_group(n) for n in names} == names
    text = bench_train.group_table([("fox_fwd_sm90_kernel", 3000.0), ("_attn_bwd_dq_kernel", 1000.0),
                                    ("nvjet_tst", 5000.0), ("Memcpy", 1000.0)])
    lines = text.splitlines()
    assert lines[2] == "| GEMM | 5.00 | 50.0% | 1 |" and lines[3] == "| Forgetting Attention | 4.00 | 40.0% | 2 |"
    assert lines[4] == "| other | 1.00 | 10.0% | 1 |"
