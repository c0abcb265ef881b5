"""The frontier's records averaged over the text's windows (``eval.eviction.frontier --windows``): one full-cache
record per prompt length and one point per (length, policy setting), with the spread across windows. Pure Python:
the plot and the reproduction's tables read it without a model."""

from __future__ import annotations

import numpy as np

from eval.reproduction_results import paired_interval

MEASURED = ("text_window", "kept_fraction", "kv_mib", "loss", "loss_diff", "greedy_agreement",
            "greedy_identical_prefix")


def setting(point: dict) -> tuple:
    """A point's length, policy and settings: what the windows share."""
    return tuple((k, v) for k, v in point.items() if k not in MEASURED)


def mean_over_windows(result: dict) -> tuple[list[dict], list[dict]]:
    """(full, points): the full cache per length and each point per (length, setting), means over the windows
    (files without ``text_window`` hold one); ``windows`` counts them, ``loss_diff_ci`` is the 95% t interval of the
    mean loss difference across windows (None for one window), ``greedy_identical_prefix`` the smallest."""
    full = []
    for n in dict.fromkeys(f["length"] for f in result["full"]):
        rows = [f for f in result["full"] if f["length"] == n]
        full.append({"length": n, "windows": len(rows), "loss": float(np.mean([f["loss"] for f in rows])),
                     "kv_mib": float(np.mean([f["kv_mib"] for f in rows]))})
    groups: dict[tuple, list[dict]] = {}
    for p in result["points"]:
        groups.setdefault(setting(p), []).append(p)
    points = []
    for key, rows in groups.items():
        ci = paired_interval([p["loss_diff"] for p in rows])
        points.append({**dict(key), "windows": len(rows),
                       **{k: float(np.mean([p[k] for p in rows]))
                          for k in ("kept_fraction", "kv_mib", "loss", "loss_diff", "greedy_agreement")},
                       "loss_diff_ci": [ci[1], ci[2]] if ci else None,
                       "greedy_identical_prefix": min(p["greedy_identical_prefix"] for p in rows)})
    return full, points
