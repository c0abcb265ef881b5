"""Attention ops, one package per op; imports nothing from the rest of the package.

    forgetting_attention/   the training op: ``forgetting_attention`` and its options, kernels, ACP and reference
    decode/                 decoding over a paged KV cache: the few-query op and the cache writer
    path/                   PaTH attention's PyTorch reference
    options.py              ``AttentionOptions``: the kernel choices, one typed object (no torch import)
    launch_cache.py         the cached kernel launch that every op's launchers share
"""
