"""Benchmarks and developer tools; ``benchmarks.attention``: the Forgetting Attention kernel's."""
