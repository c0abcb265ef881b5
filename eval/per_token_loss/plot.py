"""Plot per-token loss L(i) curves from the JSON files ``run.py`` (or train.py) writes; no model needed.

    python -m eval.per_token_loss.plot RESULT.json [RESULT.json ...] --out per_token_loss.png [--window 101]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def moving_average(x: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average; near the ends the window shrinks symmetrically to what is available."""
    if window < 1 or window % 2 == 0:
        raise ValueError(f"window={window}: must be odd and >= 1")
    x = np.asarray(x, dtype=np.float64)
    half = window // 2
    csum = np.concatenate([[0.0], np.cumsum(x)])
    i = np.arange(len(x))
    h = np.minimum(half, np.minimum(i, len(x) - 1 - i))  # symmetric half-width that fits at position i
    return (csum[i + h + 1] - csum[i - h]) / (2 * h + 1)


def plot_per_token_loss(result_files, out_png, *, window: int = 101, logx: bool = False) -> Path:
    """Overlay the smoothed L(i) of several results; a dashed line marks each model's training length."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    train_lens = set()
    for path in result_files:
        res = json.loads(Path(path).read_text())
        loss = np.asarray(res["loss"])
        ax.plot(np.arange(1, len(loss) + 1), moving_average(loss, window), label=res["name"], linewidth=1.5)
        train_lens.add(res["train_len"])
    for t in sorted(train_lens):
        ax.axvline(t, color="gray", linestyle="--", linewidth=1)
        ax.annotate(f"train len {t}", (t, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                    textcoords="offset points", fontsize=8, color="gray")
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel("token position i")
    ax.set_ylabel(f"loss L(i) (nats, moving average {window})")
    ax.set_title("Per-token loss on held-out data")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="per-token-loss JSON files")
    p.add_argument("--out", required=True, help="output PNG")
    p.add_argument("--window", type=int, default=101)
    p.add_argument("--logx", action="store_true")
    a = p.parse_args(argv)
    print(plot_per_token_loss(a.results, a.out, window=a.window, logx=a.logx))


if __name__ == "__main__":
    main()
