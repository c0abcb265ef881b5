"""Where the one-kernel backward's time goes (session 14, reverted with it): text-substituted variants of
gluon_kernels.py timed at S1 / S2 (GPU only; the ablated results are wrong). `noswz`: the fp32 dq staging tile
unswizzled."""
import importlib, importlib.util, os, sys, tempfile
import torch, triton
import torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forgetting_transformer.ops as ops
from triton.experimental.gluon import language as gl
fa = importlib.import_module("forgetting_transformer.ops.forgetting_attention")
orig = None
SRC = os.path.join(os.path.dirname(fa.__file__), "gluon_kernels.py")
V = {
    "base": [],
    "noreduce": [('        _tma_reduce_add(dq_desc, [dq_row, h * HEAD_DIM], dq_s)\n        _tma_reduce_add(rs_desc, [dq_row, h * 8], rs_s)', '')],
    "noswz": [],
}
tmp = tempfile.mkdtemp()
def load(name):
    src = open(SRC).read()
    for a, b in V[name]:
        assert a in src, (name, a)
        src = src.replace(a, b)
    path = os.path.join(tmp, f"gk_{name}.py"); open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"gk_{name}", path); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m
SH = {"S1": (4, 4096, 16, 64), "S2": (1, 16384, 16, 64)}
cfgs = [(64, 64, 2, 2)]
orig = fa._smem_layout
for sname, (B, T, H, D) in SH.items():
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", generator=g).bfloat16() for _ in range(3))
    lf = F.logsigmoid(torch.randn(B, T, H, device="cuda", generator=g) + 3)
    sm = D ** -0.5
    o, lse = fa._fwd_launch(q, k, v, lf, None, sm)
    do = torch.randn_like(q)
    pk, pq = fa._block_prefix(lf, T)
    _, _, delta = fa._bwd_dq(do, q, k, v, lf, pk, o, lse, None, sm)
    row = [sname]
    t = triton.testing.do_bench(lambda: fa._bwd_dkdv_sm90(do, q, k, v, lf, pq, lse, delta, sm, (64, 64, 2, 2)), return_mode="median")
    row.append(f"dkdv(64,64,2,2) {t:.3f}")
    t = triton.testing.do_bench(lambda: fa._bwd_dq_sm90(do, q, k, v, lf, pk, o, lse, sm), return_mode="median")
    row.append(f"dq {t:.3f}")
    from triton.experimental.gluon import language as gl
    for name in V:
        fa._smem_layout = (lambda blk, dt: gl.NVMMASharedLayout(0, 32, rank=2) if dt == torch.float32 and len(blk) == 2
                           else orig(blk, dt)) if name == "noswz" else orig
        m = load(name)
        ops.gluon_kernels = m; sys.modules["forgetting_transformer.ops.gluon_kernels"] = m
        t = triton.testing.do_bench(lambda: fa._bwd_dkdv_sm90(do, q, k, v, lf, pq, lse, delta, sm, (64, 64, 2, 2), fused=True), return_mode="median")
        row.append(f"{name} {t:.3f}")
    print(" | ".join(row), flush=True)
