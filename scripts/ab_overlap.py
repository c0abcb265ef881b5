"""Session-8 experiment (reverted after this commit): A/B of three software-pipelining variants of the kernels,
selected by env flags FOX_DEFER_PV (fwd: P V one block late), FOX_DEFER_DQ (dq: dS K one block late),
FOX_DP_FIRST (dk/dv: dP^T before the dv MMA). Each variant is autotuned on its own; medians of interleaved rounds.

    python scripts/ab_overlap.py S4,S1,S3,S2 3
"""
import os, sys, time
sys.path.insert(0, "scripts"); sys.path.insert(0, ".")
import torch, triton
import bench_attention as ba
import importlib
fa = importlib.import_module("forgetting_transformer.ops.forgetting_attention")
combos = [("base", "000"), ("fwdPV", "100"), ("dq", "010"), ("dkdv", "001")]
shapes = sys.argv[1].split(",")
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
ours = ba.method_ours()
for sname in shapes:
    B, T, H, D = ba.SHAPES[sname]
    inputs = ba.make_inputs(B, T, H, D)
    ff = ba.flops_fwd(B, T, H, D)
    res = {n: [] for n, _ in combos}
    for r in range(rounds):
        for name, bits in combos:
            os.environ["FOX_DEFER_PV"], os.environ["FOX_DEFER_DQ"], os.environ["FOX_DP_FIRST"] = bits
            if r == 0:
                for kern in fa._KERNELS.values():
                    getattr(kern, "cache", {}).clear()
            f = ba.bench(ours, inputs, False); b = ba.bench(ours, inputs, True)
            res[name].append((f, b))
    picks = {k[0]: (dict(k[2]).get("DEFER_PV"), dict(k[2]).get("DEFER_MMA"), dict(k[2]).get("DP_FIRST"), v.kwargs, v.num_warps) for k, v in fa._TUNED.items() if k[1][0] == triton.next_power_of_2(T)}
    for name, _ in combos:
        fs = sorted(x[0] for x in res[name]); bs = sorted(x[1] for x in res[name])
        f, b = fs[len(fs) // 2], bs[len(bs) // 2]
        print(f"{sname} {name:6s} fwd {f:.3f} ms ({ff/f/1e9:.0f} TF) fwd+bwd {b:.3f} ms ({3.5*ff/b/1e9:.0f} TF) bwd {b-f:.3f}  all fwd {[round(x,3) for x in fs]} fwd+bwd {[round(x,3) for x in bs]}", flush=True)
    for k, v in fa._TUNED.items():
        if k[1][0] == triton.next_power_of_2(T):
            print("   pick", k[0], {a: b for a, b in k[2] if a in ("DEFER_PV", "DEFER_MMA", "DP_FIRST")}, v.kwargs, v.num_warps, v.num_stages)
