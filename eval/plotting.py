"""What the evaluation plots share: matplotlib on the file-only Agg backend (never needs a display), and writing
a figure; both from ``forgetting_transformer.plotting``, which the plot training writes uses too."""

from __future__ import annotations

from forgetting_transformer.plotting import plt, save_figure

__all__ = ["plt", "save_figure"]
