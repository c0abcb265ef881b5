"""Claim 4 of the reproduction report, ACP during training: its tables, verdict and summary lines from the result
files. The released FoX (Pro) with ACP (``acp-released``) pairs with the ``released`` dense run of each seed for
the loss and with the dense twin trained just before it for the speed; ``acp-16k`` is the same pair at 16k context;
the earlier ``acp`` part (the Pro definition of its time) stays below them. No model or GPU needed."""

from __future__ import annotations

import numpy as np

from eval.reproduction_results import (RunResult, acp_released, acp_speedups, alone, fmt, paired, paired_interval,
                                       picks, primary, verdict)
from forgetting_transformer.markdown import table


def _n_seeds(n: int) -> str:
    return f"{n} seed{'s' * (n != 1)}"


def _interval(diffs: list[float]) -> str:
    ci = paired_interval(diffs)
    return f"[{ci[1]:+.3f}, {ci[2]:+.3f}]" if ci else "(one seed)"


# ----------------------------------------------------------------------------------------------------- tables


def claim4_table(runs: list[RunResult]) -> str:
    """The released FoX (Pro) with ACP against its dense runs (``acp-released``), then the earlier pair (``acp``)."""
    dense, twin, acp = acp_released(runs)
    text = released_acp_table(dense, twin, acp) if acp else "Not run yet: `--parts acp-released`."
    _, twin16, acp16 = acp_released(runs, "_16k")
    text += ("\n\nAt 16,384 tokens of context (`--parts acp-16k`):\n\n" + released_acp_table({}, twin16, acp16)
             if acp16 else "\n\nThe pair at 16,384 tokens of context (`--parts acp-16k`) has not run yet.")
    legacy = legacy_acp_table(runs)
    earlier = "\n\nThe earlier pair (`--parts acp`, the Pro definition of its time):\n\n"
    return text + (earlier + legacy if legacy else "")


def _share(rows: dict | None, unit: str = "") -> str:
    """ACP's mean pruned tile share over held-out rows (eval.gates.pruning's JSON) with its 95% interval, in %."""
    if not rows:
        return "–"
    ci = rows["ci"]
    return f"{100 * rows['mean']:.1f}{unit}" + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "")


def released_acp_table(dense: dict, twin: dict, acp: dict) -> str:
    """One row per ACP seed: its loss against the ``released`` run of the seed (where ``dense`` has one) and its
    dense twin, their tokens/s, and the pruned tile share over held-out rows."""
    speed, rows = acp_speedups(twin, acp), []
    for seed in sorted(acp):
        a, d, t = acp[seed], dense.get(seed), twin.get(seed)
        released = [fmt(d.heldout if d else None)] if dense else []
        versus = [f"{a.heldout - d.heldout:+.4f}" if d else "–"] if dense else [
            f"{a.heldout - t.heldout:+.4f}" if t else "–"]
        rows.append([str(seed), *released, fmt(t.heldout if t else None), fmt(a.heldout), *versus,
                     f"{t.tokens_per_s:,.0f}" if t and alone(t) else "–",
                     f"{a.tokens_per_s:,.0f}" if alone(a) else "GPU shared",
                     f"{speed[seed]:.3f}×" if seed in speed else "–", _share(a.acp_rows)])
    n = next((len(r.acp_rows["rows"]) for r in acp.values() if r.acp_rows), None)
    return table(["seed", *(["dense held-out loss"] if dense else []), "dense twin", "ACP held-out loss",
                  "ACP − dense" if dense else "ACP − twin", "twin tokens/s", "ACP tokens/s", "ACP / twin speed",
                  f"% tiles pruned, {n} rows [95%]" if n else "% tiles pruned"], rows)


def legacy_pair(runs: list[RunResult]) -> tuple[dict, dict]:
    """(dense, acp) by seed of the earlier ``acp`` part: FoX (Pro) of the Pro definition of its time, at the pick."""
    pick = picks(runs)
    return ({r.seed: r for r in primary(runs, "fox_pro", "fox", pick)},
            {r.seed: r for r in primary(runs, "fox_pro_acp", "fox", pick)})


def legacy_acp_table(runs: list[RunResult]) -> str | None:
    dense, acp = legacy_pair(runs)
    if not acp:
        return None
    rows = []
    for seed in sorted(acp):
        a, d = acp[seed], dense.get(seed)
        rel = (a.heldout / d.heldout - 1) if d else None
        speed = (a.tokens_per_s / d.tokens_per_s) if d and alone(a) and alone(d) else None
        same = d is not None and a.device == d.device
        rows.append([str(seed), fmt(d.heldout if d else None), fmt(a.heldout),
                     f"{100 * rel:+.2f}%" if rel is not None else "–",
                     f"{d.tokens_per_s:,.0f}" if d and d.tokens_per_s else "–",
                     f"{a.tokens_per_s:,.0f}" if a.tokens_per_s else "–",
                     (f"{speed:.3f}×" + ("" if same else " (other GPUs)")) if speed else "–"])
    text = table(["seed", "dense held-out loss", "ACP held-out loss", "ACP / dense − 1", "dense tokens/s",
                   "ACP tokens/s", "ACP speed"], rows)
    traj = next((r.acp_over_training for r in acp.values() if r.acp_over_training), None)
    if traj:
        ckpts = traj["checkpoints"]
        text += "\n\n" + table(["step", *[str(c["step"]) for c in ckpts]],
                                [["% forward tiles pruned", *[f"{100 * c['tile_fraction']:.1f}" for c in ckpts]]])
    return text


# ----------------------------------------------------------------------------------------------------- verdicts


def claim4(runs: list[RunResult]) -> str:
    dense, twin, acp = acp_released(runs)
    text = _acp_released(dense, twin, acp) if acp and dense else "Not run yet: `--parts acp-released`."
    text += _acp_16k(runs)
    legacy = _acp_legacy(runs)
    return text + (f"\n\n{legacy}" if legacy else "")


def _d4(diffs: list[float]) -> str:
    return ", ".join(f"{x:+.4f}" for x in diffs)


def _acp_loss(dense, twin, acp) -> tuple[str, str]:
    """(headline, sentences) on ACP's held-out loss against the dense runs and their twins."""
    diffs = paired(acp, dense)
    ci, mean = paired_interval(diffs), float(np.mean(diffs)) if diffs else None
    if mean is None:
        return "the loss is not compared (no dense run of the same seed)", ""
    if ci is None:
        head = "the loss change rests on one seed"
    elif ci[1] <= 0 <= ci[2]:
        head = "the loss is unchanged"
    else:
        head = f"ACP's loss is {'lower' if ci[0] < 0 else 'higher'} by {abs(ci[0]):.3f} nats/token"
    rel = [f"{100 * (acp[s].heldout / dense[s].heldout - 1):+.2f}% (seed {s})" for s in sorted(acp) if s in dense]
    text = (f"The released FoX (Pro) with `model.acp=true` against the `released` part's dense runs of the same "
            f"seeds: ACP moves the held-out loss by {', '.join(rel)}; the paired difference is {mean:+.4f} "
            "nats/token, 95% interval " + (f"[{ci[1]:+.4f}, {ci[2]:+.4f}]." if ci else "(one seed)."))
    again, against = paired(twin, dense), paired(acp, twin)
    if again:
        text += (f" The dense twins, the same command trained again just before ACP, differ from those runs by "
                 f"{_d4(again)}; ACP differs from its twin by {_d4(against)}.")
    return head, text


def _acp_pruning(acp) -> tuple[str, str]:
    shares = {s: r.acp_rows for s, r in sorted(acp.items()) if r.acp_rows}
    if not shares:
        return "the pruning share is not measured", ""
    means = [x["mean"] for x in shares.values()]
    first = next(iter(shares.values()))
    cells = [f"{_share(x, '%')} (seed {s})" for s, x in shares.items()]
    than = "more than" if min(means) > 0.7 else "less than" if max(means) < 0.7 else "around"
    head = "ACP prunes most tiles" if min(means) > 0.5 else "ACP prunes fewer than half the tiles"
    return head, (f" Over {len(first['rows'])} held-out rows of {first['tokens']:,} tokens, ACP prunes "
                  f"{', '.join(cells)} of the forward tiles ({first['block'][0]}×{first['block'][1]}; mean and 95% "
                  f"interval over rows): {than} the around 70% of attention FLOPs the ACP paper reports at every "
                  "size (125M–760M) and context (4k–16k) it tested.")


def _acp_speed(twin, acp) -> tuple[str, str]:
    speed = acp_speedups(twin, acp)
    if not speed:
        return "the speed-up is not measured", ""
    ci, ratios = paired_interval(list(speed.values())), list(speed.values())
    mean = ci[0] if ci else ratios[0]
    where = "inside" if 1.1 <= mean <= 1.35 else "above" if mean > 1.35 else "below"
    head = ("the speed-up rests on one pair" if ci is None else "the speed-up is reproduced" if ci[1] > 1
            else "the speed-up is inconclusive")
    device = acp[next(iter(speed))].device
    return head, (f" Speed: each ACP run trained right after its dense twin on one {device}, nothing beside either; "
                  "the median tokens/s of their 10-step log windows (the first excluded) gives ACP "
                  + ", ".join(f"{r:.3f}× (seed {s})" for s, r in speed.items())
                  + (f", mean {ci[0]:.3f}× [{ci[1]:.3f}, {ci[2]:.3f}] over {len(ratios)} pairs" if ci else "")
                  + f": {where} the paper's 10–35%.")


def _acp_released(dense, twin, acp) -> str:
    (loss, t_loss), (prune, t_prune), (fast, t_fast) = _acp_loss(dense, twin, acp), _acp_pruning(acp), \
        _acp_speed(twin, acp)
    return f"**Verdict: {loss}; {prune}; {fast}.** {t_loss}{t_prune}{t_fast}"


def _acp_16k(runs: list[RunResult]) -> str:
    """A sentence on the acp-16k pair (one seed: no interval across seeds), empty before it has run."""
    _, twin, acp = acp_released(runs, "_16k")
    if not acp:
        return ""
    seed = min(acp)
    a, t, speed, said = acp[seed], twin.get(seed), acp_speedups(twin, acp), []
    if t:
        said.append(f"ACP − dense twin {a.heldout - t.heldout:+.4f} nats/token")
    if seed in speed:
        said.append(f"ACP at {speed[seed]:.3f}× the twin's tokens/s, back to back on one {a.device}")
    if a.acp_rows:
        said.append(_share(a.acp_rows, "%")
                    + f" of the forward tiles pruned over {len(a.acp_rows['rows'])} held-out rows")
    return f" At 16,384 tokens of context (seed {seed}, one pair): {'; '.join(said)}."


def _acp_legacy(runs: list[RunResult]) -> str | None:
    dense, acp = legacy_pair(runs)
    if not acp or not dense:
        return None
    rel = [f"{100 * (acp[s].heldout / dense[s].heldout - 1):+.2f}% (seed {s})" for s in sorted(acp) if s in dense]
    diffs = paired(acp, dense)
    text = (f"The earlier pair (`--parts acp`): ACP moves the held-out loss by {', '.join(rel)}; the paired "
            f"difference is {np.mean(diffs):+.3f} nats/token, 95% interval {_interval(diffs)}.")
    traj = next((r.acp_over_training["checkpoints"] for r in acp.values() if r.acp_over_training), None)
    if traj:
        text += (f" ACP prunes {100 * traj[0]['tile_fraction']:.0f}% of the forward tiles at step {traj[0]['step']} "
                 f"and {100 * traj[-1]['tile_fraction']:.0f}% at step {traj[-1]['step']}, on one held-out excerpt of "
                 "4,096 tokens.")
    same = [s for s in sorted(acp) if s in dense and acp[s].device == dense[s].device and alone(acp[s])
            and alone(dense[s])]
    for s in same:
        ratio = acp[s].tokens_per_s / dense[s].tokens_per_s
        text += (f" At seed {s} both runs trained on an {acp[s].device}, not back to back: ACP {ratio:.2f}× the "
                 "dense run's tokens/s, a ratio that also holds the machines' drift.")
    return text


def acp_rows(runs: list[RunResult]) -> list[list[str]]:
    """Claim 4's two summary lines: the released FoX (Pro) with ACP when run, else the earlier pair."""
    dense, twin, acp = acp_released(runs)
    if not acp:
        (dense, acp), twin = legacy_pair(runs), {}
    diffs = paired(acp, dense)
    ci = paired_interval(diffs)
    mean = float(np.mean(diffs)) if diffs else 0.0
    loss = (f"no change measured ({_n_seeds(len(diffs))})" if ci and ci[1] <= 0 <= ci[2] else
            f"{verdict(ci, None)}: {'lower' if mean < 0 else 'higher'} by {abs(mean):.4f} nats/token "
            f"({_n_seeds(len(diffs))})" if diffs else "not run")
    shares = [r.acp_rows["mean"] for r in acp.values() if r.acp_rows]
    prune = (f"pruning reproduced ({100 * min(shares):.0f}–{100 * max(shares):.0f}% of tiles over held-out rows, "
             f"{_n_seeds(len(shares))})" if shares and min(shares) > 0.5 else "pruning: not measured over many rows")
    speed = acp_speedups(twin, acp)
    ci_s = paired_interval(list(speed.values()))
    fast = ("speed: not measured back to back" if not speed else f"speed {list(speed.values())[0]:.2f}× from one "
            "back-to-back pair" if ci_s is None else f"speed {verdict((ci_s[0] - 1, ci_s[1] - 1, ci_s[2] - 1), +1)}: "
            f"{ci_s[0]:.2f}× [{ci_s[1]:.2f}, {ci_s[2]:.2f}] over {len(speed)} back-to-back pairs")
    return [["4. ACP leaves the loss unchanged", loss], ["4. ACP prunes most tiles and trains faster",
                                                          f"{prune}; {fast}"]]
