"""The warp-specialised Gluon kernels of Forgetting Attention for Hopper (``kernels.py``) and their launchers
(``launch.py``), which also run the Triton helper kernels of ``triton/`` (block prefix sums, the fused backward's
set-up)."""
