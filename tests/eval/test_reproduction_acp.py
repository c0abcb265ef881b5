"""Claim 4 of the reproduction report: the released FoX (Pro) with ACP paired with the dense runs of its seeds for
the loss, timed against the dense twin trained just before it for the speed, and its pruned share over held-out
rows; the earlier pair when the released one has not run."""

import numpy as np

from eval.reproduction_acp import claim4, claim4_table
from eval.reproduction_results import RunResult
from eval.reproduction_verdicts import summary

T_975_DF1 = 12.706205  # Student t, 97.5%, one degree of freedom


def run(label, lr, seed, part, loss, speed=None, gpu_jobs=1, rows=None):
    r = RunResult(f"{label}-lr{lr:g}-s{seed}", label, seed, lr, part, "NVIDIA H200", "v", loss, speed,
                  gpu_jobs=gpu_jobs)
    if rows is not None:
        r.acp_rows = {"rows": list(range(len(rows))), "tile_fraction": rows, "tokens": 4096, "block": [64, 64],
                      "mean": float(np.mean(rows)), "ci": [float(np.min(rows)), float(np.max(rows))]}
    return r


def suite(acp_losses=(4.097, 4.116, 4.106)):
    runs = [run(m, lr, 0, "lr", loss) for m, lr, loss in (("fox_pro", 1e-3, 4.0), ("fox_pro", 2e-3, 4.1),
                                                          ("transformer_pro", 2e-3, 4.2))]
    runs += [run("fox_pro_released", 1e-3, s, "released", loss, 90.0) for s, loss in enumerate((4.10, 4.12, 4.11))]
    runs += [run("fox_pro_released_dense", 1e-3, s, "acp-released", loss, 100.0)
             for s, loss in ((0, 4.101), (1, 4.119))]
    runs += [run("fox_pro_released_acp", 1e-3, s, "acp-released", loss, speed, jobs, rows)
             for s, loss, speed, jobs, rows in zip(range(3), acp_losses, (130.0, 132.0, 120.0), (1, 1, 2),
                                                     ([0.8, 0.9], [0.84, 0.86], [0.7, 0.9]))]
    return runs


def test_the_table_pairs_each_acp_run_with_its_seeds_dense_run_and_twin():
    rows = claim4_table(suite()).splitlines()
    assert rows[0].startswith("| seed | dense held-out loss | dense twin | ACP held-out loss | ACP − dense |")
    assert rows[0].endswith("| % tiles pruned, 2 rows [95%] |")
    assert rows[2] == "| 0 | 4.1000 | 4.1010 | 4.0970 | -0.0030 | 100 | 130 | 1.300× | 85.0 [80.0, 90.0] |"
    assert rows[4] == "| 2 | 4.1100 | – | 4.1060 | -0.0040 | – | GPU shared | – | 80.0 [70.0, 90.0] |"
    assert "The earlier pair" not in "\n".join(rows)  # no acp part in this suite


def test_the_verdict_states_the_loss_the_pruning_and_the_speed_from_the_files():
    said = claim4(suite())
    diffs = [-0.003, -0.004, -0.004]
    half = 4.302653 * np.std(diffs, ddof=1) / 3 ** 0.5
    assert said.startswith("**Verdict: ACP's loss is lower by 0.004 nats/token; ACP prunes most tiles; the speed-up "
                           "is reproduced.**")
    assert f"the paired difference is {np.mean(diffs):+.4f} nats/token, 95% interval " \
           f"[{np.mean(diffs) - half:+.4f}, {np.mean(diffs) + half:+.4f}]." in said
    assert "differ from those runs by +0.0010, -0.0010; ACP differs from its twin by -0.0040, -0.0030." in said
    assert "ACP prunes 85.0% [80.0, 90.0] (seed 0), 85.0% [84.0, 86.0] (seed 1), 80.0% [70.0, 90.0] (seed 2)" in said
    assert ": more than the around 70%" in said
    half = T_975_DF1 * np.std([1.30, 1.32], ddof=1) / 2 ** 0.5
    assert (f"gives ACP 1.300× (seed 0), 1.320× (seed 1), mean 1.310× [{1.31 - half:.3f}, {1.31 + half:.3f}] over 2 "
            "pairs: inside the paper's 10–35%.") in said
    rows = {ln.split(" | ")[0]: ln for ln in summary(suite()).splitlines()}
    assert rows["| 4. ACP leaves the loss unchanged"].endswith("| differs: lower by 0.0037 nats/token (3 seeds) |")
    assert rows["| 4. ACP prunes most tiles and trains faster"].endswith(
        f"| pruning reproduced (80–85% of tiles over held-out rows, 3 seeds); speed reproduced: 1.31× "
        f"[{1.31 - half:.2f}, {1.31 + half:.2f}] over 2 back-to-back pairs |")


def test_a_loss_interval_across_zero_is_unchanged():
    runs = suite(acp_losses=(4.097, 4.123, 4.110))
    assert claim4(runs).startswith("**Verdict: the loss is unchanged; ACP prunes most tiles;")
    assert "| 4. ACP leaves the loss unchanged | no change measured (3 seeds) |" in summary(runs)


def test_without_the_released_runs_the_earlier_pair_speaks():
    runs = [r for r in suite() if r.part != "acp-released"]
    runs += [run("fox_pro", 1e-3, 1, "main", 4.02, 90.0), run("fox_pro_acp", 1e-3, 0, "acp", 3.99, 120.0),
             run("fox_pro_acp", 1e-3, 1, "acp", 4.03, 120.0)]
    assert claim4_table(runs).startswith("Not run yet: `--parts acp-released`.\n\nThe pair at 16,384 tokens of "
                                         "context (`--parts acp-16k`) has not run yet.\n\nThe earlier pair")
    said = claim4(runs)
    assert said.startswith("Not run yet: `--parts acp-released`.\n\nThe earlier pair (`--parts acp`): ACP moves the "
                           "held-out loss by -0.25% (seed 0), +0.25% (seed 1)")
    assert "not back to back: ACP 1.33× the dense run's tokens/s" in said
    rows = summary(runs)
    assert "| 4. ACP leaves the loss unchanged | no change measured (2 seeds) |" in rows
    assert "| 4. ACP prunes most tiles and trains faster | pruning: not measured over many rows; speed: not " \
           "measured back to back |" in rows


def test_the_16k_pair_gets_its_own_table_and_sentence_against_its_twin():
    runs = suite() + [run("fox_pro_released_dense_16k", 1e-3, 0, "acp-16k", 4.05, 50.0),
                      run("fox_pro_released_acp_16k", 1e-3, 0, "acp-16k", 4.049, 80.0, rows=[0.9, 0.94])]
    table = claim4_table(runs)
    head, _, rows = table.partition("At 16,384 tokens of context (`--parts acp-16k`):\n\n")
    assert "| 2 | 4.1100 |" in head and rows.splitlines()[0].startswith("| seed | dense twin | ACP held-out loss | "
                                                                           "ACP − twin |")
    assert rows.splitlines()[2] == "| 0 | 4.0500 | 4.0490 | -0.0010 | 50 | 80 | 1.600× | 92.0 [90.0, 94.0] |"
    assert (" At 16,384 tokens of context (seed 0, one pair): ACP − dense twin -0.0010 nats/token; ACP at 1.600× "
            "the twin's tokens/s, back to back on one NVIDIA H200; 92.0% [90.0, 94.0] of the forward tiles pruned "
            "over 2 held-out rows.") in claim4(runs)
    assert "At 16,384" not in claim4(suite())
