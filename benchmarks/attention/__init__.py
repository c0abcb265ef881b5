"""Tools for the Forgetting Attention kernel, run from the repo root as ``python -m benchmarks.attention.<tool>``:

    bench            the op against FlashAttention-2, cuDNN, FlexAttention and fla; ACP's speedup (GPU)
    ab               A/B of the op between two versions of the repo, each in its own processes (GPU; CPU: the
                     reference, to check the tool)
    breakdown        where the time goes: ACP per head mix, per kernel, its ceiling, the drift between runs,
                     kernel boundaries, the host side, Nsight Compute's warp states by SASS region (GPU)
    sweep            each kernel's time per tile config, Triton and Gluon (GPU)
    compile_kernels  every kernel compiled for sm90 / sm80 without a GPU: shared memory, registers, SASS loops
    probe            what the installed triton offers for a Hopper kernel (warp specialisation, TMA loads)

``common.py`` holds the shapes, inputs and timers they share; they reach the kernels through
``forgetting_transformer.ops.forgetting_attention.stages``. ``gpu_tests.sh`` runs the kernel's GPU tests and
``bench`` in one command; ``slim_triton.sh`` packs a triton wheel small enough to carry to another machine.
docs/kernel.md describes each tool, docs/benchmarks.md what they measured.
"""
