"""The T_max sweep of the data-independent and fixed gates and the training-length sweep of the released pair: their
tables, verdicts and summary lines from synthetic results, each cell checked by hand."""

import numpy as np

from eval.reproduction_results import RunResult
from eval.reproduction_sweeps import lengths_table, lengths_verdict, sweep_tables, tmax_table, tmax_verdict
from eval.reproduction_verdicts import summary

T = 16384


def run(label, lr, seed, part, loss, curve=None):
    r = RunResult(f"{label}-lr{lr:g}-s{seed}", label, seed, lr, part, "NVIDIA H200", "v", loss, None)
    r.loss_curve = curve
    return r


def sweep():
    """The learning-rate sweep (FoX pick 1e-3, Transformer pick 2e-3) and the released pair at seeds 0-2."""
    rates = (("fox_pro", 1e-3, 4.0), ("fox_pro", 2e-3, 4.1), ("transformer_pro", 2e-3, 4.2),
             ("transformer_pro", 1e-3, 4.3))
    runs = [run(m, lr, 0, "lr", loss) for m, lr, loss in rates]
    return runs + [run("fox_pro_released", 1e-3, s, "released", 4.10 + 0.01 * s, curve(0.0)) for s in range(3)] \
        + [run("transformer_pro_released", 2e-3, s, "released", 4.25, curve(0.1 + 0.01 * s)) for s in range(3)]


def curve(rise, n=4096):
    """L(i) = 4 up to 2n, then 4 + rise (the whole (2n, 16,384] range), so a model's rise past n is ``rise``."""
    c = np.full(T, 4.0)
    c[2 * n:] += rise
    return c


def with_tmax(runs, points):
    """points: {(kind, T_max): [loss at seed 0, 1, ...]}; T_max 256 is the released-gates run of the presets."""
    for (kind, t), losses in points.items():
        label = f"fox_pro_released_{kind}" + ("" if t == 256 else f"_tmax{t}")
        runs += [run(label, 1e-3, s, "tmax" if t != 256 else "released-gates", loss) for s, loss in enumerate(losses)]
    return runs


def line(runs, start):
    return next(ln for ln in summary(runs).splitlines() if ln.startswith(f"| {start}"))


def test_the_tmax_table_pairs_each_point_with_fox_pro_at_equal_seeds():
    runs = sweep()
    assert tmax_table(runs) == tmax_verdict(runs) == "Not run yet: `--parts tmax`."
    assert line(runs, "3. The data-dependent gate beats").endswith("| not run (`--parts tmax`) |")
    runs = with_tmax(runs, {("data_independent", 32): [4.20, 4.21, 4.22], ("fixed", 32): [4.30],
                            ("data_independent", 256): [4.15, 4.16], ("fixed", 2048): [4.05, 4.16, 4.12]})
    text = tmax_table(runs)
    half = 4.303 * np.std([0.10, 0.10, 0.10], ddof=1) / 3 ** 0.5  # t table (3 decimals); 0: one difference
    assert f"| 32 | +0.1000 [{0.1 - half:+.4f}, {0.1 + half:+.4f}] (3) | +0.2000 (1) | data-independent reproduced; " \
           "fixed inconclusive |" in text
    assert "| 256 (presets) | +0.0500 [+0.0500, +0.0500] (2) | – | data-independent reproduced |" in text
    diffs = [4.05 - 4.10, 4.16 - 4.11, 4.12 - 4.12]  # fixed at 2,048 against FoX (Pro), seed by seed
    ci = 4.303 * np.std(diffs, ddof=1) / 3 ** 0.5
    assert f"| 2,048 | – | {np.mean(diffs):+.4f} [{np.mean(diffs) - ci:+.4f}, {np.mean(diffs) + ci:+.4f}] (3) | " \
           "fixed inconclusive |" in text
    assert "| 16,384 | – | – | – |" in text
    assert line(runs, "3. The data-dependent gate beats").endswith(
        "| reproduced at 2, inconclusive at 2 of 4 (gate, T_max) points (1–3 seeds each) |")
    assert tmax_verdict(runs).startswith("**Verdict: reproduced at 2, inconclusive at 2 of 4 (gate, T_max) points")


def test_the_length_table_measures_each_rise_past_its_own_training_length():
    runs = sweep()
    assert lengths_table(runs) == lengths_verdict(runs) == "Not run yet: `--parts train-lengths`."
    assert line(runs, "2. FoX extrapolates past every").endswith("| not run (`--parts train-lengths`) |")
    for s in range(2):
        runs += [run("fox_pro_released_ctx1024", 1e-3, s, "train-lengths", 4.3, curve(0.02 * s, 1024)),
                 run("transformer_pro_released_ctx1024", 2e-3, s, "train-lengths", 4.4, curve(0.5 + 0.4 * s, 1024))]
    runs.append(run("transformer_pro_released_ctx2048", 2e-3, 0, "train-lengths", 4.4, curve(0.3, 2048)))
    text = lengths_table(runs)
    gap = [0.5 - 0.0, 0.9 - 0.02]
    ci = 12.706 * np.std(gap, ddof=1) / 2 ** 0.5
    # n = 1,024: the rise over (2,048, 4,096], and over (8,192, 16,384] where the curves also sit at 4 + rise
    assert f"| 1,024 | 2, 2 | +0.010 | +0.700 | +0.010 | +0.700 | +0.6900 [{0.69 - ci:+.4f}, {0.69 + ci:+.4f}] (2) |" \
           in text
    assert "| 2,048 | 0, 1 | – | +0.300 | – | +0.300 | – |" in text
    assert "| 4,096 | 3, 3 | +0.000 | +0.110 | +0.000 | +0.110 | +0.1100 [+0.0852, +0.1348] (3) |" in text
    row = line(runs, "2. FoX extrapolates past every")
    assert row.endswith("| 1,024: inconclusive (2 seeds); 4,096: reproduced (3 seeds) |")
    assert lengths_verdict(runs).startswith("**Verdict (Transformer − FoX rise past the training length, by training "
                                            "length): 1,024: inconclusive (2 seeds); 4,096: reproduced (3 seeds).** "
                                            "FoX (Pro)'s own L(i) from inside to 2–4× past its training length moves "
                                            "by 1,024 +0.010, 4,096 +0.000 nats/token")
    assert set(sweep_tables(runs)) == {"tmax", "verdict_tmax", "train_lengths", "verdict_train_lengths"}
