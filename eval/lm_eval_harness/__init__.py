"""lm-evaluation-harness (lm-eval 0.4.x) integration: the ``fox`` model (model.py), the FoX paper's Table 1
zero-shot suite (run.py) and its table (table.py). See docs/lm_eval.md."""
