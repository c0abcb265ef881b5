"""Needle-in-a-haystack heatmaps from the JSON files ``eval.niah.run`` writes; no model needed.

    python -m eval.niah.plot RESULT.json [RESULT.json ...] --out niah.png [--no-annotate]

One panel per JSON file: x = context length (tokens), y = needle depth (%), colour = score 1 (red) → 10 (green);
the title gives the model, the mode and the average score on its scale; the colour bar says what the scores mean
(the JSON's ``scale``); a dashed line marks the training length when known.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from matplotlib.colors import LinearSegmentedColormap

from eval.plotting import plt, save_figure

# the scale of result files written before they recorded theirs: the recall score's, or a judge's
OLD_SCALES = {False: "1–10 (1: none of the answer's key words, 10: all of them)",
              True: "1–10 (scored by a judge; 1: worst, 10: best)"}

# The red → yellow → green map of the usual NIAH plots (gkamradt's and FoX's plot scripts).
CMAP = LinearSegmentedColormap.from_list("niah", ["#F0496E", "#EBB839", "#0CD79F"])


def score_grid(res: dict):
    """→ (lengths, depths, grid[depth, length]) with the mean score per cell (NaN where missing)."""
    lengths = sorted({e["length"] for e in res["results"]})
    depths = sorted({e["depth"] for e in res["results"]})
    total = np.zeros((len(depths), len(lengths)))
    count = np.zeros_like(total)
    for e in res["results"]:
        i, j = depths.index(e["depth"]), lengths.index(e["length"])
        total[i, j] += e["score"]
        count[i, j] += 1
    with np.errstate(invalid="ignore"):
        return lengths, depths, total / count


def _fmt_len(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def heatmap(ax, grid, lengths: list[int], depths: list, *, cmap, vmin: float, vmax: float, cell_text=None):
    """``grid`` (depths, lengths) as an image with white cell borders, x = context length, y = depth; ``cell_text(i,
    j)`` writes each finite cell (None: no numbers). Returns the image, for the colour bar."""
    im = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(lengths)), [_fmt_len(x) for x in lengths], rotation=45)
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_xticks(np.arange(len(lengths) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(depths) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1.0)
    ax.tick_params(which="minor", length=0)
    if cell_text is not None:
        for i in range(len(depths)):
            for j in range(len(lengths)):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, cell_text(i, j), ha="center", va="center", fontsize=7, color="black")
    ax.set_xlabel("context length (tokens)")
    return im


def mark_train_len(ax, lengths: list[int], train_len: int | None) -> None:
    """A dashed line right of the last length within training, when the grid extends beyond it."""
    if train_len and lengths[0] <= train_len < lengths[-1]:
        x = sum(L <= train_len for L in lengths) - 0.5
        ax.axvline(x, color="black", linestyle="--", linewidth=2)
        ax.annotate(f"train len {_fmt_len(train_len)}", (x, 0), xycoords=("data", "axes fraction"),
                    xytext=(3, 3), textcoords="offset points", fontsize=8)


def plot_niah(result_files, out_png, *, annotate: bool = True) -> Path:
    results = [json.loads(Path(f).read_text()) for f in result_files]
    if not results:
        raise ValueError("no result files")
    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(1.2 + 4.6 * n, 4.8), squeeze=False)
    im = None
    for ax, res in zip(axes[0], results):
        lengths, depths, grid = score_grid(res)
        im = heatmap(ax, grid, lengths, depths, cmap=CMAP, vmin=1, vmax=10,
                     cell_text=(lambda i, j: f"{grid[i, j]:.1f}") if annotate else None)
        mark_train_len(ax, lengths, res.get("train_len"))
        mean = float(np.mean([e["score"] for e in res["results"]]))
        ax.set_title(f"{res['name']}, {res.get('mode', 'standard')}\naverage score {mean:.2f} of 1–10")
        ax.set_ylabel("needle depth (%)")
    scales = dict.fromkeys(res.get("scale") or OLD_SCALES[bool(res.get("judge"))] for res in results)
    label = "score " + "\n".join(scales).replace(" (", "\n(")
    fig.colorbar(im, ax=axes[0].tolist(), label=label, fraction=0.04, pad=0.02)
    return save_figure(fig, out_png, dpi=120, bbox_inches="tight")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="NIAH JSON files written by eval.niah.run")
    p.add_argument("--out", required=True, help="output PNG")
    p.add_argument("--no-annotate", action="store_true", help="no score numbers in the cells")
    a = p.parse_args(argv)
    print(plot_niah(a.results, a.out, annotate=not a.no_annotate))


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
