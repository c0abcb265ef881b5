"""The two sweeps of the reproduction that vary a setting rather than a model: the data-independent and fixed forget
gates over T_max (part ``tmax``, the FoX paper's sweep at T_min = 2), and the released pair trained at shorter
contexts (part ``train-lengths``: does FoX extrapolate past every training length, the Transformer with RoPE not?).
Each gives a table, a verdict and a line of the summary, from the result files alone."""

from __future__ import annotations

import numpy as np

from eval.reproduction_results import (RunResult, by_seed, full_seeds, paired, paired_interval, picks, rise_past,
                                       verdict)
from forgetting_transformer.markdown import table

PRESET_TMAX = 256  # the presets' T_max: the released-gates part's runs are this sweep's point there
TMAX_POINTS = (32, PRESET_TMAX, 2048, 16384)
GATE_KINDS = (("data_independent", "data-independent"), ("fixed", "fixed"))
TRAIN_LENGTHS = (1024, 2048, 4096)  # 4,096: the protocol's, the released pair's own runs
FAR = (8193, 16384)  # the last band of L(i) the suite measures


def _gate_label(kind: str, tmax: int) -> str:
    return f"fox_pro_released_{kind}" + ("" if tmax == PRESET_TMAX else f"_tmax{tmax}")


def _cell(diffs: list[float]) -> str:
    if not diffs:
        return "–"
    ci = paired_interval(diffs)
    return f"{np.mean(diffs):+.4f}" + (f" [{ci[1]:+.4f}, {ci[2]:+.4f}]" if ci else "") + f" ({len(diffs)})"


def _verdict(diffs: list[float], sign: int) -> str:
    return verdict(paired_interval(diffs), sign) if len(diffs) > 1 else "inconclusive"


def tmax_diffs(runs) -> dict[tuple[str, int], list[float]]:
    """(gate kind, T_max) → that gate's held-out loss − FoX (Pro)'s at each shared seed, all at the FoX pick."""
    lr = picks(runs).get("fox")
    fox = by_seed(runs, "fox_pro_released", lr)
    return {(kind, t): paired(by_seed(runs, _gate_label(kind, t), lr), fox) for kind, _ in GATE_KINDS
            for t in TMAX_POINTS}


def tmax_table(runs) -> str:
    diffs = tmax_diffs(runs)
    if not any(d for (_, t), d in diffs.items() if t != PRESET_TMAX):
        return "Not run yet: `--parts tmax`."
    rows = [[f"{t:,}" + (" (presets)" if t == PRESET_TMAX else "")]
            + [_cell(diffs[kind, t]) for kind, _ in GATE_KINDS]
            + ["; ".join(f"{name} {_verdict(diffs[kind, t], +1)}" for kind, name in GATE_KINDS if diffs[kind, t])
               or "–"] for t in TMAX_POINTS]
    return table(["T_max (T_min = 2)", "data-independent − FoX (Pro): mean [95%] (seeds)",
                  "fixed − FoX (Pro): mean [95%] (seeds)", "verdict (paper: higher)"], rows, "lrrl")


def tmax_summary(runs) -> str:
    """The share of (gate, T_max) points where the data-dependent gate is lower, by the interval rule."""
    diffs = {k: d for k, d in tmax_diffs(runs).items() if d}
    if not any(t != PRESET_TMAX for _, t in diffs):
        return "not run (`--parts tmax`)"
    said = [_verdict(d, +1) for d in diffs.values()]
    seeds = sorted({len(d) for d in diffs.values()})
    counts = ", ".join(f"{w} at {said.count(w)}" for w in dict.fromkeys(said))
    span = f"{seeds[0]}–{seeds[-1]}" if len(seeds) > 1 else f"{seeds[0]}"
    return f"{counts} of {len(said)} (gate, T_max) points ({span} seeds each)"


def tmax_verdict(runs) -> str:
    if tmax_summary(runs).startswith("not run"):
        return "Not run yet: `--parts tmax`."
    return (f"**Verdict: {tmax_summary(runs)}.** Each cell is the gate's held-out loss minus the data-dependent "
            "FoX (Pro)'s at the same seeds; the paper has the data-dependent gate best at every T_max.")


def _band(r: RunResult, lo: int, hi: int) -> float:
    return float(np.mean(r.loss_curve[lo - 1:hi]))


def _length_runs(runs, n: int) -> tuple[dict[int, RunResult], dict[int, RunResult]]:
    """The released pair trained at n tokens of context, by seed, with L(i) to 16,384 (n = 4,096: the protocol's)."""
    pick, suffix = picks(runs), "" if n == 4096 else f"_ctx{n}"
    return (full_seeds(runs, f"fox_pro_released{suffix}", pick.get("fox")),
            full_seeds(runs, f"transformer_pro_released{suffix}", pick.get("transformer")))


def lengths_table(runs) -> str:
    if not any(any(_length_runs(runs, n)) for n in TRAIN_LENGTHS[:-1]):
        return "Not run yet: `--parts train-lengths`."
    rows = []
    for n in TRAIN_LENGTHS:
        fox, tf = _length_runs(runs, n)
        gap = paired(tf, fox, lambda r: rise_past(r, n))
        rows.append([f"{n:,}", f"{len(fox)}, {len(tf)}",
                     *(f"{np.mean([rise_past(r, n) for r in d.values()]):+.3f}" if d else "–" for d in (fox, tf)),
                     *(f"{np.mean([_band(r, *FAR) - _band(r, n // 8 + 1, n) for r in d.values()]):+.3f}"
                       if d else "–" for d in (fox, tf)), _cell(gap)])
    return table(["training length n", "seeds (FoX, Transformer)", "FoX (Pro): L(2n..4n] − L(n/8..n]",
                  "Transformer (Pro): the same", "FoX (Pro): L(8,193..16,384] − L(n/8..n]",
                  "Transformer (Pro): the same", "Transformer − FoX rise to 2n..4n: mean [95%] (seeds)"], rows,
                 "lrrrrrr")


def lengths_summary(runs) -> str:
    said = []
    for n in TRAIN_LENGTHS:
        fox, tf = _length_runs(runs, n)
        gap = paired(tf, fox, lambda r: rise_past(r, n))
        if gap:
            said.append(f"{n:,}: {_verdict(gap, +1)} ({len(gap)} seed{'s' * (len(gap) != 1)})")
    if len(said) < 2:
        return "not run (`--parts train-lengths`)"
    return "; ".join(said)


def lengths_verdict(runs) -> str:
    if lengths_summary(runs).startswith("not run"):
        return "Not run yet: `--parts train-lengths`."
    flat = [f"{n:,} {np.mean([rise_past(r, n) for r in fox.values()]):+.3f}" for n in TRAIN_LENGTHS
            if (fox := _length_runs(runs, n)[0])]
    return (f"**Verdict (Transformer − FoX rise past the training length, by training length): "
            f"{lengths_summary(runs)}.** FoX (Pro)'s own L(i) from inside to 2–4× past its training length moves by "
            f"{', '.join(flat)} nats/token; the FoX paper has FoX flat past the training length and the Transformer "
            "with RoPE rising, and (slides) extrapolation better the longer the training context.")


def sweep_tables(runs) -> dict[str, str]:
    return {"tmax": tmax_table(runs), "verdict_tmax": tmax_verdict(runs), "train_lengths": lengths_table(runs),
            "verdict_train_lengths": lengths_verdict(runs)}


def lengths_row(runs) -> list[str]:
    return ["2. FoX extrapolates past every training length, the Transformer (Pro) less", lengths_summary(runs)]


def tmax_row(runs) -> list[str]:
    return ["3. The data-dependent gate beats the data-independent and fixed ones at every T_max",
            tmax_summary(runs)]
