"""Per-token loss curves and the figure helpers they need: matplotlib on the file-only Agg backend (never needs a
display), the moving and cumulative averages of L(i), and the plot that training writes at its end and
``eval.per_token_loss`` redraws from the JSON files (eval/ re-uses these; nothing here needs a model)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save_figure(fig, out_png, *, dpi: int, **savefig_kw) -> Path:
    """Write ``fig`` to ``out_png`` (parent directories created), close it and return the path."""
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=dpi, **savefig_kw)
    plt.close(fig)
    return out_png


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


def cumulative_average(x: np.ndarray) -> np.ndarray:
    """L_cum(l) = (1/l) sum_{i<=l} L(i): the average loss over a context of length l (what perplexity at
    length l reports, and why its slope can mislead: early positions dominate it)."""
    x = np.asarray(x, dtype=np.float64)
    return np.cumsum(x) / np.arange(1, len(x) + 1)


def run_name(result_file) -> str:
    """The run a per-token-loss JSON file belongs to: its directory's name for train.py's
    ``<run dir>/per_token_loss.json``, else the file's own name (``eval.per_token_loss.run`` writes
    ``<out>/<run dir name>.json``)."""
    path = Path(result_file)
    return path.parent.resolve().name if path.name == "per_token_loss.json" else path.stem


def curve_labels(result_files, names: list[str], labels: list[str] | None = None) -> list[str]:
    """One legend label per result file: ``labels`` when given, else the result's name (the model's), followed by
    its run's name (``run_name``) where two results share a name, e.g. two runs of one model. Labels that are
    still identical are refused, naming them: two curves would be indistinguishable in the legend."""
    if labels is not None and len(labels) != len(result_files):
        raise ValueError(f"{len(labels)} labels (--label) for {len(result_files)} result files: give one per file")
    if labels is None:
        labels = [f"{name} ({run_name(f)})" if names.count(name) > 1 else name
                  for f, name in zip(result_files, names)]
    for i, label in enumerate(labels):
        if label in labels[:i]:
            first = result_files[labels.index(label)]
            raise ValueError(f"{first} and {result_files[i]} would both be labelled {label!r} in the legend; "
                             "give each file its own label with --label (one per file, in order)")
    return labels


def plot_per_token_loss(result_files, out_png, *, window: int = 101, logx: bool = False,
                        labels: list[str] | None = None) -> Path:
    """Left: the smoothed L(i) of several results overlaid; right: their cumulative averages. A dashed line marks
    each model's training length. The legend labels are ``curve_labels``' (``labels``: one per file)."""
    results = [json.loads(Path(path).read_text()) for path in result_files]
    labels = curve_labels(list(result_files), [res["name"] for res in results], labels)
    fig, (ax, ax_cum) = plt.subplots(1, 2, figsize=(12, 4.5))
    train_lens = set()
    for name, res in zip(labels, results):
        loss = np.asarray(res["loss"])
        pos = np.arange(1, len(loss) + 1)
        line, = ax.plot(pos, moving_average(loss, window), label=name, linewidth=1.5)
        ax_cum.plot(pos, cumulative_average(loss), label=name, linewidth=1.5, color=line.get_color())
        if res["train_len"] is not None:  # unknown for Hugging Face exports
            train_lens.add(res["train_len"])
    for a in (ax, ax_cum):
        for t in sorted(train_lens):
            a.axvline(t, color="gray", linestyle="--", linewidth=1)
            a.annotate(f"train len {t}", (t, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                       textcoords="offset points", fontsize=8, color="gray")
        if logx:
            a.set_xscale("log")
        a.set_xlabel("token position i" if a is ax else "context length l")
        a.grid(alpha=0.3)
        a.legend()
    ax.set_ylabel(f"loss L(i) (nats, moving average {window})")
    ax.set_title("Per-token loss on held-out data")
    ax_cum.set_ylabel("cumulative average loss (nats)")
    ax_cum.set_title("Average loss over the first l tokens")
    fig.tight_layout()
    return save_figure(fig, out_png, dpi=120)
