"""Heatmaps of the retrieval probes from the JSON files ``eval.retrieval.run`` writes; no model needed.

    python -m eval.retrieval.plot RESULT.json [RESULT.json ...] --probe needle_gain|passkey --out PNG [--no-annotate]

One panel per file: x = context length (tokens), y = needle depth (fraction of the haystack).
needle_gain: colour = the mean log-likelihood gain (nats per answer token) on a scale symmetric about 0 that the
    panels share (blue: the needle helped, red: it hurt, white: no retrieval); each cell reads "gain / share of
    trials with gain > 0".
passkey: colour = accuracy from 0 (red) to 1 (green), chance dashed on the colour bar; each cell reads "accuracy /
    mean reciprocal rank".
Titles give the model and its overall figures; a dashed line marks the training length when known.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from eval.niah.plot import CMAP, heatmap, mark_train_len
from eval.plotting import plt, save_figure

PROBES = ("needle_gain", "passkey")
# per probe: the colour's field and the second number written in each cell
FIELDS = {"needle_gain": ("mean_gain", "fraction_positive"), "passkey": ("accuracy", "mrr")}


def cell_grid(cells: list[dict], field: str):
    """→ (lengths, depths, grid[depth, length]) of ``field`` (NaN where a cell is missing)."""
    lengths = sorted({c["length"] for c in cells})
    depths = sorted({c["depth"] for c in cells})
    grid = np.full((len(depths), len(lengths)), np.nan)
    for c in cells:
        grid[depths.index(c["depth"]), lengths.index(c["length"])] = c[field]
    return lengths, depths, grid


def _panel(ax, part: dict, probe: str, cmap, vmin: float, vmax: float, annotate: bool):
    """One heatmap of one result's probe; returns the image (for the colour bar) and the lengths."""
    main, second = FIELDS[probe]
    lengths, depths, grid = cell_grid(part["cells"], main)
    extra = cell_grid(part["cells"], second)[2]

    def text(i, j):
        if probe == "needle_gain":
            return f"{grid[i, j]:+.2f}\n{extra[i, j]:.0%}"
        return f"{grid[i, j]:.2f}\n{extra[i, j]:.2f}"

    im = heatmap(ax, grid, lengths, depths, cmap=cmap, vmin=vmin, vmax=vmax, cell_text=text if annotate else None)
    ax.set_ylabel("needle depth (fraction of the haystack)")
    return im, lengths


def _title(res: dict, probe: str) -> str:
    o, chance = res[probe]["overall"], res[probe]["chance"]
    if probe == "needle_gain":
        return (f"{res['name']}, needle gain\n{o['mean_gain']:+.3f} nats/token, > 0 in "
                f"{o['fraction_positive']:.0%} of trials")
    return (f"{res['name']}, passkey (1 of {res[probe]['distractors'] + 1})\naccuracy {o['accuracy']:.2f} "
            f"(chance {chance['accuracy']:.2f}), MRR {o['mrr']:.2f} (chance {chance['mrr']:.2f})")


def plot_probe(result_files, probe: str, out_png, *, annotate: bool = True) -> Path:
    """One panel per result file for ``probe`` (``needle_gain`` or ``passkey``) → the PNG's path."""
    if probe not in PROBES:
        raise ValueError(f"--probe: {probe!r} is not one of {', '.join(PROBES)}")
    results = [json.loads(Path(f).read_text()) for f in result_files]
    if not results:
        raise ValueError("no result files")
    for f, res in zip(result_files, results):
        if probe not in res:
            raise ValueError(f"{f}: no {probe} results (not a file written by eval.retrieval.run)")
    if probe == "needle_gain":
        top = max([1e-3] + [abs(c["mean_gain"]) for res in results for c in res[probe]["cells"]])
        cmap, vmin, vmax, marks = "RdBu", -top, top, []
        label = ("mean log-likelihood gain (nats per answer token; 0: no retrieval)\n"
                 "cells: mean gain, share of trials > 0")
    else:
        marks = sorted({res[probe]["chance"]["accuracy"] for res in results})  # chance, on the colour bar
        cmap, vmin, vmax = CMAP, 0.0, 1.0
        label = (f"passkey accuracy (chance {' / '.join(f'{c:.2f}' for c in marks)}: dashed)\n"
                 f"cells: accuracy, mean reciprocal rank")
    fig, axes = plt.subplots(1, len(results), figsize=(1.2 + 4.6 * len(results), 4.8), squeeze=False)
    im = None
    for ax, res in zip(axes[0], results):
        im, lengths = _panel(ax, res[probe], probe, cmap, vmin, vmax, annotate)
        mark_train_len(ax, lengths, res.get("train_len"))
        ax.set_title(_title(res, probe), fontsize=9)
    bar = fig.colorbar(im, ax=axes[0].tolist(), label=label, fraction=0.04, pad=0.02)
    for c in marks:
        bar.ax.axhline(c, color="black", linestyle="--", linewidth=1.5)
    return save_figure(fig, out_png, dpi=120, bbox_inches="tight")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="JSON files written by eval.retrieval.run")
    p.add_argument("--probe", choices=PROBES, required=True, help="which probe's heatmap")
    p.add_argument("--out", required=True, help="output PNG")
    p.add_argument("--no-annotate", action="store_true", help="no numbers in the cells")
    a = p.parse_args(argv)
    print(plot_probe(a.results, a.probe, a.out, annotate=not a.no_annotate))


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
