"""The reproduction report: tables and plots of the claims from the result files ``scripts/reproduce.py`` writes
(``OUT/runs/<run>/``); no model or GPU needed.

    python scripts/reproduce.py books --out results/books --report      # OUT/report.md and OUT/*.png
    python scripts/make_tables.py --table books --inputs results/books  # the tables alone

``render_tables(out)`` returns ``{name: markdown}`` for the sections of docs/reproduction.md (``sweep``, ``claim1``,
``claim2``, ``claim3``, ``claim4``, ``claim5``, ``claim6``, ``path``, ``released``, ``llama_sweep``, ``runs``); a claim whose runs are missing says which.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

LABELS = {"fox_pro": "FoX (Pro)", "transformer_pro": "Transformer (Pro)", "fox_llama": "FoX (LLaMA)",
          "transformer_llama": "Transformer (LLaMA)", "transformer_llama_no_rope": "Transformer (LLaMA) w/o RoPE",
          "path_pro": "PaTH (Pro)", "path_fox_pro": "PaTH-FoX (Pro)"}
FAMILY = {"fox": "fox_pro", "transformer": "transformer_pro"}
BANDS = ((1, 512), (513, 4096), (4097, 8192), (8193, 16384))  # positions i (1-based, inclusive) of L(i)
ABLATIONS = ("fox_pro", "fox_pro_no_kv_shift", "fox_pro_no_output_gate", "fox_pro_no_output_norm",
             "fox_pro_no_qk_norm", "fox_pro_data_independent", "fox_pro_fixed", "fox_pro_rope", "transformer_llama",
             "transformer_llama_no_rope")


@dataclass
class RunResult:
    """What one finished run of the suite left in ``OUT/runs/<name>/``."""

    name: str
    label: str
    seed: int
    lr: float
    part: str
    device: str
    versions: str
    heldout: float  # inf when the run diverged
    tokens_per_s: float | None
    loss_curve: np.ndarray | None = None  # L(i), (T,)
    acp: dict | None = None
    niah: dict = field(default_factory=dict)  # mode → result
    acp_over_training: dict | None = None
    path: Path | None = None


def _read_run(d: Path) -> RunResult | None:
    if not (d / "done.json").is_file():
        return None
    done = json.loads((d / "done.json").read_text())
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()] \
        if (d / "metrics.jsonl").is_file() else []
    losses = [r["heldout_loss"] for r in rows if "heldout_loss" in r]
    speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:]  # the first window holds the compile
    heldout = float("inf") if (d / "failed.json").is_file() or not losses else float(losses[-1])
    res = RunResult(d.name, done["label"], done["seed"], done["lr"], done["part"], done["device"],
                    f"torch {done['torch']}, triton {done['triton']}", heldout,
                    float(np.median(speeds)) if speeds else None, path=d)
    if (d / "per_token_loss.json").is_file():
        res.loss_curve = np.asarray(json.loads((d / "per_token_loss.json").read_text())["loss"])
    if (d / "acp" / "acp.json").is_file():
        res.acp = json.loads((d / "acp" / "acp.json").read_text())
    for f in sorted((d / "niah").glob("*.json")) if (d / "niah").is_dir() else []:
        r = json.loads(f.read_text())
        res.niah[r["mode"]] = r
    if (d / "acp_over_training.json").is_file():
        res.acp_over_training = json.loads((d / "acp_over_training.json").read_text())
    return res


def load_results(out) -> list[RunResult]:
    runs_dir = Path(out) / "runs"
    if not runs_dir.is_dir():
        raise FileNotFoundError(f"{runs_dir}: no runs (write them with scripts/reproduce.py books --parts ...)")
    return [r for d in sorted(runs_dir.iterdir()) if (r := _read_run(d)) is not None]


def _table(headers: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(headers) - 1)
    sep = "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"
    return "\n".join(["| " + " | ".join(headers) + " |", sep, *("| " + " | ".join(r) + " |" for r in rows)])


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "–"
    return "diverged" if math.isinf(x) else f"{x:.{digits}f}"


def picks(runs: list[RunResult]) -> dict[str, float]:
    """family → the sweep's learning rate (lowest held-out loss at seed 0 among the sweep parts)."""
    out = {}
    for family, model in FAMILY.items():
        sweep = [r for r in runs if r.label == model and r.part.startswith("lr") and r.seed == 0]
        if sweep:
            out[family] = min(sweep, key=lambda r: r.heldout).lr
    return out


def sweep_table(runs: list[RunResult]) -> str:
    lrs = sorted({r.lr for r in runs if r.part.startswith("lr")})
    if not lrs:
        return "Not run yet: `--parts lr,lr-wide`."
    rows = []
    for model in FAMILY.values():
        by_lr = {r.lr: r.heldout for r in runs if r.label == model and r.part.startswith("lr")}
        best = min(by_lr.values()) if by_lr else None
        rows.append([LABELS[model]] + [("**" + _fmt(by_lr[lr]) + "**" if by_lr.get(lr) == best else _fmt(by_lr.get(lr)))
                                       for lr in lrs])
    return _table(["held-out loss (nats/token) at peak lr"] + [f"{lr:g}" for lr in lrs], rows)


def primary(runs: list[RunResult], label: str, family: str, pick: dict) -> list[RunResult]:
    """The runs of ``label`` at its family's pick, by seed."""
    lr = pick.get(family)
    return sorted((r for r in runs if r.label == label and r.lr == lr), key=lambda r: r.seed)


def llama_sweep_table(runs: list[RunResult]) -> str:
    """The LLaMA pair's held-out loss at each rate (seed 0: the ``lr-llama`` part and the ``main`` run at the Pro
    picks), the best of each in bold, and the pair's gap at their own best rates against the gap at the Pro picks."""
    pick, best, rows = picks(runs), {}, []
    lrs = sorted({r.lr for r in runs if r.part == "lr-llama"})
    if not lrs:
        return "Not run yet: `--parts lr-llama`."
    lrs = sorted(set(lrs) | {pick[f] for f in ("fox", "transformer") if f in pick})
    for label in ("fox_llama", "transformer_llama"):
        by_lr = {r.lr: r.heldout for r in runs if r.label == label and r.seed == 0 and r.part in ("lr-llama", "main")}
        best[label] = min(by_lr.items(), key=lambda kv: kv[1]) if by_lr else None
        rows.append([LABELS[label]] + [("**" + _fmt(by_lr[lr]) + "**" if best[label] and lr == best[label][0]
                                        else _fmt(by_lr.get(lr))) for lr in lrs])
    text = _table(["held-out loss (nats/token) at peak lr, seed 0"] + [f"{lr:g}" for lr in lrs], rows)
    f, t = best["fox_llama"], best["transformer_llama"]
    if f and t:
        at_pro = {r.label: r.heldout for r in runs if r.part == "main" and r.seed == 0
                  and r.label in ("fox_llama", "transformer_llama")}
        text += (f"\n\nTransformer (LLaMA) − FoX (LLaMA): {t[1] - f[1]:+.4f} nats/token at their own best rates "
                 f"({t[0]:g}, {f[0]:g})")
        if len(at_pro) == 2:
            text += f"; {at_pro['transformer_llama'] - at_pro['fox_llama']:+.4f} at the Pro pair's picks"
        text += "."
    return text


def claim1_table(runs: list[RunResult]) -> str:
    pick = picks(runs)
    rows, means = [], {}
    for label, family in (("fox_pro", "fox"), ("transformer_pro", "transformer"), ("fox_llama", "fox"),
                          ("transformer_llama", "transformer")):
        rs = primary(runs, label, family, pick)
        by_seed = {r.seed: r.heldout for r in rs}
        mean = float(np.mean(list(by_seed.values()))) if by_seed else None
        means[label] = mean
        spread = (max(by_seed.values()) - min(by_seed.values())) if len(by_seed) > 1 else None
        rows.append([LABELS[label], f"{pick[family]:g}" if family in pick else "–", _fmt(by_seed.get(0)),
                     _fmt(by_seed.get(1)), _fmt(mean), _fmt(spread), _fmt(math.exp(mean), 2) if mean else "–"])
    text = _table(["model", "peak lr", "seed 0", "seed 1", "mean", "seed spread", "perplexity"], rows)
    gaps = []
    for fox, tf, name in (("fox_pro", "transformer_pro", "Pro"), ("fox_llama", "transformer_llama", "LLaMA")):
        if means[fox] is not None and means[tf] is not None:
            gaps.append(f"{name}: Transformer − FoX = {means[tf] - means[fox]:+.4f} nats/token")
    return text + ("\n\nGap of the means: " + "; ".join(gaps) + "." if gaps else "")


def _bands(curve: np.ndarray) -> list[float | None]:
    return [float(curve[a - 1:b].mean()) if len(curve) >= b else None for a, b in BANDS]


def _band_cells(curve: np.ndarray | None) -> list[str]:
    """L(i) per band, then the rise past the training length, L(8,193–16,384) − L(513–4,096), formatted."""
    b = _bands(curve) if curve is not None else [None] * len(BANDS)
    rise = b[3] - b[1] if b[3] is not None and b[1] is not None else None
    return [*(_fmt(x) for x in b), _fmt(rise)]


def claim2_runs(runs: list[RunResult]) -> list[RunResult]:
    """One run per model for the L(i) figure: seed 0 at the family's pick (seed 1 where seed 0 is missing)."""
    pick, out = picks(runs), []
    for label, family in (("fox_pro", "fox"), ("transformer_pro", "transformer"), ("fox_llama", "fox"),
                          ("transformer_llama", "transformer"), ("transformer_llama_no_rope", "transformer")):
        rs = [r for r in primary(runs, label, family, pick) if r.loss_curve is not None]
        if rs:
            out.append(rs[0])
    return out


def claim2_table(runs: list[RunResult]) -> str:
    chosen = claim2_runs(runs)
    if not chosen:
        return "Not run yet."
    heads = [f"L, i in {a:,}–{b:,}" for a, b in BANDS]
    rows = []
    for r in chosen:
        rows.append([f"{LABELS.get(r.label, r.label)} ({r.name})", *_band_cells(r.loss_curve)])
    return _table(["model (run)", *heads, "L(8,193–16,384) − L(513–4,096)"], rows)


def claim2_gap_table(runs: list[RunResult]) -> str:
    """Transformer − FoX per position band, per seed pair: does FoX's advantage grow with position?"""
    pick = picks(runs)
    rows = []
    for fox, tf, name in (("fox_pro", "transformer_pro", "Pro"), ("fox_llama", "transformer_llama", "LLaMA")):
        f = {r.seed: r for r in primary(runs, fox, "fox", pick) if r.loss_curve is not None}
        t = {r.seed: r for r in primary(runs, tf, "transformer", pick) if r.loss_curve is not None}
        for seed in sorted(set(f) & set(t)):
            gap = [None if x is None or y is None else y - x for x, y in zip(_bands(f[seed].loss_curve),
                                                                             _bands(t[seed].loss_curve))]
            rows.append([f"{name}, seed {seed}", *(_fmt(g) for g in gap)])
    if not rows:
        return "Not run yet."
    return _table(["Transformer − FoX", *[f"i in {a:,}–{b:,}" for a, b in BANDS]], rows)


def claim3_table(runs: list[RunResult]) -> str:
    from eval.ablations import load_ablation_row, render_table3

    pick = picks(runs)
    rows, missing = [], []
    for label in ABLATIONS:
        family = "transformer" if label.startswith("transformer") else "fox"
        rs = [r for r in primary(runs, label, family, pick) if r.seed == 0]
        if rs:
            rows.append(load_ablation_row(str(rs[0].path)))
        else:
            missing.append(label)
    if not rows:
        return "Not run yet: `--parts ablations,gates`."
    note = f"\n\nNot run yet: {', '.join(missing)}." if missing else ""
    return render_table3(rows) + note


def claim4_table(runs: list[RunResult]) -> str:
    pick = picks(runs)
    dense = {r.seed: r for r in primary(runs, "fox_pro", "fox", pick)}
    acp = {r.seed: r for r in primary(runs, "fox_pro_acp", "fox", pick)}
    if not acp:
        return "Not run yet: `--parts acp`."
    rows = []
    for seed in sorted(acp):
        a, d = acp[seed], dense.get(seed)
        rel = (a.heldout / d.heldout - 1) if d else None
        speed = (a.tokens_per_s / d.tokens_per_s) if d and a.tokens_per_s and d.tokens_per_s else None
        same = d is not None and a.device == d.device
        rows.append([str(seed), _fmt(d.heldout if d else None), _fmt(a.heldout),
                     f"{100 * rel:+.2f}%" if rel is not None else "–",
                     f"{d.tokens_per_s:,.0f}" if d and d.tokens_per_s else "–",
                     f"{a.tokens_per_s:,.0f}" if a.tokens_per_s else "–",
                     (f"{speed:.3f}×" + ("" if same else " (other GPUs)")) if speed else "–"])
    text = _table(["seed", "dense held-out loss", "ACP held-out loss", "ACP / dense − 1", "dense tokens/s",
                   "ACP tokens/s", "ACP speed"], rows)
    traj = next((r.acp_over_training for r in acp.values() if r.acp_over_training), None)
    if traj:
        ckpts = traj["checkpoints"]
        text += "\n\n" + _table(["step", *[str(c["step"]) for c in ckpts]],
                                [["% forward tiles pruned", *[f"{100 * c['tile_fraction']:.1f}" for c in ckpts]]])
    return text


def claim5_table(runs: list[RunResult]) -> str:
    """Per layer of the FoX (Pro) runs at the pick: decay time per head (-1 / mean log f, tokens) and the ACP pruned
    tile share per head, as min / median / max over the layer's heads."""
    pick = picks(runs)
    rs = [r for r in primary(runs, "fox_pro", "fox", pick) if r.acp is not None]
    if not rs:
        return "Not run yet."
    r = rs[0]
    rows = []
    for layer in r.acp["layers"]:
        tau = -1.0 / np.minimum(np.asarray(layer["mean_log_fgate"]), -1e-12)
        frac = 100 * np.asarray(layer["tile_fraction"])
        rows.append([str(layer["layer"]), f"{tau.min():.1f} / {np.median(tau):.1f} / {tau.max():,.0f}",
                     f"{frac.min():.0f} / {np.median(frac):.0f} / {frac.max():.0f}"])
    head = (f"{r.name}: {r.acp['tokens']:,} tokens of a held-out book; ACP prunes "
            f"{100 * r.acp['tile_fraction']:.1f}% of the forward tiles ({r.acp['block'][0]}×{r.acp['block'][1]}) "
            f"over all heads.\n\n")
    return head + _table(["layer", "decay time −1/mean log f (tokens): min / median / max",
                          "% tiles pruned per head: min / median / max"], rows)


def claim6_table(runs: list[RunResult]) -> str:
    results = [(r, mode, res) for r in runs for mode, res in sorted(r.niah.items())]
    if not results:
        return "Not run yet: `--parts main`."
    lengths = sorted({e["length"] for _, _, res in results for e in res["results"]})
    rows = []
    for r, mode, res in results:
        cells = [np.mean([e["score"] for e in res["results"] if e["length"] == n] or [np.nan]) for n in lengths]
        rows.append([f"{LABELS.get(r.label, r.label)} ({r.name})", mode, *(f"{c:.1f}" for c in cells),
                     f"{res['mean_score']:.2f}"])
    return (_table(["model (run)", "mode", *[f"{n:,}" for n in lengths], "mean"], rows)
            + "\n\nScore 1 (no key word of the answer) to 10 (all of them), mean over depths.")


# The released definition (part "released"): per-head output norm and QK-norm eps 1e-5, at the families' picks
RELEASED = (("fox_pro_released", "fox", "FoX (Pro)"), ("transformer_pro_released", "transformer", "Transformer (Pro)"),
            ("fox_pro_released_no_kv_shift", "fox", "FoX (Pro) − KV-shift"))
# (label, baseline label, the sign of label − baseline the paper reports or None, name); the last three compare
# with the earlier definition's runs (output norm shared across heads, QK-norm eps 1e-6) at equal seeds
RELEASED_PAIRS = (("transformer_pro_released", "fox_pro_released", +1, "Transformer (Pro) − FoX (Pro)"),
                  ("fox_pro_released_no_kv_shift", "fox_pro_released", +1, "FoX (Pro) − KV-shift − FoX (Pro)"),
                  ("fox_pro_released", "fox_pro", None, "FoX (Pro): released − earlier definition"),
                  ("transformer_pro_released", "transformer_pro", None,
                   "Transformer (Pro): released − earlier definition"),
                  ("fox_pro_released_no_kv_shift", "fox_pro_no_kv_shift", None,
                   "FoX (Pro) − KV-shift: released − earlier definition"))
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)  # Student t, 97.5%, df 1..10


def paired_interval(diffs: list[float]) -> tuple[float, float, float] | None:
    """Mean of paired differences and its 95% t interval (None for fewer than two pairs)."""
    n = len(diffs)
    if n < 2 or n - 1 > len(T_975):
        return None
    mean = float(np.mean(diffs))
    half = T_975[n - 2] * float(np.std(diffs, ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half


def verdict(interval: tuple[float, float, float] | None, paper_sign: int | None) -> str:
    """``reproduced`` / ``contradicts the paper`` when the interval excludes zero, else ``inconclusive``; without
    a claim of the paper (``paper_sign`` None): ``differs`` / ``inconclusive``."""
    if paper_sign is None:
        excludes = interval is not None and (interval[1] > 0 or interval[2] < 0)
        return "differs" if excludes else "inconclusive" if interval else "– (fewer than two seeds)"
    if interval is None:
        return "inconclusive (fewer than two seeds)"
    _, lo, hi = interval
    if lo > 0 or hi < 0:
        return "reproduced" if (1 if lo > 0 else -1) == paper_sign else "contradicts the paper"
    return "inconclusive"


def released_table(runs: list[RunResult]) -> str:
    """Held-out loss per seed of the released-definition runs, and the paired differences with 95% intervals."""
    pick = picks(runs)
    by = {label: {r.seed: r.heldout for r in primary(runs, label, family, pick)} for label, family, _ in RELEASED}
    seeds = sorted(set().union(*by.values()))
    for label, family in (("fox_pro", "fox"), ("transformer_pro", "transformer"), ("fox_pro_no_kv_shift", "fox")):
        by[label] = {r.seed: r.heldout for r in primary(runs, label, family, pick)}
    if not seeds:
        return "Not run yet: `--parts released`."
    rows = [[str(seed), *(_fmt(by[label].get(seed)) for label, _, _ in RELEASED)] for seed in seeds]
    rows.append(["mean", *(_fmt(float(np.mean(list(by[label].values()))) if by[label] else None)
                           for label, _, _ in RELEASED)])
    text = _table(["seed", *(f"{name} (lr {pick.get(family, float('nan')):g})" for _, family, name in RELEASED)],
                  rows)
    diff_rows = []
    for label, base, sign, name in RELEASED_PAIRS:
        common = sorted(set(by[label]) & set(by[base]))
        diffs = [by[label][s] - by[base][s] for s in common]
        ci = paired_interval(diffs)
        diff_rows.append([name, ", ".join(f"{d:+.4f}" for d in diffs),
                          f"{ci[0]:+.4f} [{ci[1]:+.4f}, {ci[2]:+.4f}]" if ci else "–",
                          {None: "–", 1: "higher", -1: "lower"}[sign], verdict(ci, sign)])
    return text + "\n\n" + _table(["paired difference (nats/token)", "per seed", "mean [95% interval]",
                                   "paper: first is", "verdict"], diff_rows, "lllll")


# The PaTH comparison: each model's position information, at its family's pick (PaTH at FoX (Pro)'s)
PATH_ROWS = (("transformer_pro", "transformer", "RoPE"), ("fox_pro", "fox", "forget gate"),
             ("path_pro", "fox", "PaTH"), ("path_fox_pro", "fox", "PaTH + forget gate"))


def path_runs(runs: list[RunResult]) -> list[tuple[RunResult, str]]:
    """(seed-0 run at the pick, position information) per model of the PaTH comparison that has one."""
    pick, out = picks(runs), []
    for label, family, position in PATH_ROWS:
        rs = [r for r in primary(runs, label, family, pick) if r.seed == 0]
        if rs:
            out.append((rs[0], position))
    return out


def path_table(runs: list[RunResult]) -> str:
    chosen = path_runs(runs)
    if not any(r.label.startswith("path") for r, _ in chosen):
        return "Not run yet: `--parts path`."
    rows = []
    for r, position in chosen:
        rows.append([f"{LABELS[r.label]} ({r.name})", position, _fmt(r.heldout),
                     _fmt(math.exp(r.heldout), 2) if math.isfinite(r.heldout) else "–", *_band_cells(r.loss_curve)])
    return _table(["model (run)", "position information", "held-out loss", "perplexity",
                   *[f"L, i in {a:,}–{b:,}" for a, b in BANDS], "L(8,193–16,384) − L(513–4,096)"], rows, "llrrrrrrr")


def runs_table(runs: list[RunResult]) -> str:
    rows = [[r.name, r.part, _fmt(r.heldout), f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "–", r.device,
             r.versions] for r in runs]
    return _table(["run", "part", "held-out loss", "tokens/s", "device", "versions"], rows, "llrrll")


def render_tables(out) -> dict[str, str]:
    runs = load_results(out)
    return {"sweep": sweep_table(runs), "claim1": claim1_table(runs),
            "claim2": claim2_table(runs) + "\n\n" + claim2_gap_table(runs), "claim3": claim3_table(runs),
            "claim4": claim4_table(runs), "claim5": claim5_table(runs), "claim6": claim6_table(runs),
            "path": path_table(runs), "released": released_table(runs), "llama_sweep": llama_sweep_table(runs),
            "runs": runs_table(runs)}


def write_plots(out, image_dir) -> list[Path]:
    """The L(i) figures of the main models (claim 2) and of the PaTH comparison, and the ACP histogram of FoX (Pro)
    (claim 5)."""
    from eval.per_token_loss.plot import plot_per_token_loss

    runs, image_dir, files = load_results(out), Path(image_dir), []
    chosen = claim2_runs(runs)
    if chosen:
        files.append(plot_per_token_loss([r.path / "per_token_loss.json" for r in chosen],
                                         image_dir / "books_per_token_loss.png", window=501,
                                         labels=[LABELS.get(r.label, r.label) for r in chosen]))
    chosen = [r for r, _ in path_runs(runs) if r.loss_curve is not None]
    if any(r.label.startswith("path") for r in chosen):
        files.append(plot_per_token_loss([r.path / "per_token_loss.json" for r in chosen],
                                         image_dir / "books_per_token_loss_path.png", window=501,
                                         labels=[LABELS[r.label] for r in chosen]))
    fox = [r for r in primary(runs, "fox_pro", "fox", picks(runs)) if (r.path / "acp" / "acp.png").is_file()]
    if fox:
        shutil.copyfile(fox[0].path / "acp" / "acp.png", image_dir / "books_acp_fox_pro.png")
        files.append(image_dir / "books_acp_fox_pro.png")
    return files


def write_report(out, image_dir=None) -> Path:
    """``OUT/report.md`` with every table, and the plots (in ``image_dir``, default OUT)."""
    out = Path(out)
    plots = write_plots(out, image_dir or out)
    parts = [f"## {name}\n\n{text}" for name, text in render_tables(out).items()]
    parts.append("## plots\n\n" + "\n".join(f"- {p}" for p in plots))
    report = out / "report.md"
    report.write_text("\n\n".join(parts) + "\n")
    return report


BEGIN, END = "<!-- begin table: {} -->", "<!-- end table: {} -->"


def doc_blocks(text: str) -> dict[str, str]:
    """The generated tables of a document: ``{name: text between its begin / end markers}``."""
    blocks, pos = {}, 0
    while (i := text.find("<!-- begin table: ", pos)) != -1:
        name = text[i + len("<!-- begin table: "):text.index(" -->", i)]
        start = text.index("-->", i) + 3
        stop = text.find(END.format(name), start)
        if stop == -1:
            raise ValueError(f"'{BEGIN.format(name)}' has no '{END.format(name)}'")
        blocks[name] = text[start:stop].strip("\n")
        pos = stop
    return blocks


def update_doc(doc, tables: dict[str, str]) -> Path:
    """Rewrite every generated table of ``doc`` (docs/reproduction.md) from ``tables``; an unknown name is an error."""
    doc = Path(doc)
    text = doc.read_text()
    for name in doc_blocks(text):
        if name not in tables:
            raise ValueError(f"{doc}: table '{name}' is not one of {sorted(tables)}")
        a = text.index(BEGIN.format(name)) + len(BEGIN.format(name))
        b = text.index(END.format(name))
        text = text[:a] + "\n" + tables[name] + "\n" + text[b:]
    doc.write_text(text)
    return doc
