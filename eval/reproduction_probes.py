"""The reproduction's retrieval probes and eviction frontier, rendered from the result files like its other tables:
the released FoX (Pro) and Transformer (Pro) runs that kept ``retrieval/`` (``eval.retrieval.run``) and
``eviction/`` (``eval.eviction.frontier``). No model or GPU needed.

Retrieval statistics per prompt length take each trial's mean over the depths: every cell of a run draws the same
keys and values, so the trials, not the cells, are the independent draws (``eval.retrieval.run``). Two runs with
the same draws (one seed of the draws, one haystack, one tokenizer) pair trial by trial.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from forgetting_transformer.markdown import table
from eval.eviction.windows import mean_over_windows
from eval.reproduction_results import LABELS, RunResult, paired_interval, picks, primary, wilson

PAIR = (("fox_pro_released", "fox"), ("transformer_pro_released", "transformer"))


def probe_runs(runs: list[RunResult], what: str) -> list[RunResult]:
    """The released pair's runs at their families' picks that kept ``what`` (``retrieval`` or ``frontier``)."""
    pick = picks(runs)
    return [r for label, family in PAIR for r in primary(runs, label, family, pick) if getattr(r, what)]


def name(r: RunResult) -> str:
    return f"{LABELS[r.label]} ({r.name})"


# ----------------------------------------------------------------------------------------------------- retrieval


def trial_means(res: dict, probe: str, length: int, depths) -> np.ndarray:
    """(trials,): each trial's needle gain (``needle_gain``) or passkey hit (``passkey``) averaged over ``depths``
    at prompt length ``length``."""
    cells = [c for c in res[probe]["cells"] if c["length"] == length and c["depth"] in depths]
    values = [c["gains"] if probe == "needle_gain" else [float(r == 1) for r in c["ranks"]] for c in cells]
    return np.mean(values, axis=0)


def inside(res: dict) -> list:
    """The depths that put the needle inside the haystack, before its last part (all but depth 1, where the needle
    ends just before the question)."""
    return [d for d in res["depths"] if d < 1]


def mean_ci(values, sign: str = "+") -> str:
    """Mean [95% t interval], signed (gains, differences) or not (``sign=""``: accuracies)."""
    ci, f = paired_interval(list(values)), f"{sign}.3f"
    return f"{ci[0]:{f}} [{ci[1]:{f}}, {ci[2]:{f}}]" if ci else f"{float(np.mean(values)):{f}}"


def rate_ci(values) -> str:
    """Mean [95% Wilson score interval] of per-trial hit rates, with n the number of trials."""
    p = float(np.mean(values))
    lo, hi = wilson(p * len(values), len(values))
    return f"{p:.3f} [{lo:.3f}, {hi:.3f}]"


def same_draws(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("seed", "trials", "lengths", "depths", "haystack"))


def retrieval_table(runs: list[RunResult]) -> str:
    chosen = probe_runs(runs, "retrieval")
    if not chosen:
        return "Not run yet: `--parts released` runs the probes after training."
    lengths = chosen[0].retrieval["lengths"]
    rows = []
    for r in chosen:
        res = r.retrieval
        chance = res["passkey"]["chance"]["accuracy"]
        rows += [[name(r), "needle gain, depths < 1", *(mean_ci(trial_means(res, "needle_gain", n, inside(res)))
                                                        for n in lengths)],
                 [name(r), "needle gain, depth 1", *(mean_ci(trial_means(res, "needle_gain", n, [1]))
                                                     for n in lengths)],
                 [name(r), f"passkey accuracy (chance {chance:.2f})",
                  *(rate_ci(trial_means(res, "passkey", n, res["depths"])) for n in lengths)]]
    for seed, (fox, tr) in retrieval_pairs(chosen).items():
        diff = [trial_means(tr.retrieval, "needle_gain", n, inside(tr.retrieval))
                - trial_means(fox.retrieval, "needle_gain", n, inside(fox.retrieval)) for n in lengths]
        rows.append([f"Transformer (Pro) − FoX (Pro), seed {seed}", "needle gain, depths < 1",
                     *(mean_ci(d) for d in diff)])
    r0 = chosen[0].retrieval
    note = (f"\n\nMean over {r0['trials']} trials with its 95% interval (needle gain: t; passkey accuracy: Wilson "
            f"score, which stays in [0, 1]); a trial's value is its mean over the depths of the row "
            f"({', '.join(f'{d:g}' for d in r0['depths'])} of the haystack). Needle gain in nats "
            f"per answer token (0 without retrieval). `{r0['command']}` (`$WORK`: the suite's work directory).")
    return table(["model (run)", "measure", *(f"{n:,}" for n in lengths)], rows, "ll" + "r" * len(lengths)) + note


def retrieval_pairs(chosen: list[RunResult]) -> dict[int, tuple[RunResult, RunResult]]:
    """seed → (FoX (Pro), Transformer (Pro)) runs whose probes drew the same trials."""
    fox = {r.seed: r for r in chosen if r.label == "fox_pro_released"}
    tr = {r.seed: r for r in chosen if r.label == "transformer_pro_released"}
    return {s: (fox[s], tr[s]) for s in sorted(set(fox) & set(tr)) if same_draws(fox[s].retrieval, tr[s].retrieval)}


def split_lengths(res: dict) -> tuple[list[int], list[int], str]:
    """(the lengths a verdict pools, the lengths beyond the training length it adds, where the pooled ones lie):
    the lengths inside the training length, or every length when none is."""
    within = [n for n in res["lengths"] if n <= res["train_len"]]
    beyond = [n for n in res["lengths"] if n > res["train_len"]]
    if within:
        return within, beyond, "inside the training length"
    return beyond, [], "beyond the training length (no prompt fits inside it)"


def pooled(res: dict, lengths: list[int]) -> np.ndarray:
    """(trials,): each trial's needle gain at depths < 1, averaged over ``lengths`` too."""
    return np.mean([trial_means(res, "needle_gain", n, inside(res)) for n in lengths], axis=0)


def per_seed_gains(pairs: dict[int, tuple[RunResult, RunResult]], lengths: list[int]) -> list[tuple]:
    """Per seed: (FoX (Pro)'s gains, the Transformer (Pro)'s) per trial at depths < 1, pooled over ``lengths``."""
    return [(pooled(f.retrieval, lengths), pooled(t.retrieval, lengths)) for f, t in pairs.values()]


def seed_gains(per_seed: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """(FoX (Pro)'s gains, the Transformer (Pro)'s): per trial for one seed, per seed (each seed's mean over
    trials) for several."""
    if len(per_seed) == 1:
        return per_seed[0]
    return np.array([f.mean() for f, _ in per_seed]), np.array([t.mean() for _, t in per_seed])


def draws(ci, per_seed: list[np.ndarray]) -> str:
    """What a model's gains say: it draws on the needle when the interval lies above 0; one seed without that draws
    nothing measurable; several say at how many seeds (each seed's trials) it does."""
    if ci and ci[1] > 0:
        return "draws on the needle"
    if len(per_seed) == 1:
        return "draws nothing measurable from the needle"
    hits = sum(bool((c := paired_interval(list(g))) and c[1] > 0) for g in per_seed)
    return f"draws on the needle at {hits} of {len(per_seed)} seeds"


def retrieval_reading(pairs: dict[int, tuple[RunResult, RunResult]]) -> dict:
    """What the verdict and the summary line say, from the pairs' needle gains at depths < 1 pooled over the
    lengths ``split_lengths`` picks (``seed_gains``)."""
    seed, (fox, _) = next(iter(pairs.items()))
    within, beyond, where = split_lengths(fox.retrieval)
    per_seed = per_seed_gains(pairs, within)
    f_in, t_in = seed_gains(per_seed)
    ci_fox, ci_tr = paired_interval(list(f_in)), paired_interval(list(t_in))
    return {"seed": seed, "within": within, "beyond": beyond, "where": where, "fox": f_in, "transformer": t_in,
            "seeds": (f"seed {seed}, {len(f_in)} trials" if len(pairs) == 1 else
                      f"{len(pairs)} seeds, each seed's mean over trials"),
            "draws_fox": draws(ci_fox, [f for f, _ in per_seed]),
            "draws_transformer": draws(ci_tr, [t for _, t in per_seed]),
            "per_seed": dict(zip(pairs, per_seed)), "ci_diff": paired_interval(list(t_in - f_in))}


def verdict_retrieval(runs: list[RunResult]) -> str:
    pairs = retrieval_pairs(probe_runs(runs, "retrieval"))
    if not pairs:
        return "**Verdict: not run yet.** The retrieval probes need the released pair at one seed at least."
    g = retrieval_reading(pairs)
    ci_diff, f_in, t_in = g["ci_diff"], g["fox"], g["transformer"]
    more = ("the Transformer (Pro) draws more" if ci_diff and ci_diff[1] > 0 else
            "the Transformer (Pro) draws less" if ci_diff and ci_diff[2] < 0 else
            "the pair's difference is inconclusive")
    text = (f"**Verdict ({g['seeds']}): FoX (Pro) {g['draws_fox']} {g['where']}; {more}.** With the needle "
            f"inside the haystack (depths < 1) and prompts of {', '.join(format(n, ',') for n in g['within'])} "
            f"tokens (training length {pairs[g['seed']][0].retrieval['train_len']:,}), FoX (Pro) gains "
            f"{mean_ci(f_in)} nats per answer token, the Transformer (Pro) {mean_ci(t_in)}, the difference "
            f"{mean_ci(t_in - f_in)}.")
    if len(pairs) > 1:
        text += " Per seed, over its trials: " + "; ".join(
            f"seed {seed} FoX (Pro) {mean_ci(f)}, Transformer (Pro) {mean_ci(t)}" for seed, (f, t) in
            g["per_seed"].items()) + "."
    if beyond := g["beyond"]:
        f_out, t_out = seed_gains(per_seed_gains(pairs, beyond))
        text += (f" Beyond the training length ({', '.join(format(n, ',') for n in beyond)}; {g['seeds']}) FoX "
                 f"(Pro) gains {mean_ci(f_out)}, the Transformer (Pro) {mean_ci(t_out)}.")
    return (text + " A needle just before the question (depth 1) lifts both models: that is copying from the last "
            "few hundred tokens. The paper's models (760M, 48B tokens) retrieve at every depth; these runs do not "
            "test that scale.")


# ----------------------------------------------------------------------------------------------------- frontier


def frontier_table(runs: list[RunResult]) -> str:
    """Per run and prompt length: the full cache's loss, then each targeted policy's loss change and greedy
    agreement at every kept fraction; ACP's points in a second table."""
    chosen = probe_runs(runs, "frontier")
    if not chosen:
        return "Not run yet: `--parts released` runs the frontier after training."
    fractions = sorted({round(p["fraction"], 6) for r in chosen for p in r.frontier["points"] if p.get("fraction")})
    rows, acp_rows = [], []
    for r in chosen:
        fulls, points = mean_over_windows(r.frontier)
        for full in fulls:
            n = full["length"]
            pts = [p for p in points if p["length"] == n]
            for policy in dict.fromkeys(p["policy"] for p in pts if p["policy"] != "acp"):
                got = {round(p["fraction"], 6): p for p in pts if p["policy"] == policy and p.get("fraction")}
                rows.append([f"{LABELS[r.label]}, seed {r.seed}", f"{n:,}", f"{full['loss']:.4f}", policy,
                             *(f"{change(got[f])} ({got[f]['greedy_agreement']:.2f})" if f in got else "–"
                               for f in fractions)])
            acp_rows += [[f"{LABELS[r.label]}, seed {r.seed}", f"{n:,}", f"{p['eps']:g}",
                          f"{100 * p['kept_fraction']:.1f}%", f"{p['kv_mib']:.1f} of {full['kv_mib']:.0f}", change(p),
                          f"{p['greedy_agreement']:.2f}"] for p in pts if p["policy"] == "acp" and p["eps"]]
    text = table(["model", "prompt", "full cache loss", "policy", *(f"keep {f:.0%}" for f in fractions)],
                 rows, "lrrl" + "r" * len(fractions))
    if acp_rows:
        text += "\n\n" + table(["model", "prompt", "ACP eps", "kept", "KV MiB kept", "loss change", "greedy agreement"],
                               acp_rows, "lrrrrrr")
    runs_text = "; ".join(f"{r.name} ({r.device}, {r.versions}, {r.frontier.get('windows', 1)} window"
                          f"{'s' * (r.frontier.get('windows', 1) > 1)})" for r in chosen)
    return (text + f"\n\nLoss change: the next {chosen[0].frontier['continuation']:,} tokens' mean loss through the "
            f"evicted cache minus through the full cache (nats/token), averaged over the text's windows, ± half its "
            f"95% interval across them where there are several; in brackets, the fraction of "
            f"{chosen[0].frontier['new_tokens']} greedy steps that pick the full cache's token. Runs: {runs_text}.")


def change(point: dict) -> str:
    """A point's mean loss change, ± half its interval across windows when it has one."""
    ci = point["loss_diff_ci"]
    return f"{point['loss_diff']:+.4f}" + (f" ±{(ci[1] - ci[0]) / 2:.4f}" if ci else "")


def span(points: list[dict], key: str = "loss_diff", pct: bool = False) -> str:
    """"lo to hi" of the points' ``key`` (percentages: "lo–hi")."""
    lo, hi = min(p[key] for p in points), max(p[key] for p in points)
    return f"{lo:.0%}–{hi:.0%}" if pct else f"{lo:+.4f} to {hi:+.4f}"


def at_fraction(points: list[dict], fraction: float, length: int | None = None) -> list[dict]:
    """The targeted policies' points at a kept fraction (and one prompt length)."""
    return [p for p in points if p["policy"] != "acp" and p.get("fraction") == fraction
            and length in (None, p["length"])]


def fox_frontier(r: RunResult) -> str:
    fulls, points = mean_over_windows(r.frontier)
    acp, first = [p for p in points if p["policy"] == "acp"], min(f["length"] for f in fulls)
    text = f"**FoX (Pro), {r.name}:**"
    if acp:
        kept, agree = [p["kept_fraction"] for p in acp], min(p["greedy_agreement"] for p in acp)
        text += (f" over eps {min(p['eps'] for p in acp):g}–{max(p['eps'] for p in acp):g} and prompts of "
                 f"{', '.join(format(f['length'], ',') for f in fulls)} tokens, ACP keeps {100 * min(kept):.1f}–"
                 f"{100 * max(kept):.1f}% of the prompt's keys; the loss moves by at most "
                 f"{max(abs(p['loss_diff']) for p in acp):.4f} nats/token and "
                 + ("every greedy token matches the full cache's." if agree == 1 else
                    f"at least {agree:.0%} of the greedy tokens match the full cache's."))
    if near := at_fraction(points, 0.1, first):
        text += (f" At 10% of {first:,} tokens (about ACP's memory there) the targeted policies cost {span(near)} "
                 f"and agree on {span(near, 'greedy_agreement', True)} of the tokens.")
    if one := at_fraction(points, 0.01):
        text += f" At 1%: {span(one)}, agreeing on {span(one, 'greedy_agreement', True)}."
    return text


def transformer_frontier(r: RunResult) -> str:
    fulls, points = mean_over_windows(r.frontier)
    first = min(f["length"] for f in fulls)
    text = f" **Transformer (Pro), {r.name}**, at {first:,} tokens:"
    for fraction in (0.01, 0.1):
        if got := at_fraction(points, fraction, first):
            text += f" keeping {fraction:.0%} costs {span(got)};"
    text = text.rstrip(";:") + "."
    if longer := [p for p in points if p["length"] > first]:
        lengths = ", ".join(format(f["length"], ",") for f in fulls if f["length"] > first)
        text += (f" At the longer prompts ({lengths}), {sum(p['loss_diff'] < 0 for p in longer)} of its "
                 f"{len(longer)} evicted points score below its full cache.")
    return text


def verdict_frontier(runs: list[RunResult]) -> str:
    """A sentence per seed of the released pair: the frontier is read seed by seed, each over its own windows."""
    chosen = probe_runs(runs, "frontier")
    if not any(r.label == "fox_pro_released" for r in chosen):
        return "**Not run yet.**"
    text = []
    for seed in sorted({r.seed for r in chosen}):
        got = {r.label: r for r in chosen if r.seed == seed}
        windows = next(iter(got.values())).frontier.get("windows", 1)
        text.append((fox_frontier(got["fox_pro_released"]) if "fox_pro_released" in got else "")
                    + (transformer_frontier(got["transformer_pro_released"])
                       if "transformer_pro_released" in got else "")
                    + (f" Seed {seed}: {windows} windows of the text." if windows > 1 else
                       f" Seed {seed}: one window of the text, the differences paired on the same tokens."))
    return "\n\n".join(t.strip() for t in text)


def retrieval_summary(runs: list[RunResult]) -> str:
    """The summary table's line for the retrieval probe."""
    pairs = retrieval_pairs(probe_runs(runs, "retrieval"))
    if not pairs:
        return "not run"
    g = retrieval_reading(pairs)
    return (f"log-likelihood probe, {g['where']}: FoX (Pro) {g['draws_fox'].removesuffix(' from the needle')}, "
            f"Transformer (Pro) {g['draws_transformer'].removesuffix(' from the needle')} "
            + ("(1 seed: inconclusive until 2)" if len(pairs) == 1 else f"({len(pairs)} seeds)"))


def copy_frontier_plots(runs: list[RunResult], image_dir: Path) -> list[Path]:
    """The frontier plots of the first seed that has them, one per model, as ``books_frontier_<model>.png``."""
    files, seen = [], set()
    for r in probe_runs(runs, "frontier"):
        png = next((r.path / "eviction").glob("*.png"), None)
        if png is None or r.label in seen:
            continue
        seen.add(r.label)
        dest = Path(image_dir) / f"books_frontier_{r.label.replace('_released', '')}.png"
        shutil.copyfile(png, dest)
        files.append(dest)
    return files


def probe_tables(runs: list[RunResult]) -> dict[str, str]:
    return {"retrieval": retrieval_table(runs), "verdict_retrieval": verdict_retrieval(runs),
            "frontier": frontier_table(runs), "verdict_frontier": verdict_frontier(runs)}
