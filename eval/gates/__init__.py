"""Gate analysis: forget-gate matrices F, attention maps A (FoX paper, Figures 27-28) and ACP pruning statistics
(ACP paper, Figures 4-5) of a trained model. ``run`` computes and saves them, ``plot`` re-plots from the files."""
