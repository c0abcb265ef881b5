"""What the evaluation plots share: matplotlib on the file-only Agg backend (never needs a display), and writing
a figure."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save_figure(fig, out_png, *, dpi: int, **savefig_kw) -> Path:
    """Write ``fig`` to ``out_png`` (parent directories created), close it and return the path."""
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=dpi, **savefig_kw)
    plt.close(fig)
    return out_png
