"""The reproduction report: tables and plots of the claims from the result files ``scripts/reproduce.py`` writes
(``OUT/runs/<run>/``); no model or GPU needed.

    python scripts/reproduce.py books --out results/books --report      # OUT/report.md and OUT/*.png
    python scripts/make_tables.py --table books --inputs results/books  # the tables alone

``render_tables(out)`` returns ``{name: markdown}`` for the generated blocks of docs/reproduction.md: the tables
(``sweep``, ``claim1`` ... ``claim6``, ``baselines``, ``path``, ``released``, ``llama_sweep``, ``runs``) and the
verdicts written from the same numbers (``eval.reproduction_verdicts``); a claim whose runs are missing says which.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np

from forgetting_transformer.markdown import table
from eval.reproduction_results import (ABLATIONS, BANDS, BASELINES, FAMILY, LABELS, LONG, ROW_BANDS, RunResult,
                                       alone, band_cells, bands_of, baseline_pick,
                                       by_seed, claim2_runs, compared, display_name, fmt, interval_text, llama_pick,
                                       load_results, paired, paired_interval, path_pairs, path_rates, picks,
                                       primary, row_band_diffs,
                                       verdict)
from eval.reproduction_acp import claim4_table
from eval.reproduction_probes import copy_frontier_plots, probe_tables
from eval.reproduction_sweeps import sweep_tables
from eval.reproduction_verdicts import verdicts

__all__ = ["FAMILY", "load_results", "paired_interval", "picks", "render_tables", "update_doc", "verdict",
           "write_report"]

def sweep_table(runs: list[RunResult]) -> str:
    lrs = sorted({r.lr for r in runs if r.part.startswith("lr")})
    if not lrs:
        return "Not run yet: `--parts lr,lr-wide`."
    rows = []
    for model in FAMILY.values():
        by_lr = {r.lr: r.heldout for r in runs if r.label == model and r.part.startswith("lr")}
        best = min(by_lr.values()) if by_lr else None
        rows.append([LABELS[model]] + [("**" + fmt(by_lr[lr]) + "**" if by_lr.get(lr) == best else fmt(by_lr.get(lr)))
                                       for lr in lrs])
    return table(["held-out loss (nats/token) at peak lr"] + [f"{lr:g}" for lr in lrs], rows)


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
        rows.append([LABELS[label]] + [("**" + fmt(by_lr[lr]) + "**" if best[label] and lr == best[label][0]
                                        else fmt(by_lr.get(lr))) for lr in lrs])
    text = table(["held-out loss (nats/token) at peak lr, seed 0"] + [f"{lr:g}" for lr in lrs], rows)
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
    """Held-out loss per seed of claim 1's models (``compared``), and the paired differences with 95% intervals."""
    chosen = [(label, lr, by_seed(runs, label, lr)) for label, lr in compared(runs)]
    if not chosen:
        return "Not run yet: `--parts lr,lr-wide,released`."
    seeds = sorted({s for _, _, rs in chosen for s in rs})
    rows = []
    for label, lr, rs in chosen:
        mean = float(np.mean([r.heldout for r in rs.values()]))
        params = next((r.params for r in rs.values() if r.params), None)
        rows.append([LABELS[label], f"{lr:g}", f"{params:.1f}M" if params else "–",
                     *(fmt(rs[s].heldout) if s in rs else "–" for s in seeds), fmt(mean), fmt(math.exp(mean), 2)])
    text = table(["model", "peak lr", "parameters", *(f"seed {s}" for s in seeds), "mean", "perplexity"], rows)
    got = {label: rs for label, _, rs in chosen}
    return text + "\n\n" + pairs_table([(name, paired(got[first], got[second]), sign)
                                         for first, second, sign, name in CLAIM1_PAIRS
                                         if first in got and second in got])


def pairs_table(pairs: list[tuple[str, list[float], int | None]]) -> str:
    """(name, paired differences, the paper's sign of them or None) → the table of means, 95% intervals and
    verdicts."""
    rows = [[name, ", ".join(f"{d:+.4f}" for d in diffs), interval_text(ci := paired_interval(diffs)),
             {None: "–", 1: "higher", -1: "lower"}[sign], verdict(ci, sign)] for name, diffs, sign in pairs]
    return table(["paired difference (nats/token)", "per seed", "mean [95% interval]", "paper: first is", "verdict"],
                 rows, "lllll")


# (first, second, the sign of first − second in the paper, name): the paper's order of its seven models (Table 1)
CLAIM1_PAIRS = (("transformer_pro_released", "fox_pro_released", +1, "Transformer (Pro) − FoX (Pro)"),
                ("transformer_llama", "fox_llama", +1, "Transformer (LLaMA) − FoX (LLaMA)"),
                ("fox_llama", "fox_pro_released", +1, "FoX (LLaMA) − FoX (Pro)"),
                *((b, "fox_pro_released", +1, f"{LABELS[b]} − FoX (Pro)") for b in BASELINES))


def baselines_table(runs: list[RunResult]) -> str:
    """The recurrent baselines' 3-point learning-rate check (seed 0), the best of each in bold."""
    rs = [r for r in runs if r.part == "baselines"]
    if not rs:
        return "Not run yet: `--parts baselines`."
    lrs, best, rows = sorted({r.lr for r in rs}), baseline_pick(runs), []
    for label in BASELINES:
        got = {r.lr: r for r in rs if r.label == label and r.seed == 0}
        cells = [("**" + fmt(got[lr].heldout) + "**" if lr == best.get(label) else fmt(got[lr].heldout))
                 if lr in got else "–" for lr in lrs]
        speed = got[best[label]].tokens_per_s if label in best and alone(got[best[label]]) else None
        params = next((r.params for r in got.values() if r.params), None)
        rows.append([LABELS[label], f"{params:.1f}M" if params else "–", *cells,
                     f"{speed:,.0f}" if speed else "–"])
    return table(["held-out loss (nats/token) at peak lr, seed 0", "parameters", *(f"{lr:g}" for lr in lrs),
                  "tokens/s at the best rate"], rows)


def claim2_table(runs: list[RunResult]) -> str:
    chosen = claim2_runs(runs)
    if not chosen:
        return "Not run yet."
    heads = [f"L, i in {a:,}–{b:,}" for a, b in BANDS]
    rows = [[f"{LABELS.get(r.label, r.label)} ({r.name})", *band_cells(r.loss_curve)] for r in chosen]
    return table(["model (run)", *heads, "L(8,193–16,384) − L(513–4,096)"], rows)


GAP_PAIRS = (("fox_pro_released", "transformer_pro_released", "Pro"), ("fox_llama", "transformer_llama", "LLaMA"))


def claim2_gap_table(runs: list[RunResult]) -> str:
    """Transformer − FoX per position band, per seed and as a mean over seeds with its 95% interval."""
    lrs, rows = dict(compared(runs)), []
    for fox, tf, name in GAP_PAIRS:
        f = {s: r for s, r in by_seed(runs, fox, lrs.get(fox)).items() if r.loss_curve is not None}
        t = {s: r for s, r in by_seed(runs, tf, lrs.get(tf)).items() if r.loss_curve is not None}
        common = sorted(set(f) & set(t))
        gaps = [[None if x is None or y is None else y - x
                 for x, y in zip(bands_of(f[s].loss_curve), bands_of(t[s].loss_curve))] for s in common]
        rows += [[f"{name}, seed {s}", *(fmt(g) for g in gap)] for s, gap in zip(common, gaps)]
        if len(gaps) > 1 and all(g is not None for gap in gaps for g in gap):
            rows.append([f"{name}, mean [95% interval]",
                         *(interval_text(paired_interval([g[k] for g in gaps])) for k in range(len(BANDS)))])
    if not rows:
        return "Not run yet."
    return table(["Transformer − FoX", *[f"i in {a:,}–{b:,}" for a, b in BANDS]], rows)


def claim2_rows_table(runs: list[RunResult]) -> str:
    """Transformer − FoX per band over the held-out rows of one seed: the mean of the per-row differences and its
    95% interval across rows (runs that kept per-row losses)."""
    lrs, rows = dict(compared(runs)), []
    for fox, tf, name in GAP_PAIRS:
        f, t = by_seed(runs, fox, lrs.get(fox)), by_seed(runs, tf, lrs.get(tf))
        for s in sorted(set(f) & set(t)):
            diffs = [row_band_diffs(t[s], f[s], a, b) for a, b in ROW_BANDS]
            if all(d is not None for d in diffs):
                rows.append([f"{name}, seed {s} ({len(diffs[0])} rows)",
                             *(interval_text(paired_interval(d)) for d in diffs)])
    if not rows:
        return "No pair of runs kept per-row losses yet."
    return table(["Transformer − FoX over rows", *[f"i in {a:,}–{b:,}" for a, b in ROW_BANDS]], rows)


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
    return head + table(["layer", "decay time −1/mean log f (tokens): min / median / max",
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
    return (table(["model (run)", "mode", *[f"{n:,}" for n in lengths], "mean"], rows)
            + "\n\nScore 1 (no key word of the answer) to 10 (all of them), mean over depths.")


# The released definition (part "released"): per-head output norm and QK-norm eps 1e-5, at the families' picks
RELEASED = (("fox_pro_released", "fox", "FoX (Pro)"), ("transformer_pro_released", "transformer", "Transformer (Pro)"),
            ("fox_pro_released_no_kv_shift", "fox", "− KV-shift"), ("fox_pro_released_no_output_gate", "fox",
                                                                    "− output gate"),
            ("fox_pro_released_no_output_norm", "fox", "− output norm"), ("fox_pro_released_no_qk_norm", "fox",
                                                                         "− QK-norm"),
            ("fox_pro_released_data_independent", "fox", "data-indep. gate"),
            ("fox_pro_released_fixed", "fox", "fixed gate"), ("fox_pro_released_rope", "fox", "+ RoPE"))
# (label, baseline label, the sign of label − baseline the paper reports or None, name); the last three compare
# with the earlier definition's runs (output norm shared across heads, QK-norm eps 1e-6) at equal seeds
RELEASED_PAIRS = (("transformer_pro_released", "fox_pro_released", +1, "Transformer (Pro) − FoX (Pro)"),
                  *((f"fox_pro_released_no_{k}", "fox_pro_released", +1, f"FoX (Pro) − {n} − FoX (Pro)")
                    for k, n in (("kv_shift", "KV-shift"), ("output_gate", "output gate"),
                                 ("output_norm", "output norm"), ("qk_norm", "QK-norm"))),
                  ("fox_pro_released_data_independent", "fox_pro_released", +1,
                   "FoX (Pro), data-independent gate − FoX (Pro)"),
                  ("fox_pro_released_fixed", "fox_pro_released", +1, "FoX (Pro), fixed gate − FoX (Pro)"),
                  ("fox_pro_released_rope", "fox_pro_released", None, "FoX (Pro) + RoPE − FoX (Pro)"),
                  ("transformer_llama_no_rope", "transformer_llama", +1,
                   "Transformer (LLaMA) w/o RoPE − with RoPE, both at the LLaMA pick"),
                  ("fox_pro_released", "fox_pro", None, "FoX (Pro): released − earlier definition"),
                  ("transformer_pro_released", "transformer_pro", None,
                   "Transformer (Pro): released − earlier definition"),
                  ("fox_pro_released_no_kv_shift", "fox_pro_no_kv_shift", None,
                   "FoX (Pro) − KV-shift: released − earlier definition"))


def released_table(runs: list[RunResult]) -> str:
    """Held-out loss per seed of the released-definition runs, and the paired differences with 95% intervals."""
    pick = picks(runs)
    by = {label: {r.seed: r.heldout for r in primary(runs, label, family, pick)} for label, family, _ in RELEASED}
    seeds = sorted(set().union(*by.values()))
    for label, family in (("fox_pro", "fox"), ("transformer_pro", "transformer"), ("fox_pro_no_kv_shift", "fox")):
        by[label] = {r.seed: r.heldout for r in primary(runs, label, family, pick)}
    llama = llama_pick(runs).get("transformer_llama")  # released-gates trains without RoPE at the pair's own rate
    for label in ("transformer_llama_no_rope", "transformer_llama"):
        by[label] = {s: r.heldout for s, r in by_seed(runs, label, llama).items()}
    if not seeds:
        return "Not run yet: `--parts released`."
    cols = [c for c in RELEASED if by[c[0]]]  # the models run so far
    rows = [[str(seed), *(fmt(by[label].get(seed)) for label, _, _ in cols)] for seed in seeds]
    rows.append(["mean", *(fmt(float(np.mean(list(by[label].values())))) for label, _, _ in cols)])
    text = table(["seed", *(f"{name} (lr {pick.get(family, float('nan')):g})" for _, family, name in cols)], rows)
    pairs = [(name, [by[label][s] - by[base][s] for s in sorted(set(by[label]) & set(by[base]))], sign)
             for label, base, sign, name in RELEASED_PAIRS]
    pairs = [p for p in pairs if p[1]]  # the pairs run so far
    return text + "\n\n" + pairs_table(pairs)


def long_table(runs: list[RunResult]) -> str:
    """Held-out loss per seed of the long part's runs beside the same model and seed at the protocol's tokens, and
    the paired differences with 95% intervals (the 1x gap over the seeds the long part has)."""
    pick = picks(runs)
    by = {label: {r.seed: r for r in primary(runs, label, family, pick)}
          for long, short, family, _ in LONG for label in (long, short)}
    seeds = sorted(set().union(*(by[long] for long, _, _, _ in LONG)))
    if not seeds:
        return "Not run yet: `--parts long`."
    def cell(label: str, seed: int) -> str:
        return fmt(by[label][seed].heldout) if seed in by[label] else "–"

    rows = [[str(seed), *(cell(label, seed) for long, short, _, _ in LONG for label in (long, short))]
            for seed in seeds]
    text = table(["seed", *(f"{name}, {x}" for _, _, _, name in LONG for x in ("4× tokens", "1×"))], rows)
    (fox, fox1), (tr, tr1), (nokv, _) = ((long, short) for long, short, _, _ in LONG)
    at = {label: {s: r for s, r in by[label].items() if s in seeds} for label in (fox1, tr1)}
    pairs = [("Transformer (Pro) − FoX (Pro), 4× tokens", paired(by[tr], by[fox]), +1),
             ("Transformer (Pro) − FoX (Pro), 1×, the same seeds", paired(at[tr1], at[fox1]), +1),
             ("FoX (Pro) − KV-shift − FoX (Pro), 4× tokens", paired(by[nokv], by[fox]), +1),
             ("FoX (Pro): 4× − 1× tokens", paired(by[fox], by[fox1]), None)]
    return text + "\n\n" + pairs_table([p for p in pairs if p[1]])


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


def path_released_table(runs: list[RunResult]) -> str:
    """The released PaTH models per seed beside the released pair, their paired differences, and the rate check."""
    pick, rates = picks(runs), path_rates(runs)
    cols = [(label, pick.get(family)) for label, family in (("path_pro_released", "fox"), ("path_fox_pro_released",
            "fox"), ("fox_pro_released", "fox"), ("transformer_pro_released", "transformer"))]
    by = {label: by_seed(runs, label, lr) for label, lr in cols}
    seeds = sorted(set(by["path_pro_released"]) | set(by["path_fox_pro_released"]))
    rows = [[str(s), *(fmt(by[label][s].heldout) if s in by[label] else "–" for label, _ in cols)] for s in seeds]
    text = table(["seed", *(f"{LABELS[label]} (lr {lr:g})" for label, lr in cols)], rows)
    text += "\n\n" + pairs_table([p for p in path_pairs(runs) if p[1]])
    lrs = sorted({lr for by_lr in rates.values() for lr in by_lr})
    if len(lrs) > 1:
        text += "\n\n" + table(["held-out loss at peak lr, seed 0", *(f"{lr:g}" for lr in lrs)], [
            [LABELS[label], *(("**" + fmt(by_lr[lr]) + "**" if by_lr.get(lr) == min(by_lr.values()) else
                               fmt(by_lr.get(lr))) for lr in lrs)] for label, by_lr in rates.items() if by_lr])
    return text


def path_table(runs: list[RunResult]) -> str:
    chosen = path_runs(runs)
    released = any(r.label.startswith("path") and r.label.endswith("_released") for r in runs)
    if not any(r.label.startswith("path") for r, _ in chosen):
        return path_released_table(runs) if released else "Not run yet: `--parts path`."
    rows = []
    for r, position in chosen:
        rows.append([f"{LABELS[r.label]} ({r.name})", position, fmt(r.heldout),
                     fmt(math.exp(r.heldout), 2) if math.isfinite(r.heldout) else "–", *band_cells(r.loss_curve)])
    text = table(["model (run)", "position information", "held-out loss", "perplexity",
                  *[f"L, i in {a:,}–{b:,}" for a, b in BANDS], "L(8,193–16,384) − L(513–4,096)"], rows, "llrrrrrrr")
    return text + ("\n\nThe released definition (`--parts path-released,path-lr`):\n\n" + path_released_table(runs)
                   if released else "")


def runs_table(runs: list[RunResult]) -> str:
    rows = [[r.name, r.part, fmt(r.heldout), f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "–", str(r.gpu_jobs),
             r.device, r.versions] for r in runs]
    return table(["run", "part", "held-out loss", "tokens/s", "runs on its GPU", "device", "versions"], rows,
                 "llrrrll")


def render_tables(out) -> dict[str, str]:
    runs = load_results(out)
    return {"sweep": sweep_table(runs), "claim1": claim1_table(runs),
            "claim2": claim2_table(runs) + "\n\n" + claim2_gap_table(runs) + "\n\n" + claim2_rows_table(runs),
            "claim3": claim3_table(runs), "baselines": baselines_table(runs),
            "claim4": claim4_table(runs), "claim5": claim5_table(runs), "claim6": claim6_table(runs),
            "path": path_table(runs), "released": released_table(runs), "llama_sweep": llama_sweep_table(runs),
            "long": long_table(runs),
            "runs": runs_table(runs), **verdicts(runs), **probe_tables(runs), **sweep_tables(runs)}


def write_plots(out, image_dir) -> list[Path]:
    """The L(i) figures of the main models (claim 2) and of the PaTH comparison, and the ACP histogram of FoX (Pro)
    (claim 5)."""
    from eval.per_token_loss.plot import plot_per_token_loss

    runs, image_dir, files = load_results(out), Path(image_dir), []
    chosen = claim2_runs(runs)
    if chosen:
        files.append(plot_per_token_loss([r.path / "per_token_loss.json" for r in chosen],
                                         image_dir / "books_per_token_loss.png", window=501,
                                         labels=[display_name(r, chosen) for r in chosen]))
    chosen = [r for r, _ in path_runs(runs) if r.loss_curve is not None]
    if any(r.label.startswith("path") for r in chosen):
        files.append(plot_per_token_loss([r.path / "per_token_loss.json" for r in chosen],
                                         image_dir / "books_per_token_loss_path.png", window=501,
                                         labels=[LABELS[r.label] for r in chosen]))
    fox = [r for r in primary(runs, "fox_pro", "fox", picks(runs)) if (r.path / "acp" / "acp.png").is_file()]
    if fox:
        shutil.copyfile(fox[0].path / "acp" / "acp.png", image_dir / "books_acp_fox_pro.png")
        files.append(image_dir / "books_acp_fox_pro.png")
    return files + copy_frontier_plots(runs, image_dir)


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
