"""Plots of the gate analysis from the files ``eval.gates.run`` writes; no model needed.

    python -m eval.gates.plot results/gates [--out DIR] [--f-min 1e-6] [--a-scale log|linear] [--acp-metric tile]

``gates.png`` (from gates.npz + gates.json): the forget-gate matrices F (log colour scale, values below
``--f-min`` clipped to its colour) beside the attention maps A, each a grid with one row per layer and one column per
head (as the FoX paper's Figures 27 and 28); white above the diagonal, where both are 0.
``acp.png`` (from acp.json): left, the distribution over all heads of the per-head pruned fraction in 20 bins of 5%
(the ACP paper's Figure 4); right, the per-head fractions of each layer as box and points (its Figure 5).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from matplotlib.colors import LogNorm, Normalize

from eval.plotting import plt, save_figure

ACP_METRICS = {"tile": "tile_fraction", "element": "element_fraction"}


def _masked_upper(m: np.ndarray) -> np.ma.MaskedArray:
    return np.ma.masked_array(m, mask=np.triu(np.ones(m.shape, dtype=bool), 1))


def plot_gates(result_dir, out_png, *, f_min: float = 1e-6, a_scale: str = "log", a_min: float = 1e-4) -> Path:
    """F | A grids of the chosen layers (rows) x heads (columns) from ``result_dir/gates.{npz,json}``."""
    result_dir = Path(result_dir)
    rec = json.loads((result_dir / "gates.json").read_text())
    data = np.load(result_dir / "gates.npz")
    if a_scale not in ("log", "linear"):
        raise ValueError(f"a_scale={a_scale!r}: expected 'log' or 'linear'")
    panels = []
    if "F" in data:
        panels.append(("F", "Forget-gate matrix F (log scale)", LogNorm(vmin=f_min, vmax=1.0, clip=True)))
    if "A" in data:
        norm = LogNorm(vmin=a_min, vmax=1.0, clip=True) if a_scale == "log" else Normalize(0.0, 1.0)
        panels.append(("A", f"Attention map A ({a_scale} scale)", norm))
    if not panels:
        raise ValueError(f"{result_dir / 'gates.npz'} holds neither F nor A")
    layers, heads = [int(x) for x in data["layers"]], [int(x) for x in data["heads"]]
    nr, nc = len(layers), len(heads)
    fig = plt.figure(figsize=(len(panels) * (1.9 * nc + 1.0), 1.9 * nr + 0.9), layout="constrained")
    subfigs = np.atleast_1d(fig.subfigures(1, len(panels)))
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")  # masked (above the diagonal) → white
    for sub, (key, title, norm) in zip(subfigs, panels):
        axes = sub.subplots(nr, nc, squeeze=False)
        im = None
        for r, layer in enumerate(layers):
            for c, head in enumerate(heads):
                ax = axes[r, c]
                im = ax.imshow(_masked_upper(data[key][r, c]), cmap=cmap, norm=norm, interpolation="nearest")
                ax.set_xticks([])
                ax.set_yticks([])
                ax.set_title(f"layer {layer}, head {head}", fontsize=8)
        sub.colorbar(im, ax=axes, shrink=0.8, label=key)
        sub.suptitle(title, fontsize=10)
    fig.suptitle(f"{rec.get('name', '')}: {rec['tokens']} tokens (rows: query i, columns: key j)", fontsize=11)
    return save_figure(fig, out_png, dpi=110)


def per_head_fractions(acp_rec: dict, metric: str = "tile") -> tuple[list[int], list[np.ndarray]]:
    """(layer indices, per layer the per-head pruned fractions) from an acp.json record."""
    if metric not in ACP_METRICS:
        raise ValueError(f"metric={metric!r}: expected one of {sorted(ACP_METRICS)}")
    key = ACP_METRICS[metric]
    return [r["layer"] for r in acp_rec["layers"]], [np.asarray(r[key], dtype=float) for r in acp_rec["layers"]]


def head_histogram(fractions: np.ndarray) -> np.ndarray:
    """Share of heads in each of the 20 bins [0%, 5%), ..., [90%, 95%), [95%, 100%] of pruned fraction."""
    counts, _ = np.histogram(100 * np.asarray(fractions), bins=np.linspace(0, 100, 21))
    return counts / max(1, counts.sum())


def plot_acp(acp_json, out_png, *, metric: str = "tile") -> Path:
    rec = json.loads(Path(acp_json).read_text())
    layers, per_layer = per_head_fractions(rec, metric)
    what = (f"pruned attention FLOPs (tiles {rec['block'][0]}x{rec['block'][1]})" if metric == "tile"
            else "pruned causal (i, j)")
    fig, (ax, ax_l) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1.4]})
    share = head_histogram(np.concatenate(per_layer))
    ax.bar(np.arange(20) * 5 + 2.5, 100 * share, width=4.6, color="tab:blue")
    ax.set_xlim(0, 100)
    ax.set_xlabel(f"% {what} per head")
    ax.set_ylabel("% of heads")
    ax.set_title("All heads")
    ax.grid(alpha=0.3)
    ax_l.boxplot([100 * f for f in per_layer], positions=range(len(layers)), widths=0.6, showfliers=False)
    rng = np.random.default_rng(0)  # fixed jitter: re-plots are identical
    for i, f in enumerate(per_layer):
        ax_l.scatter(i + rng.uniform(-0.18, 0.18, len(f)), 100 * f, s=12, alpha=0.7, color="tab:orange", zorder=3)
    ax_l.set_xticks(range(len(layers)), [str(x) for x in layers])
    ax_l.set_ylim(-3, 103)
    ax_l.set_xlabel("layer")
    ax_l.set_ylabel(f"% {what}")
    ax_l.set_title("Per layer (one point per head)")
    ax_l.grid(alpha=0.3)
    overall = 100 * rec["tile_fraction" if metric == "tile" else "element_fraction"]
    fig.suptitle(f"ACP on {rec['name']}: {rec['tokens']} tokens, threshold {rec['threshold']}; "
                 f"{overall:.1f}% pruned overall", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, out_png, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", help="directory written by eval.gates.run (gates.npz/gates.json and/or acp.json)")
    p.add_argument("--out", default=None, help="directory for gates.png / acp.png (default: the results dir)")
    p.add_argument("--f-min", type=float, default=1e-6, help="lower end of F's log colour scale")
    p.add_argument("--a-scale", choices=["log", "linear"], default="log")
    p.add_argument("--a-min", type=float, default=1e-4, help="lower end of A's log colour scale")
    p.add_argument("--acp-metric", choices=sorted(ACP_METRICS), default="tile")
    a = p.parse_args(argv)
    res = Path(a.results)
    out = Path(a.out) if a.out else res
    done = []
    if (res / "gates.npz").is_file():
        done.append(plot_gates(res, out / "gates.png", f_min=a.f_min, a_scale=a.a_scale, a_min=a.a_min))
    if (res / "acp.json").is_file():
        done.append(plot_acp(res / "acp.json", out / "acp.png", metric=a.acp_metric))
    if not done:
        raise FileNotFoundError(f"{res}: holds neither gates.npz nor acp.json (written by eval.gates.run)")
    for f in done:
        print(f)


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
