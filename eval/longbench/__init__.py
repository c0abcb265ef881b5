"""LongBench (v1) evaluation: Table 2 of the FoX paper (see docs/longbench.md)."""
