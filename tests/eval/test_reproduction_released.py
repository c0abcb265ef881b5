"""The summary's computed lines: Table 3's gates and RoPE on the released definition (part ``released-gates``),
each paired with its baseline at equal seeds (the FoX models at the FoX pick, the Transformer (LLaMA) pair at its
own rate), and PaTH-FoX against FoX (Pro)."""

import numpy as np

from eval.reproduction import released_table
from eval.reproduction_results import RunResult
from eval.reproduction_verdicts import gate_diffs, released, summary


def run(label, lr, seed, part, loss):
    return RunResult(f"{label}-lr{lr:g}-s{seed}", label, seed, lr, part, "NVIDIA H200", "v", loss, None)


def suite(gates=True):
    sweep = (("fox_pro", 1e-3, 4.0), ("fox_pro", 2e-3, 4.1), ("transformer_pro", 2e-3, 4.2),
             ("transformer_pro", 1e-3, 4.3))
    runs = [run(m, lr, 0, "lr", loss) for m, lr, loss in sweep]
    runs += [run("fox_pro_released", 1e-3, s, "released", loss) for s, loss in enumerate((4.10, 4.12, 4.11))]
    runs += [run("transformer_pro_released", 2e-3, s, "released", loss) for s, loss in enumerate((4.2, 4.25, 4.3))]
    runs += [run("transformer_llama", 1e-3, s, "llama-seeds" if s else "lr-llama", loss)
             for s, loss in enumerate((4.5, 4.6, 4.55))]
    runs.append(run("transformer_llama_no_rope", 2e-3, 0, "gates", 5.0))  # the gates part's, at the Pro pick
    if gates:
        for label, losses in (("fox_pro_released_data_independent", (4.15, 4.16, 4.17)),
                              ("fox_pro_released_fixed", (4.2, 4.12, 4.05)),
                              ("fox_pro_released_rope", (4.09, 4.11, 4.10))):
            runs += [run(label, 1e-3, s, "released-gates", loss) for s, loss in enumerate(losses)]
        runs += [run("transformer_llama_no_rope", 1e-3, s, "released-gates", loss)
                 for s, loss in enumerate((5.1, 5.2, 5.12))]
    return runs


def test_each_gate_pairs_with_its_baseline_at_its_rate():
    diffs = {claim: (d, sign) for claim, d, sign in gate_diffs(suite())}
    data_indep, sign = diffs["A data-independent forget gate is worse than the data-dependent one"]
    assert np.allclose(data_indep, [0.05, 0.04, 0.06]) and sign == +1
    no_rope, sign = diffs["The Transformer (LLaMA) needs RoPE"]
    assert np.allclose(no_rope, [0.6, 0.6, 0.57]) and sign == +1  # at 1e-3, not the gates part's 2e-3 run
    assert diffs["RoPE adds nothing to FoX (Pro)"][1] is None


def test_the_summary_and_the_released_verdict_state_each_gate():
    rows = {ln.split(" | ")[0][2:]: ln.split(" | ")[1][:-2] for ln in summary(suite()).splitlines()[2:]}
    assert rows["3. A data-independent forget gate is worse than the data-dependent one"] == \
        "reproduced (3 seeds, released definition)"
    assert rows["3. A fixed forget gate is worse than the data-dependent one"] == \
        "inconclusive (3 seeds, released definition)"
    assert rows["3. RoPE adds nothing to FoX (Pro)"].startswith("differs: lower by 0.010 nats/token (3 seeds")
    assert rows["3. The Transformer (LLaMA) needs RoPE"] == "reproduced (3 seeds, released definition)"
    assert "Table 3's gates and RoPE (each minus its baseline): a data-independent forget gate is worse than the " \
           "data-dependent one: +0.050, [" in released(suite())
    before = {ln.split(" | ")[0][2:]: ln.split(" | ")[1][:-2] for ln in summary(suite(False)).splitlines()[2:]}
    assert before["3. RoPE adds nothing to FoX (Pro)"] == "not run (`--parts released-gates`)"
    assert "Table 3's gates" not in released(suite(False))
    said = released(suite())
    assert "; RoPE adds nothing to FoX (Pro): -0.010, [" in said  # an acronym keeps its case mid-sentence
    assert "; the Transformer (LLaMA) needs RoPE: +0.590, [" in said


def test_the_released_table_shows_the_gates_once_they_have_run():
    text = released_table(suite())
    assert "| data-indep. gate (lr 0.001) | fixed gate (lr 0.001) | + RoPE (lr 0.001) |" in text.splitlines()[0]
    assert "| Transformer (LLaMA) w/o RoPE − with RoPE, both at the LLaMA pick | +0.6000, +0.6000, +0.5700 |" in text
    before = released_table(suite(False))
    assert "gate (lr" not in before.splitlines()[0] and "w/o RoPE" not in before


def test_the_path_line_pairs_path_fox_with_fox_pro_at_equal_seeds():
    line = next(ln for ln in summary(suite()).splitlines() if "PaTH-FoX beats FoX" in ln)
    assert line.endswith("| not run (`--parts path`) |")
    runs = suite() + [run("fox_pro", 1e-3, 1, "main", 4.02), run("path_fox_pro", 1e-3, 0, "path", 3.97),
                      run("path_fox_pro", 1e-3, 1, "path", 3.985)]
    line = next(ln for ln in summary(runs).splitlines() if "PaTH-FoX beats FoX" in ln)
    assert line.endswith("| reproduced (2 seeds) |")  # -0.030, -0.035: lower, as the paper has it
    line = next(ln for ln in summary(runs[:-1]).splitlines() if "PaTH-FoX beats FoX" in ln)
    assert line.endswith("| inconclusive (1 seed) |")


def with_path(runs):
    """PaTH (Pro) and PaTH-FoX (Pro) as released at seeds 0-2 (the FoX pick) and at the rates either side."""
    for label, losses, rates in (("path_pro_released", (4.30, 4.28, 4.33), {5e-4: 4.35, 2e-3: 4.31}),
                                 ("path_fox_pro_released", (4.08, 4.10, 4.09), {5e-4: 4.12, 2e-3: 4.07})):
        runs = runs + [run(label, 1e-3, s, "path-released", loss) for s, loss in enumerate(losses)]
        runs += [run(label, lr, 0, "path-lr", loss) for lr, loss in rates.items()]
    return runs


def test_the_released_path_runs_pair_with_the_released_pair_and_check_their_rate():
    from eval.reproduction import path_table
    from eval.reproduction_verdicts import path

    runs = with_path(suite())
    text = path_table(runs)
    assert text.splitlines()[0] == ("| seed | PaTH (Pro) (lr 0.001) | PaTH-FoX (Pro) (lr 0.001) | FoX (Pro) (lr 0.001) "
                                    "| Transformer (Pro) (lr 0.002) |")
    assert "| 1 | 4.2800 | 4.1000 | 4.1200 | 4.2500 |" in text
    assert "| PaTH-FoX (Pro) − FoX (Pro) | -0.0200, -0.0200, -0.0200 | -0.0200 [-0.0200, -0.0200] | lower | " \
           "reproduced |" in text
    assert "| PaTH-FoX (Pro) | 4.1200 | 4.0800 | **4.0700** |" in text  # 5e-4, 1e-3, 2e-3 at seed 0
    said = path(runs)
    assert said.startswith("**Verdict, released definition: PaTH-FoX (Pro) − FoX (Pro) -0.020 [-0.020, -0.020], "
                           "reproduced (3 seeds); PaTH (Pro) − Transformer (Pro) +0.053")
    assert "PaTH-FoX (Pro)'s best rate at seed 0 over 0.0005, 0.001, 0.002 is 0.002, an end of its grid." in said
    assert "PaTH (Pro)'s best rate at seed 0 over 0.0005, 0.001, 0.002 is 0.001, inside its grid." in said
    line = next(ln for ln in summary(runs).splitlines() if "PaTH-FoX beats FoX" in ln)
    assert line.endswith("| reproduced (3 seeds) |")


def test_the_heads_line_checks_all_three_statements_of_claim_5():
    from eval.reproduction_verdicts import claim5

    def acp_run(layers):  # layers: per layer, each head's pruned tile share
        r = run("fox_pro", 1e-3, 0, "lr", 4.0)
        r.acp = {"tokens": 4096, "tile_fraction": float(np.mean([x for fr in layers for x in fr])),
                 "layers": [{"layer": i, "tile_fraction": fr, "mean_log_fgate": [-0.5] * len(fr)}
                            for i, fr in enumerate(layers)]}
        return [r, *suite()[1:]]

    def line(runs):
        return next(ln for ln in summary(runs).splitlines() if "Local and global heads" in ln)

    assert line(acp_run([[0.9, 0.8, 0.05], [0.8, 0.9, 0.0]])).endswith("| reproduced (one run) |")
    half = acp_run([[0.9, 0.8, 0.05], [0.8, 0.9, 0.7]])
    assert line(half).endswith("| partly reproduced: most heads local, some global, but 1 of 2 layers hold both "
                               "(one run) |")
    assert claim5(half).startswith("**Verdict (fox_pro-lr0.001-s0, one run): partly reproduced: most heads local, "
                                   "some global, but 1 of 2 layers hold both.** 5 of 6 heads")
    no_global, most_global = acp_run([[0.9, 0.8, 0.7], [0.8, 0.9, 0.6]]), acp_run([[0.05, 0.0, 0.9], [0.0, 0.05, 0.9]])
    assert line(no_global).endswith("| contradicts the paper (one run) |")
    assert line(most_global).endswith("| contradicts the paper (one run) |")
    assert line(suite()).endswith("| not run |")


def test_claim_5_reads_every_released_seed_and_keeps_the_earlier_run_below():
    from eval.reproduction_verdicts import claim5

    def with_acp(r, layers):
        r.acp = {"tokens": 4096, "tile_fraction": float(np.mean([x for fr in layers for x in fr])),
                 "layers": [{"layer": i, "tile_fraction": fr, "mean_log_fgate": [-0.01] * len(fr)}
                            for i, fr in enumerate(layers)]}
        return r

    runs = suite()
    released = sorted((r for r in runs if r.label == "fox_pro_released"), key=lambda r: r.seed)
    with_acp(released[0], [[0.9, 0.8, 0.05], [0.8, 0.9, 0.7]])  # 1 of 2 layers holds both
    with_acp(released[1], [[0.9, 0.8, 0.05], [0.8, 0.9, 0.7]])
    with_acp(released[2], [[0.9, 0.8, 0.7], [0.8, 0.9, 0.6]])  # no global head
    with_acp(runs[0], [[0.9, 0.8, 0.05], [0.8, 0.9, 0.0]])  # fox_pro-lr0.001-s0, the earlier definition
    row = next(ln for ln in summary(runs).splitlines() if "Local and global heads" in ln)
    assert row.endswith("| differs between seeds: partly reproduced at 2, contradicts the paper at 1 (3 seeds, "
                        "released definition) |")
    said = claim5(runs)
    assert said.startswith("**Verdict (released definition, 3 seeds): differs between seeds: partly reproduced at 2, "
                           "contradicts the paper at 1.**")
    assert "| 0 | 5 of 6 | 1 of 2 | 0 (100) | 69.2 |" in said  # decay time −1/(−0.01) = 100 tokens
    assert "| 2 | 6 of 6 | 0 of 2 | – | 78.3 |" in said
    assert "**Earlier definition (fox_pro-lr0.001-s0, one run): reproduced.**" in said
    with_acp(released[2], [[0.9, 0.8, 0.05], [0.8, 0.9, 0.0]])  # both layers hold both
    row = next(ln for ln in summary(runs).splitlines() if "Local and global heads" in ln)
    assert row.endswith("| differs between seeds: partly reproduced at 2, reproduced at 1 (3 seeds, released "
                        "definition) |")
    for r in released:
        with_acp(r, [[0.9, 0.8, 0.05], [0.8, 0.9, 0.7]])
    row = next(ln for ln in summary(runs).splitlines() if "Local and global heads" in ln)
    assert row.endswith("| partly reproduced: most heads local, some global, but 1 of 2 layers hold both (3 seeds, "
                        "released definition) |")
