"""The Triton kernels of Forgetting Attention (``kernels.py``) and their launchers with autotuning (``launch.py``).
Run on any CUDA GPU, and on the CPU under ``TRITON_INTERPRET=1``."""
