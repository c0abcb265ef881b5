"""What every attention tool shares: the benchmark shapes, their inputs, the timers and the profiler.

Shapes (B, T, H, D): S1 (4, 4096, 16, 64), S2 (1, 16384, 16, 64), S3 (2, 8192, 8, 128), S4 (1, 32768, 8, 128),
and ``tiny`` (1, 128, 2, 16) for runs on the CPU. Inputs: bf16 q / k / v from N(0, 1), log f = logsigmoid(N(4,
1)) (``make_inputs``); ACP's inputs (``acp_inputs``) have QK-normed q / k and local heads (log f = -1.3) and
global ones (-1e-4) in the mix ``HEAD_MIXES`` names. FLOPs follow FlashAttention's convention: forward
4·B·H·T²·D/2 (causal), forward + backward 3.5x that.

Timers (GPU): ``bench`` (eager calls, median of ``triton.testing.do_bench``, which flushes L2 before each),
``bench_graph`` (the same call replayed from a CUDA graph: GPU time without the host's launch cost) and
``host_times`` (host microseconds per call, the GPU not waited for). On the CPU, ``cpu_time``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = {  # name: (B, T, H, D)
    "S1": (4, 4096, 16, 64),
    "S2": (1, 16384, 16, 64),
    "S3": (2, 8192, 8, 128),
    "S4": (1, 32768, 8, 128),
    "T1": (16, 4096, 12, 64),  # the 125M model's training step: micro-batch 16 at 4k, 12 heads of 64
}
TINY = (1, 128, 2, 16)

# ACP's head mixes: the number of local heads among H (the benchmark's is "mixed")
HEAD_MIXES = {"mixed": lambda H: H // 2, "all_local": lambda H: H, "all_global": lambda H: 0}


def shape(name: str) -> tuple[int, int, int, int]:
    """(B, T, H, D) of a shape name (S1..S4, tiny); an unknown name is an error naming it."""
    if name == "tiny":
        return TINY
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r} ({', '.join(SHAPES)}, tiny)")
    return SHAPES[name]


def shapes_arg(text: str) -> list[str]:
    """A comma list of shape names (argparse type)."""
    names = [s for s in text.split(",") if s]
    for s in names:
        try:
            shape(s)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return names


def rounds_arg(text: str) -> int:
    """A number of timing rounds (argparse type): an int >= 1, else an error naming the value."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"rounds must be >= 1; got {n}")
    return n


def flops_fwd(B, T, H, D):
    return 4 * B * H * T * T * D / 2


def environment() -> str:
    """Device, torch, triton and Python versions, for a table's header."""
    import triton

    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (PyTorch reference)"
    return (f"device: {dev}; torch {torch.__version__}; triton {triton.__version__}; "
            f"python {sys.version.split()[0]}")


def make_inputs(B, T, H, D, dtype=torch.bfloat16, seed=0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, T, H, D, device=device, dtype=dtype, generator=g)
    k = torch.randn(B, T, H, D, device=device, dtype=dtype, generator=g)
    v = torch.randn(B, T, H, D, device=device, dtype=dtype, generator=g)
    lf = F.logsigmoid(torch.randn(B, T, H, device=device, generator=g) + 4.0).float()
    return q, k, v, lf


def acp_inputs(B, T, H, D, local_heads, dtype=torch.bfloat16, device="cuda"):
    """ACP's inputs: q / k QK-normed (RMSNorm with unit weights, returned as ``w``), log f = -1.3 for the first
    ``local_heads`` heads (local) and -1e-4 for the others (global). Returns (q, k, v, lf), w."""
    q, k, v, _ = make_inputs(B, T, H, D, dtype=dtype, device=device)
    q = (F.normalize(q.float(), dim=-1) * D ** 0.5).to(dtype)
    k = (F.normalize(k.float(), dim=-1) * D ** 0.5).to(dtype)
    lf = torch.full((B, T, H), -1e-4, device=device)
    lf[..., :local_heads] = -1.3
    return (q, k, v, lf), torch.ones(D, device=device)


def dense_op():
    """The op, dense: ``fn(q, k, v, lf)``."""
    from forgetting_transformer.ops.forgetting_attention import forgetting_attention

    return forgetting_attention


def acp_op(w, **kwargs):
    """The op with ACP as the benchmark calls it: threshold "auto" (eps = e^-10) from the QK-norm weights ``w``
    that ``acp_inputs`` returns, plus ``kwargs`` (e.g. ``return_stats=True``); ``fn(q, k, v, lf)``."""
    from forgetting_transformer.ops.forgetting_attention import forgetting_attention

    return lambda q, k, v, lf: forgetting_attention(q, k, v, lf, adaptive_threshold="auto", qk_norm_weights=(w, w),
                                                    **kwargs)


def case_inputs(case, B, T, H, D, heads="mixed", dtype=torch.bfloat16, device="cuda"):
    """(fn, inputs) of a timed case: "dense" (``make_inputs``, the op) or "acp" (``acp_inputs`` with the head mix
    ``heads``, ``acp_op``)."""
    if case == "dense":
        return dense_op(), make_inputs(B, T, H, D, dtype=dtype, device=device)
    inputs, w = acp_inputs(B, T, H, D, HEAD_MIXES[heads](H), dtype=dtype, device=device)
    return acp_op(w), inputs


def bench(fn, inputs, backward):
    """Milliseconds per eager call of ``fn`` (fwd, or fwd + the four gradients), median of do_bench."""
    import triton

    q, k, v, lf = inputs
    if backward:
        q, k, v, lf = (t.detach().requires_grad_() for t in (q, k, v, lf))
        do = torch.randn_like(q)

        def run():
            o = fn(q, k, v, lf)
            o.backward(do)
            q.grad = k.grad = v.grad = lf.grad = None
    else:

        def run():
            with torch.no_grad():
                fn(q, k, v, lf)

    run()
    torch.cuda.synchronize()
    return triton.testing.do_bench(run, warmup=100, rep=400, return_mode="median")


def make_step(fn, inputs, backward, seed=1):
    """A closure making one call of ``fn`` on detached copies of ``inputs`` (q, k, v, lf): the forward under
    ``no_grad``, or (``backward``) the forward and the four gradients for a fixed do (``seed``)."""
    q, k, v, lf = (t.detach().requires_grad_(backward) for t in inputs)
    g = torch.Generator(device=q.device).manual_seed(seed)
    do = torch.randn(q.shape, device=q.device, generator=g).to(q.dtype)

    def step():
        if backward:
            return torch.autograd.grad(fn(q, k, v, lf), (q, k, v, lf), do)
        with torch.no_grad():
            return fn(q, k, v, lf)

    return step


def outputs(fn, inputs, seed=1):
    """(o, dq, dk, dv, d log f) of one call of ``fn`` on ``inputs`` with a fixed do (``seed``)."""
    q, k, v, lf = (t.detach().requires_grad_() for t in inputs)
    o = fn(q, k, v, lf)
    g = torch.Generator(device=q.device).manual_seed(seed)
    do = torch.randn(o.shape, device=q.device, generator=g).to(o.dtype)
    return (o.detach(), *torch.autograd.grad(o, (q, k, v, lf), do))


def capture_graph(step):
    """``step()`` captured in a CUDA graph; the first calls (autotuning, compiles) run before, outside the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def replay_time(graph):
    """GPU time (ms) of one replay of a captured CUDA ``graph`` (median of do_bench, which flushes L2 before each)."""
    import triton

    return triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")


def graph_time(step):
    """GPU time (ms) of ``step()`` replayed from a CUDA graph (``capture_graph``, ``replay_time``)."""
    return replay_time(capture_graph(step))


def bench_graph(fn, inputs, backward):
    """GPU time (ms) of one call of ``fn`` (fwd, or fwd + the four gradients) replayed from a CUDA graph: the same
    kernels as ``bench`` without the host-side launch cost (Python, autotuner dispatch, autograd)."""
    return graph_time(make_step(fn, inputs, backward))


def host_times(step, n=10, reps=15, warmup=3):
    """Host microseconds per call of ``step()``, one value per timing of ``n`` back-to-back calls (the GPU not
    waited for within a timing; synchronised before and after it), ``reps`` timings after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        ts.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return ts


def cpu_time(step, reps=5):
    """Milliseconds per call of ``step()`` on the CPU (median of ``reps`` after one warm-up call)."""
    step()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def profiled(fn, inputs, cpu=True):
    """torch.profiler's record of one forward+backward call of ``fn`` on ``inputs``, after three unrecorded calls
    (compiles, autotuning); ``cpu``: record the host-side ops too."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    q, k, v, lf = (t.detach().requires_grad_() for t in inputs)
    do = torch.randn_like(q)
    for _ in range(3):
        fn(q, k, v, lf).backward(do)
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CPU] * cpu + [ProfilerActivity.CUDA]) as prof:
        fn(q, k, v, lf).backward(do)
        torch.cuda.synchronize()
    return prof


def kernel_us(fn, inputs):
    """GPU microseconds per kernel name (summed) of one fwd+bwd call of ``fn`` (torch.profiler)."""
    prof = profiled(fn, inputs, cpu=False)
    out: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name] = out.get(e.name, 0.0) + e.time_range.elapsed_us()
    return out


def print_profile(fn, inputs, title):
    """Print the GPU kernels of one forward+backward call of ``fn`` (torch.profiler), largest first, then in
    launch order with their times."""
    prof = profiled(fn, inputs)
    print(f"--- profile: {title}", flush=True)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60), flush=True)
    gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print("kernels in order: " + " | ".join(f"{e.name[:28]} {e.time_range.elapsed_us():.0f}us" for e in gpu),
          flush=True)


def write_markdown(path, text):
    """Write ``text`` to ``path`` (a tool's ``--out``), creating its directory."""
    import os

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
