"""The reproduction's retrieval and frontier tables from synthetic result files: per-trial means over depths, the
pairing of two runs' trials, the verdict's words, and the frontier's cells (eval/reproduction_probes.py)."""

import numpy as np
import pytest

from eval.reproduction_probes import (frontier_table, retrieval_pairs, retrieval_summary, retrieval_table, trial_means,
                                      verdict_frontier, verdict_retrieval)
from eval.reproduction_results import RunResult, t_975

LENGTHS, DEPTHS = [1024, 8192], [0, 0.5, 1]


def retrieval(gain, rank, seed=0):
    """A probe result whose needle gain is gain(length, depth, trial) and passkey rank rank(length, depth, trial)."""
    needle = [{"length": n, "depth": d, "gains": [gain(n, d, t) for t in range(4)]} for n in LENGTHS for d in DEPTHS]
    passkey = [{"length": n, "depth": d, "ranks": [rank(n, d, t) for t in range(4)]} for n in LENGTHS for d in DEPTHS]
    return {"seed": seed, "trials": 4, "lengths": LENGTHS, "depths": DEPTHS, "haystack": "$WORK/haystack.txt",
            "train_len": 4096, "command": "python -m eval.retrieval.run ...",
            "needle_gain": {"cells": needle}, "passkey": {"cells": passkey, "chance": {"accuracy": 0.1}}}


def run(label, lr, seed=3, **kw):
    return RunResult(f"{label}-lr{lr:g}-s{seed}", label, seed, lr, "released", "GPU", "torch x", 4.0, None, **kw)


def sweep():
    """The sweep runs that make 1e-3 FoX's pick and 2e-3 the Transformer's."""
    return [RunResult(f"{m}-lr{lr:g}-s0", m, 0, lr, "lr", "GPU", "v", loss, None)
            for m, lr, loss in (("fox_pro", 1e-3, 4.0), ("fox_pro", 2e-3, 4.1), ("transformer_pro", 1e-3, 4.3),
                                ("transformer_pro", 2e-3, 4.2))]


def test_a_trials_value_is_its_mean_over_the_rows_depths():
    res = retrieval(lambda n, d, t: d + t / 10, lambda n, d, t: 1 if t == 0 or d == 1 else 3)
    assert trial_means(res, "needle_gain", 1024, [0, 0.5]) == pytest.approx([0.25, 0.35, 0.45, 0.55])
    assert trial_means(res, "passkey", 8192, DEPTHS) == pytest.approx([1, 1 / 3, 1 / 3, 1 / 3])


def test_the_table_pairs_the_two_models_trial_by_trial_with_t_intervals():
    fox = run("fox_pro_released", 1e-3, retrieval=retrieval(lambda n, d, t: 0.0, lambda n, d, t: 2))
    tr = run("transformer_pro_released", 2e-3, retrieval=retrieval(lambda n, d, t: 0.1 * t, lambda n, d, t: 1))
    text = retrieval_table(sweep() + [fox, tr])
    diff = [0.0, 0.1, 0.2, 0.3]  # the Transformer's gains at depths < 1 minus FoX's zeros, per trial
    half = t_975(3) * np.std(diff, ddof=1) / 2
    row = next(r for r in text.splitlines() if r.startswith("| Transformer (Pro) − FoX (Pro), seed 3"))
    assert f"+0.150 [{0.15 - half:+.3f}, {0.15 + half:+.3f}]" in row
    passkey = next(r for r in text.splitlines() if "transformer" in r and "passkey" in r)
    # rank 1 in all 4 trials: the Wilson interval of 4 of 4 (textbook: [0.510, 1]), not a t interval's zero width
    assert passkey.count("| 1.000 [0.510, 1.000]") == 2
    fox_passkey = next(r for r in text.splitlines() if "fox_pro" in r and "passkey" in r)
    assert fox_passkey.count("| 0.000 [0.000, 0.490]") == 2  # rank 2 everywhere: 0 of 4
    assert "the pair's difference is inconclusive" in verdict_retrieval(sweep() + [fox, tr])  # 0.15 ± 0.21
    tr.retrieval = retrieval(lambda n, d, t: 0.1 + 0.01 * t, lambda n, d, t: 1)
    said = verdict_retrieval(sweep() + [fox, tr])
    assert "FoX (Pro) draws nothing measurable from the needle inside the training length" in said
    assert "the Transformer (Pro) draws more" in said and "prompts of 1,024 tokens" in said
    assert "Beyond the training length (8,192; seed 3, 4 trials)" in said
    for r in (fox, tr):  # a model trained shorter than every prompt: the verdict pools what there is, and says so
        r.retrieval["train_len"] = 512
    said = verdict_retrieval(sweep() + [fox, tr])
    assert "beyond the training length (no prompt fits inside it)" in said and "prompts of 1,024, 8,192" in said


def test_several_seeds_are_read_from_each_seeds_mean_and_say_at_how_many_seeds_a_model_draws():
    """Seed 3's FoX draws nothing, seed 4's draws 0.05 on every trial: across the two seeds' means the interval
    spans 0, so the verdict counts the seeds whose own trials lie above 0 rather than saying nothing is drawn."""
    gains = {3: lambda n, d, t: 0.001 * (t - 1.5), 4: lambda n, d, t: 0.05 + 0.001 * t}
    runs = sweep()
    for seed, gain in gains.items():
        runs += [run("fox_pro_released", 1e-3, seed, retrieval=retrieval(gain, lambda n, d, t: 2)),
                 run("transformer_pro_released", 2e-3, seed,
                     retrieval=retrieval(lambda n, d, t: 0.1 + 0.01 * t, lambda n, d, t: 1))]
    said = verdict_retrieval(runs)
    assert said.startswith("**Verdict (2 seeds, each seed's mean over trials): FoX (Pro) draws on the needle at 1 of 2 "
                           "seeds inside the training length")
    fox_means = [0.0, 0.0515]  # each seed's mean over its 4 trials
    half = t_975(1) * np.std(fox_means, ddof=1) / 2 ** 0.5
    assert f"FoX (Pro) gains +0.026 [{0.02575 - half:+.3f}, {0.02575 + half:+.3f}]" in said
    assert "seed 4 FoX (Pro) +0.052 [" in said and "Beyond the training length (8,192; 2 seeds" in said
    assert retrieval_summary(runs).endswith("FoX (Pro) draws on the needle at 1 of 2 seeds, Transformer (Pro) draws "
                                            "on the needle (2 seeds)")


def test_runs_with_other_draws_do_not_pair():
    fox = run("fox_pro_released", 1e-3, retrieval=retrieval(lambda n, d, t: 0.0, lambda n, d, t: 2))
    tr = run("transformer_pro_released", 2e-3, retrieval=retrieval(lambda n, d, t: 0.1, lambda n, d, t: 1, seed=1))
    assert retrieval_pairs([fox, tr]) == {}
    assert "− FoX (Pro)" not in retrieval_table(sweep() + [fox, tr])
    assert "not run yet" in verdict_retrieval(sweep() + [fox, tr])


def frontier(points, lengths=(4096, 16384)):
    return {"continuation": 1024, "new_tokens": 64, "points": points,
            "full": [{"length": n, "loss": 4.5, "kv_mib": 100.0} for n in lengths]}


def point(n, policy, diff, agree, fraction=None, eps=None, window=0):
    return {"length": n, "text_window": window, "policy": policy, "fraction": fraction, "eps": eps,
            "kept_fraction": fraction or 0.05, "kv_mib": 5.0, "loss": 4.5 + diff, "loss_diff": diff,
            "greedy_agreement": agree, "greedy_identical_prefix": 3}


def test_the_frontier_tables_show_each_point_and_the_summary_its_extremes():
    fox_pts = [point(n, "streaming", 0.01 * f, 0.9, fraction=f) for n in (4096, 16384) for f in (0.01, 0.1)]
    fox_pts += [point(n, "acp", -0.0003, 1.0, eps=1e-2) for n in (4096, 16384)]
    tr_pts = [point(n, "h2o", 0.05 if n == 4096 else -0.2, 0.8, fraction=f) for n in (4096, 16384) for f in (0.01, 0.1)]
    tr_pts.append(point(16384, "h2o", -0.2, 0.8, fraction=0.02))  # a column FoX's streaming rows lack
    fox = run("fox_pro_released", 1e-3, frontier=frontier(fox_pts))
    tr = run("transformer_pro_released", 2e-3, frontier=frontier(tr_pts))
    text = frontier_table(sweep() + [fox, tr])
    row = next(r for r in text.splitlines() if r.startswith("| FoX (Pro), seed 3 | 16,384 | 4.5000 | streaming"))
    assert row.split(" | ")[4:6] == ["+0.0001 (0.90)", "–"]  # 1%, then 2% (not measured)
    assert "| FoX (Pro), seed 3 | 4,096 | 0.01 | 5.0% | 5.0 of 100 | -0.0003 | 1.00 |" in text
    summary = verdict_frontier(sweep() + [fox, tr])
    assert "ACP keeps 5.0–5.0%" in summary and "every greedy token matches" in summary
    assert "keeping 1% costs +0.0500 to +0.0500" in summary and "3 of its 3 evicted points score below" in summary
    assert summary.endswith("Seed 3: one window of the text, the differences paired on the same tokens.")
    fox4 = run("fox_pro_released", 1e-3, 4, frontier=dict(frontier(fox_pts), windows=3))
    summary = verdict_frontier(sweep() + [fox, tr, fox4])  # a sentence per seed, each with its windows
    assert summary.count("**FoX (Pro), fox_pro_released-lr0.001-s") == 2 and summary.endswith(
        "Seed 4: 3 windows of the text.")


def test_frontier_cells_carry_the_interval_across_windows():
    pts = [point(4096, "snapkv", d, 1.0, fraction=0.1, window=w) for w, d in enumerate((0.01, 0.03))]
    res = frontier(pts, lengths=(4096,))
    res["full"] = [dict(res["full"][0], text_window=w) for w in (0, 1)]
    res["windows"] = 2
    text = frontier_table(sweep() + [run("transformer_pro_released", 2e-3, frontier=res)])
    half = t_975(1) * np.std([0.01, 0.03], ddof=1) / 2 ** 0.5
    assert f"+0.0200 ±{half:.4f} (1.00)" in text and "2 windows" in text
