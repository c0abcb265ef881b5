"""The verdicts of docs/reproduction.md, written from the result files like its tables: every measured number in
a verdict comes from ``OUT/runs/`` (``eval.reproduction_results``), so the prose cannot drift from the files.

``verdicts(runs)`` returns ``{block name: markdown}``: ``verdicts`` (the summary table) and ``verdict_<section>``
for each claim. A verdict whose runs are missing says so.
"""

from __future__ import annotations

import math

import numpy as np

from forgetting_transformer.markdown import table
from eval.reproduction_acp import acp_rows, claim4
from eval.reproduction_probes import retrieval_summary
from eval.reproduction_sweeps import lengths_row, tmax_row
from eval.reproduction_results import (BANDS, LABELS, ROW_BANDS, RunResult, alone, bands_of, baseline_pick, by_seed,
                                       claim2_runs, compared, display_name, full_curve, full_seeds, llama_pick,
                                       paired, paired_interval, path_pairs, path_rates, picks, primary, rise_past,
                                       row_band_diffs, verdict)

PAPER_PPL = {"Pro": (6.62, 6.82), "LLaMA": (7.25, 7.49)}  # FoX paper, Table 3: (FoX, Transformer) at 360M
PAPER_GAP = math.log(PAPER_PPL["Pro"][1] / PAPER_PPL["Pro"][0])  # its Transformer (Pro) − FoX (Pro), nats/token
GLOBAL_PRUNED = 0.10  # a head with at most this share of its tiles pruned counts as global (claim 5)


def _d(x: float) -> str:
    """A loss difference in nats/token, signed."""
    return f"{x:+.3f}"


def _ci(diffs: list[float]) -> str:
    ci = paired_interval(diffs)
    return f"[{ci[1]:+.3f}, {ci[2]:+.3f}]" if ci else "(one seed)"


def _pair(runs, first: str, second: str, sign: int = +1) -> tuple[list[float], str]:
    lrs = dict(compared(runs))
    diffs = paired(by_seed(runs, first, lrs.get(first)), by_seed(runs, second, lrs.get(second)))
    return diffs, verdict(paired_interval(diffs), sign)


def _seeds_verdict(diffs: list[float], sign: int) -> str:
    """The verdict, with one seed called inconclusive plainly (the count is said beside it)."""
    return verdict(paired_interval(diffs), sign) if len(diffs) > 1 else "inconclusive"


REMOVALS = (("kv_shift", "KV-shift"), ("output_gate", "output gate"), ("output_norm", "output norm"),
            ("qk_norm", "QK-norm"))


def removals(runs) -> list[tuple[str, list[float]]]:
    """(switch name, released FoX (Pro) without it − with it at each shared seed) for the four Pro switches."""
    lr = picks(runs).get("fox")
    return [(name, paired(by_seed(runs, f"fox_pro_released_no_{k}", lr), by_seed(runs, "fox_pro_released", lr)))
            for k, name in REMOVALS]


# Table 3's gates and RoPE on the released definition (part released-gates): (label, its baseline, the paper's
# claim, the sign of label − baseline it reports or None: no difference)
GATES = (("fox_pro_released_data_independent", "fox_pro_released",
          "A data-independent forget gate is worse than the data-dependent one", +1),
         ("fox_pro_released_fixed", "fox_pro_released", "A fixed forget gate is worse than the data-dependent one", +1),
         ("fox_pro_released_rope", "fox_pro_released", "RoPE adds nothing to FoX (Pro)", None),
         ("transformer_llama_no_rope", "transformer_llama", "The Transformer (LLaMA) needs RoPE", +1))


def gate_diffs(runs) -> list[tuple[str, list[float], int | None]]:
    """(claim, label − baseline at each shared seed, the paper's sign) for GATES: the FoX models at the FoX pick,
    the Transformer (LLaMA) pair at its own rate."""
    rates = {"fox": picks(runs).get("fox"), "transformer": llama_pick(runs).get("transformer_llama")}
    return [(claim, paired(by_seed(runs, label, rates[label.split("_")[0]]),
                           by_seed(runs, base, rates[label.split("_")[0]])), sign)
            for label, base, claim, sign in GATES]


def _gate_verdict(diffs: list[float], sign: int | None) -> str:
    n = f"{_seeds(len(diffs))}, released definition"
    if not diffs:
        return "not run (`--parts released-gates`)"
    if sign is not None:
        return f"{_seeds_verdict(diffs, sign)} ({n})"
    ci, mean = paired_interval(diffs), float(np.mean(diffs))
    if ci is None:
        return f"inconclusive ({n})"
    if ci[1] <= 0 <= ci[2]:
        return f"no difference measured ({n})"
    return f"differs: {'higher' if mean > 0 else 'lower'} by {abs(mean):.3f} nats/token ({n})"


def baseline_diffs(runs) -> dict[str, list[float]]:
    """label → the baseline at its best rate minus FoX (Pro) at the same seeds (claim 1's paired differences)."""
    fox = by_seed(runs, "fox_pro_released", picks(runs).get("fox"))
    return {b: paired(by_seed(runs, b, lr), fox) for b, lr in baseline_pick(runs).items()}


def _seeds(n: int) -> str:
    return f"{n} seed{'s' * (n != 1)}"


def _mid_sentence(claim: str) -> str:
    """A claim continued inside a sentence: its first word lower-cased unless it is an acronym ("RoPE")."""
    return claim if any(c.isupper() for c in claim.split()[0][1:]) else claim[0].lower() + claim[1:]


def claim1(runs: list[RunResult]) -> str:
    pro, v_pro = _pair(runs, "transformer_pro_released", "fox_pro_released")
    llama, v_llama = _pair(runs, "transformer_llama", "fox_llama")
    order, v_order = _pair(runs, "fox_llama", "fox_pro_released")
    if not pro or not llama:
        return "Not run yet: `--parts released,llama-seeds`."
    lrs = dict(compared(runs))
    mean = {label: float(np.mean([r.heldout for r in by_seed(runs, label, lr).values()])) for label, lr in lrs.items()}
    pairs = (("Pro", "fox_pro_released", "transformer_pro_released"), ("LLaMA", "fox_llama", "transformer_llama"))
    ratio = {name: math.exp(mean[f] - mean[t]) for name, f, t in pairs}
    paper = {name: f / t for name, (f, t) in PAPER_PPL.items()}
    text = (f"**Verdict: Pro pair {v_pro}, LLaMA pair {v_llama}, at {len(pro)} and {len(llama)} seeds.** "
            f"Transformer (Pro) − FoX (Pro) is {_d(np.mean(pro))} nats/token, 95% interval {_ci(pro)}. "
            f"Transformer (LLaMA) − FoX (LLaMA) is {_d(np.mean(llama))}, {_ci(llama)}, both LLaMA models at "
            f"{lrs['fox_llama']:g}. The gaps are larger than the paper's: FoX / Transformer perplexity ratios "
            f"{ratio['Pro']:.2f} (Pro) and {ratio['LLaMA']:.2f} (LLaMA) here, {paper['Pro']:.2f} and "
            f"{paper['LLaMA']:.2f} in the paper.")
    if order:
        text += (f" The paper's FoX (Pro) beats its FoX (LLaMA); here FoX (LLaMA) − FoX (Pro) is "
                 f"{_d(np.mean(order))}, {_ci(order)}: {v_order}.")
    return text + "\n\n" + baselines_sentence(runs)


def baselines_sentence(runs) -> str:
    diffs = baseline_diffs(runs)
    if not diffs:
        return "The recurrent baselines: not run yet (`--parts baselines`)."
    parts = [f"{LABELS[b]} {_d(np.mean(d))}{f' {_ci(d)}' * (len(d) > 1)}, {_seeds_verdict(d, +1)} "
             f"({_seeds(len(d))})" for b, d in diffs.items() if d]
    text = ("**The paper's recurrent baselines** at their best rate, minus FoX (Pro) at the same seeds (the paper: "
            f"every baseline above both FoX models, Table 1 of docs/official.md): {'; '.join(parts)}.")
    if short := [LABELS[b] for b, d in diffs.items() if len(d) < 3]:
        text += f" {' and '.join(short)} {'has' if len(short) == 1 else 'have'} fewer than three seeds."
    return text


def baselines(runs: list[RunResult]) -> str:
    best = baseline_pick(runs)
    if not best:
        return "Not run yet: `--parts baselines`."
    grid = {b: sorted(r.lr for r in runs if r.part == "baselines" and r.label == b and r.seed == 0) for b in best}
    edge = [LABELS[b] for b, lr in best.items() if lr in (grid[b][0], grid[b][-1])]
    fox = list(by_seed(runs, "fox_pro_released", picks(runs).get("fox")).values())
    text = f"Best rates: {', '.join(f'{LABELS[b]} {lr:g}' for b, lr in best.items())}."
    if edge:
        text += (f" For {' and '.join(edge)} the best rate is an end of the grid, so a rate beyond it may be "
                 "better still.")
    speeds = []
    for b, lr in best.items():
        r = by_seed(runs, b, lr)[0]
        same = [x.tokens_per_s for x in fox if x.device == r.device and alone(x)]
        if same and alone(r):
            speeds.append(f"{LABELS[b]} {r.tokens_per_s / np.mean(same):.2f}× on an {r.device}")
    if speeds:
        text += (f" Training speed against FoX (Pro) (the mean of its seeds on the same GPU model): "
                 f"{', '.join(speeds)}; Mamba-2 runs fla's chunked GLA kernels on Hopper (docs/baselines.md).")
    return text


def claim2(runs: list[RunResult]) -> str:
    chosen = [r for r in claim2_runs(runs) if full_curve(r)]
    if not chosen:
        return f"No run has L(i) to {BANDS[-1][1]:,} tokens yet."
    lrs = dict(compared(runs))
    flat = [f"{LABELS[r.label]} {_d(rise_past(r))}" for r in chosen if "transformer" not in r.label]
    rope = [f"{LABELS[r.label]} at {r.lr:g} {_d(rise_past(r))}" for r in chosen
            if r.label.startswith("transformer") and "no_rope" not in r.label]
    text = (f"**Verdict: beyond the training length, {_beyond(chosen)}; \"the advantage grows with position\" inside "
            f"it: {_grows(runs)[1]}.** From the 513–4,096 band to the 8,193–16,384 band, L(i) changes by "
            f"{', '.join(flat)} nats for the models without RoPE, and by {', '.join(rope)} for the Transformers "
            "with RoPE.")
    no_rope = [r for r in chosen if r.label == "transformer_llama_no_rope"]
    partner = [r for r in chosen if r.label == "transformer_llama" and no_rope and r.lr == no_rope[0].lr]
    if no_rope and partner:
        gaps = [n - p for n, p in zip(bands_of(no_rope[0].loss_curve), bands_of(partner[0].loss_curve))]
        text += (f" The Transformer (LLaMA) without RoPE changes by {_d(rise_past(no_rope[0]))} past the training "
                 f"length; against its RoPE counterpart at the same rate ({partner[0].lr:g}) it is "
                 f"{', '.join(f'{g:+.2f}' for g in gaps)} nats/token in the four bands: far worse inside the training "
                 "length, less so beyond it.")
    text += " " + inside_sentence(runs, lrs) + " " + rises_sentence(chosen)
    return text


def _beyond(chosen: list[RunResult]) -> str:
    """FoX's L(i) flat or falling past the training length, every Transformer with RoPE rising."""
    chosen = [r for r in chosen if full_curve(r)]
    flat = all(rise_past(r) <= 0 for r in chosen if "transformer" not in r.label)
    rises = all(rise_past(r) > 0 for r in chosen if r.label.startswith("transformer") and "no_rope" not in r.label)
    return ("reproduced" if flat and rises else "not reproduced") if chosen else "not run yet"


def _grows(runs) -> tuple[list[float], str]:
    """Per seed of the Pro pair, the Transformer − FoX gap in 513–4,096 minus the gap in 1–512, and its verdict."""
    lrs = dict(compared(runs))
    f = full_seeds(runs, "fox_pro_released", lrs.get("fox_pro_released"))
    t = full_seeds(runs, "transformer_pro_released", lrs.get("transformer_pro_released"))
    grows = paired(t, f, lambda r: bands_of(r.loss_curve)[1] - bands_of(r.loss_curve)[0])
    return grows, f"{verdict(paired_interval(grows), +1)} (Pro pair, {len(grows)} seeds)"


def inside_sentence(runs, lrs) -> str:
    out = []
    for fox, tf, name in (("fox_pro_released", "transformer_pro_released", "Pro"),
                          ("fox_llama", "transformer_llama", "LLaMA")):
        f, t = full_seeds(runs, fox, lrs.get(fox)), full_seeds(runs, tf, lrs.get(tf))
        first = paired(t, f, lambda r: bands_of(r.loss_curve)[0])
        rest = paired(t, f, lambda r: bands_of(r.loss_curve)[1])
        if first:
            out.append(f"{name} {np.mean(first):.3f} in 1–512 against {np.mean(rest):.3f} in 513–4,096")
    text = (f"Inside the training length the mean Transformer − FoX gap over seeds is {'; '.join(out)}: FoX gains "
            "most on the first tokens at this scale.")
    t, f = by_seed(runs, "transformer_llama", lrs.get("transformer_llama")), by_seed(runs, "fox_llama",
                                                                                      lrs.get("fox_llama"))
    rows = [(s, row_band_diffs(t[s], f[s], *ROW_BANDS[1])) for s in sorted(set(t) & set(f))]
    rows = [(s, d) for s, d in rows if d is not None]
    if rows:
        half = max((ci[2] - ci[1]) / 2 for _, d in rows if (ci := paired_interval(d)))
        text += (f" Across the {len(rows[0][1])} held-out rows of one seed the gap's 95% interval is at most "
                 f"±{half:.3f} nats/token per band (LLaMA pair, last table): the spread between seeds, not between "
                 "rows, limits these comparisons.")
    return text


def rises_sentence(chosen: list[RunResult]) -> str:
    """Which curves rise from the 2,049–3,072 band to the 3,073–4,096 band, inside the training length."""
    rising = [display_name(r, chosen) for r in chosen
              if r.loss_curve[3072:4096].mean() > r.loss_curve[2048:3072].mean()]
    if not rising:
        return "Every curve falls from the 2,049–3,072 band to the 3,073–4,096 band."
    return (f"L(i) is not monotone inside the training length: in 1,024-token bands, {len(rising)} of "
            f"{len(chosen)} curves rise from 2,049–3,072 to 3,073–4,096 ({', '.join(rising)}).")


def _spread(runs, label: str) -> tuple[float, int] | None:
    """A FoX (Pro) definition's seed spread (max − min held-out loss) at the FoX pick, and its number of seeds."""
    rs = by_seed(runs, label, picks(runs).get("fox"))
    return (max(r.heldout for r in rs.values()) - min(r.heldout for r in rs.values()), len(rs)) if len(rs) > 1 \
        else None


ABLATION_NAMES = {"fox_pro_no_kv_shift": "− KV-shift", "fox_pro_no_output_gate": "− output gate",
                  "fox_pro_no_output_norm": "− output norm", "fox_pro_no_qk_norm": "− QK-norm",
                  "fox_pro_data_independent": "data-independent gate", "fox_pro_fixed": "fixed gate",
                  "fox_pro_rope": "+ RoPE"}


def claim3(runs: list[RunResult]) -> str:
    pick = picks(runs)
    base = [r for r in primary(runs, "fox_pro", "fox", pick) if r.seed == 0]
    spread = _spread(runs, "fox_pro")
    if not base or spread is None:
        return "Not run yet: `--parts ablations,gates,released`."
    cost, helps, noise = [], [], []
    for label, name in ABLATION_NAMES.items():
        rs = [r for r in primary(runs, label, "fox", pick) if r.seed == 0]
        if rs:
            d = rs[0].heldout - base[0].heldout
            (cost if d > spread[0] else helps if d < -spread[0] else noise).append(f"{name} {_d(d)}")
    text = (f"**Verdict: inconclusive, one seed per row (the page's rule needs two).** As a first reading, the "
            f"differences from FoX (Pro) seed 0 of the same definition, against FoX (Pro)'s spread over {spread[1]} "
            f"seeds ({spread[0]:.3f} nats/token): ")
    groups = [("cost more than the spread, as in the paper", cost), ("lower the loss by more than it, against the "
              "paper", helps), ("stay inside it", noise)]
    text += "; ".join(f"{', '.join(items)} {what}" for what, items in groups if items) + "."
    no_rope = [r for r in runs if r.label == "transformer_llama_no_rope" and r.seed == 0 and r.lr == pick.get(
        "transformer")]
    rope = [r for r in runs if r.label == "transformer_llama" and no_rope and r.lr == no_rope[0].lr and r.seed == 0]
    if no_rope and rope:
        text += (f" The Transformer (LLaMA) without RoPE is {_d(no_rope[0].heldout - rope[0].heldout)} above it "
                 f"with RoPE (perplexity {math.exp(no_rope[0].heldout):.0f} against {math.exp(rope[0].heldout):.0f}).")
    return text + (" The data-independent and fixed gates keep the presets' (T_min, T_max), not swept. The section "
                   "*The released definition, several seeds* repeats the four Pro switches with the released models' "
                   "definition.")


def _heads(r: RunResult) -> dict:
    """Claim 5's counts on one run's ACP statistics: local heads (more than half their tiles pruned) of all heads,
    and per layer whether it holds a global head (GLOBAL_PRUNED or less), with those heads' decay times."""
    out = {"local": 0, "total": 0, "layers": len(r.acp["layers"]), "mixed": 0, "global": []}
    for layer in r.acp["layers"]:
        frac = np.asarray(layer["tile_fraction"])
        tau = -1.0 / np.minimum(np.asarray(layer["mean_log_fgate"]), -1e-12)
        out["total"], out["local"] = out["total"] + len(frac), out["local"] + int((frac > 0.5).sum())
        glob = frac <= GLOBAL_PRUNED
        if glob.any():
            out["global"].append(f"{layer['layer']} ({', '.join(f'{x:,.0f}' for x in sorted(tau[glob]))})")
            out["mixed"] += int((frac > 0.5).any())
    return out


def claim5_verdict(h: dict) -> str:
    """The paper's three statements: most heads local, some global, every layer holding both."""
    if h["local"] * 2 <= h["total"] or not h["global"]:
        return "contradicts the paper"
    if h["mixed"] < h["layers"]:
        return f"partly reproduced: most heads local, some global, but {h['mixed']} of {h['layers']} layers hold both"
    return "reproduced"


def claim5_overall(hs: list[dict]) -> str:
    """``claim5_verdict`` over seeds: their common verdict (for "partly", the range of layers holding both), or how
    the seeds split."""
    words = [claim5_verdict(h).split(":")[0] for h in hs]
    if len(set(words)) > 1:
        return "differs between seeds: " + ", ".join(f"{w} at {words.count(w)}" for w in dict.fromkeys(words))
    if words[0] != "partly reproduced":
        return words[0]
    mixed = sorted(h["mixed"] for h in hs)
    span = f"{mixed[0]}–{mixed[-1]}" if mixed[0] != mixed[-1] else f"{mixed[0]}"
    return f"partly reproduced: most heads local, some global, but {span} of {hs[0]['layers']} layers hold both"


def claim5_runs(runs) -> tuple[list[RunResult], list[RunResult]]:
    """The runs claim 5 reads: the released FoX (Pro) seeds at the FoX pick, and the earlier definition's run."""
    fox = picks(runs).get("fox")
    released = [r for _, r in sorted(by_seed(runs, "fox_pro_released", fox).items()) if r.acp is not None]
    return released, [r for r in primary(runs, "fox_pro", "fox", picks(runs)) if r.acp is not None]


def claim5_row(runs) -> list[str]:
    released, earlier = claim5_runs(runs)
    if released:
        said = f"{claim5_overall([_heads(r) for r in released])} ({_seeds(len(released))}, released definition)"
    else:
        said = f"{claim5_verdict(_heads(earlier[0]))} (one run)" if earlier else "not run"
    return ["5. Local and global heads", said]


def _released_heads(released: list[RunResult]) -> str:
    hs = [_heads(r) for r in released]
    rows = [[str(r.seed), f"{h['local']} of {h['total']}", f"{h['mixed']} of {h['layers']}",
             "; ".join(h["global"]) or "–", f"{100 * r.acp['tile_fraction']:.1f}"] for r, h in zip(released, hs)]
    return (f"**Verdict (released definition, {_seeds(len(released))}): {claim5_overall(hs)}.** FoX (Pro) as released "
            f"at the FoX pick, ACP's statistics over {released[0].acp['tokens']:,} tokens of a held-out book. A local "
            f"head has more than half its tiles pruned, a global head {100 * GLOBAL_PRUNED:.0f}% or fewer:\n\n"
            + table(["seed", "local heads", "layers holding both", "layers with a global head (its decay times, "
                     "tokens)", "% tiles pruned"], rows, "rrrlr"))


def claim5(runs: list[RunResult]) -> str:
    released, earlier = claim5_runs(runs)
    if not released and not earlier:
        return "Not run yet."
    text = _released_heads(released) + "\n\n" if released else ""
    if earlier:
        r, h = earlier[0], _heads(earlier[0])
        others = [100 * x.acp["tile_fraction"] for x in runs if x.acp and x.label == "fox_pro" and x is not r]
        text += (f"**{'Earlier definition' if released else 'Verdict'} ({r.name}, one run): {claim5_verdict(h)}.** "
                 f"{h['local']} of {h['total']} heads have more than half their tiles pruned (local heads). Layers "
                 f"with a global head ({100 * GLOBAL_PRUNED:.0f}% of its tiles pruned or fewer), with those heads' "
                 f"decay times −1/mean log f in tokens: {', '.join(h['global'])}. Overall ACP prunes "
                 f"{100 * r.acp['tile_fraction']:.1f}% of the forward tiles at {r.acp['tokens']:,} tokens; the paper "
                 "reports around 70% of attention FLOPs at every size it tested.")
        if others:
            text += f" The other FoX (Pro) runs of the earlier definition prune {min(others):.0f}–{max(others):.0f}%."
    return text.strip()


def path_released(runs: list[RunResult]) -> str | None:
    """The released PaTH models against the released pair at equal seeds, and their rate check; None before they
    have run."""
    pairs = [p for p in path_pairs(runs) if p[1]]
    if not pairs:
        return None
    said = [f"{name} {_d(np.mean(diffs))} {_ci(diffs)}, {_seeds_verdict(diffs, sign)} ({_seeds(len(diffs))})"
            for name, diffs, sign in pairs]
    text = f"**Verdict, released definition: {'; '.join(said)}.** The PaTH paper has both PaTH models lower."
    for label, by_lr in path_rates(runs).items():
        if len(by_lr) > 1:
            best, lrs = min(by_lr, key=by_lr.get), sorted(by_lr)
            where = "inside its grid" if lrs[0] < best < lrs[-1] else "an end of its grid"
            text += (f" {LABELS[label]}'s best rate at seed 0 over {', '.join(f'{x:g}' for x in lrs)} is {best:g}, "
                     f"{where}.")
    return text


def path(runs: list[RunResult]) -> str:
    released = path_released(runs)
    legacy = path_legacy(runs)
    if released is None:
        return legacy
    if legacy.startswith("Not run yet"):
        return released
    return released + "\n\n" + legacy.replace("**Verdict: inconclusive (one seed).**", "The earlier definition:")


def path_legacy(runs: list[RunResult]) -> str:
    pick = picks(runs)
    got = {label: {r.seed: r for r in primary(runs, label, family, pick)}
           for label, family in (("path_pro", "fox"), ("path_fox_pro", "fox"), ("fox_pro", "fox"),
                                 ("transformer_pro", "transformer"))}
    if 0 not in got["path_fox_pro"] or 0 not in got["fox_pro"]:
        return "Not run yet: `--parts path`."
    spread = _spread(runs, "fox_pro")
    d = got["path_fox_pro"][0].heldout - got["fox_pro"][0].heldout
    text = f"**Verdict: inconclusive (one seed).** PaTH-FoX (Pro) − FoX (Pro) at seed 0 is {_d(d)} nats/token"
    if spread:
        text += f", against FoX (Pro)'s spread of {spread[0]:.3f} over its {spread[1]} seeds of the same definition"
    text += "; the paper has PaTH-FoX ahead."
    if 0 in got["path_pro"] and 0 in got["transformer_pro"]:
        p, t = got["path_pro"][0], got["transformer_pro"][0]
        text += f" PaTH (Pro), without the gate, is {_d(p.heldout - t.heldout)} against the Transformer (Pro) with RoPE"
        text += (f", and its L(i) rises by {_d(rise_past(p))} past the training length against RoPE's "
                 f"{_d(rise_past(t))}." if full_curve(p) and full_curve(t) else ".")
    return text


def released(runs: list[RunResult]) -> str:
    rows = [f"removing {name} {_d(np.mean(diffs))} at {len(diffs)} seed{'s' * (len(diffs) > 1)} "
            f"({_seeds_verdict(diffs, +1)})" for name, diffs in removals(runs) if diffs]
    pro, v_pro = _pair(runs, "transformer_pro_released", "fox_pro_released")
    if not pro:
        return "Not run yet: `--parts released`."
    gates = [f"{_mid_sentence(claim)}: {_d(np.mean(diffs))}, {_ci(diffs)}, {_gate_verdict(diffs, sign)}"
             for claim, diffs, sign in gate_diffs(runs) if diffs]
    return (f"**Verdict.** Transformer (Pro) − FoX (Pro): {_d(np.mean(pro))}, {_ci(pro)}, {v_pro}."
            + (f" Against FoX (Pro) of the same seeds: {'; '.join(rows)}. The paper has every removal raising the "
               "loss." if rows else "")
            + (f" Table 3's gates and RoPE (each minus its baseline): {'; '.join(gates)}." if gates else ""))


def long_gaps(runs) -> tuple[list[float], list[float], list[float]] | None:
    """The long part's paired differences, or None before it ran: Transformer (Pro) − FoX (Pro) at 4x the tokens,
    the same at 1x at the same seeds, and FoX (Pro) without KV-shift − with it at 4x."""
    lr = dict(compared(runs))
    fox, tr = (by_seed(runs, f"{x}_4x", lr.get(x)) for x in ("fox_pro_released", "transformer_pro_released"))
    if not fox or not tr:
        return None
    seeds = sorted(set(tr) & set(fox))
    short = [by_seed(runs, x, lr.get(x)) for x in ("transformer_pro_released", "fox_pro_released")]
    gap1 = paired(*({s: r for s, r in d.items() if s in seeds} for d in short))
    nokv = paired(by_seed(runs, "fox_pro_released_no_kv_shift_4x", lr.get("fox_pro_released")), fox)
    return paired(tr, fox), gap1, nokv


def long(runs: list[RunResult]) -> str:
    """The long part: does the Pro pair's gap shrink toward the paper's with 4x the tokens, and does removing
    KV-shift still lower the loss?"""
    gaps = long_gaps(runs)
    if gaps is None:
        return "Not run yet: `--parts long`."
    gap4, gap1, nokv = gaps
    text = (f"**Verdict ({_seeds(len(gap4))}): at 4× the tokens Transformer (Pro) − FoX (Pro) is {_d(np.mean(gap4))} "
            f"{_ci(gap4)}, {_seeds_verdict(gap4, +1)}.** At the protocol's tokens the same seeds give "
            f"{_d(np.mean(gap1)) if gap1 else '–'}; the paper's gap (360M, Table 3) is {_d(PAPER_GAP)}.")
    if len(gap1) == len(gap4):
        moved = [a - b for a, b in zip(gap4, gap1)]
        text += f" From 1× to 4× the gap moves by {_d(np.mean(moved))} {_ci(moved)}."
    if nokv:
        text += (f" Removing KV-shift at 4× the tokens: {_d(np.mean(nokv))} {_ci(nokv)}, "
                 f"{_seeds_verdict(nokv, +1)} ({_seeds(len(nokv))}).")
    return text


def long_row(runs) -> list[str]:
    """The summary's line for claim 1 at 4x the tokens."""
    claim, gaps = "1. FoX (Pro) beats the Transformer (Pro) at 4× the tokens", long_gaps(runs)
    if gaps is None:
        return [claim, "not run (`--parts long`)"]
    gap4, gap1, _ = gaps
    return [claim, f"{_seeds_verdict(gap4, +1)} ({_seeds(len(gap4))}): Transformer − FoX {_d(np.mean(gap4))} "
                   f"against {_d(np.mean(gap1)) if gap1 else '–'} at 1×; the paper's {_d(PAPER_GAP)} at 360M"]


def llama_sweep(runs: list[RunResult]) -> str:
    lrs = llama_pick(runs)
    seed0 = {label: {r.lr: r.heldout for r in runs if r.label == label and r.seed == 0} for label in lrs}
    if not all(len(v) > 1 for v in seed0.values()) or len(seed0) < 2:
        return "Not run yet: `--parts lr-llama`."
    best = {label: min(v, key=v.get) for label, v in seed0.items()}
    pick = picks(runs).get("transformer")
    tf = seed0["transformer_llama"]
    text = (f"Best rates at seed 0: FoX (LLaMA) {best['fox_llama']:g}, Transformer (LLaMA) "
            f"{best['transformer_llama']:g}.")
    if pick in tf and best["transformer_llama"] != pick:
        text += (f" Transformer (LLaMA) gains {tf[pick] - tf[best['transformer_llama']]:.3f} nats/token there over "
                 f"the Pro pair's pick ({pick:g}), one seed per rate.")
    return text + f" Claim 1 trains both at {lrs['fox_llama']:g} for its three seeds."


def speed(runs: list[RunResult]) -> str:
    out, lrs = [], dict(compared(runs))
    for fox, tf, name in (("fox_pro_released", "transformer_pro_released", "Pro"),
                          ("fox_llama", "transformer_llama", "LLaMA")):
        f, t = by_seed(runs, fox, lrs.get(fox)).values(), by_seed(runs, tf, lrs.get(tf)).values()
        for device in sorted({r.device for r in f} & {r.device for r in t}):
            fs = [r.tokens_per_s for r in f if r.device == device and alone(r)]
            ts = [r.tokens_per_s for r in t if r.device == device and alone(r)]
            if not fs or not ts:
                continue
            out.append(f"FoX ({name}) {np.mean(fs) / 1e3:.0f}k against Transformer ({name}) {np.mean(ts) / 1e3:.0f}k "
                       f"on an {device} ({np.mean(fs) / np.mean(ts):.2f}×, means over {len(fs)} and {len(ts)} runs)")
    if not out:
        return "Not run yet."
    return ("Tokens per second of the compiled 125M models at 4,096 tokens (median of each run's 10-step log windows "
            f"after the first; the `runs` table; runs that shared their GPU left out): {'; '.join(out)}.")



def summary(runs: list[RunResult]) -> str:
    """The table at the top of the page: one line per claim, its verdict as the sections decide it."""
    rows = []
    pro, v_pro = _pair(runs, "transformer_pro_released", "fox_pro_released")
    llama, v_llama = _pair(runs, "transformer_llama", "fox_llama")
    order, v_order = _pair(runs, "fox_llama", "fox_pro_released")
    rows.append(["1. FoX beats the Transformer", f"Pro: {v_pro} ({len(pro)} seeds); LLaMA: {v_llama} "
                 f"({len(llama)} seeds)"])
    rows.append(long_row(runs))
    rows.append(["1. FoX (Pro) beats FoX (LLaMA)", f"{v_order} ({len(order)} seeds)"])
    rows.append(["1. FoX beats Mamba-2, HGRN2 and DeltaNet", "; ".join(
        f"{LABELS[b]}: {_seeds_verdict(d, +1)} ({_seeds(len(d))}{', below FoX (Pro)' * bool(np.mean(d) < 0)})"
        for b, d in baseline_diffs(runs).items() if d) or "not run"])
    rows.append(["2. Past the training length FoX's L(i) stays flat, the Transformer's with RoPE rises",
                 _beyond(claim2_runs(runs))])
    rows.append(["2. FoX's advantage grows with position inside the training length", _grows(runs)[1]])
    rows.append(lengths_row(runs))
    for name, diffs in removals(runs):
        rows.append([f"3. Removing {name} raises the loss",
                     f"{_seeds_verdict(diffs, +1)} ({len(diffs)} seed{'s' * (len(diffs) != 1)}, released definition)"])
    rows += [[f"3. {claim}", _gate_verdict(diffs, sign)] for claim, diffs, sign in gate_diffs(runs)]
    rows.append(tmax_row(runs))
    rows += acp_rows(runs)
    rows.append(claim5_row(runs))
    rows.append(["6. Needle in a haystack", "generation: inconclusive (no 125M model answers); "
                 + retrieval_summary(runs)])
    fox_lr = picks(runs).get("fox")
    path_fox = path_pairs(runs)[0][1] or paired(by_seed(runs, "path_fox_pro", fox_lr), by_seed(runs, "fox_pro", fox_lr))
    rows.append(["PaTH paper: PaTH-FoX beats FoX", f"{_seeds_verdict(path_fox, -1)} ({_seeds(len(path_fox))})"
                 if path_fox else "not run (`--parts path`)"])
    return table(["claim", "verdict"], rows, "ll")


def verdicts(runs: list[RunResult]) -> dict[str, str]:
    return {"verdicts": summary(runs), "verdict_claim1": claim1(runs), "verdict_claim2": claim2(runs),
            "verdict_claim3": claim3(runs), "verdict_baselines": baselines(runs), "verdict_claim4": claim4(runs),
            "verdict_claim5": claim5(runs), "verdict_path": path(runs), "verdict_released": released(runs),
            "verdict_llama_sweep": llama_sweep(runs), "verdict_long": long(runs), "verdict_speed": speed(runs)}
