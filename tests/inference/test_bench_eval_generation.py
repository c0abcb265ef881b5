"""scripts/bench_eval_generation.py on the CPU at toy size: both paths' rows, equal continuations, and --out."""

from tests.script_modules import load_script

load_script("bench_generate")  # its sibling import
COLUMNS, main = load_script("bench_eval_generation").COLUMNS, load_script("bench_eval_generation").main


def test_bench_times_both_paths_on_the_same_prompts_and_writes_the_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0")  # a progress line after every prompt or group
    out = tmp_path / "bench.md"
    argv = ["--model", "fox_pro", "--size", "tiny", "--override", "model.n_layers=1", "model.d_model=64",
            "model.head_dim=32", "--lengths", "20,37", "--depths", "3", "--max-new-tokens", "6", "--batch-size", "4",
            "--device", "cpu", "--out", str(out)]
    rows = main(argv)
    assert [(r["path"], r["pass"]) for r in rows] == [("one at a time", 1), ("batched (4)", 1),
                                                       ("one at a time", 2), ("batched (4)", 2)]
    for r in rows:
        assert r["prompts"] == 6 and r["prompt tokens"] == 3 * (20 + 37) and r["wall s"] > 0
        assert r["same tokens"] == "6/6"  # float32 on the CPU: a batch decodes as each prompt alone
        assert 6 <= r["new tokens"] <= 36
    assert rows[1]["speedup"] == rows[0]["wall s"] / rows[1]["wall s"]  # against one at a time, same pass
    assert rows[3]["speedup"] == rows[2]["wall s"] / rows[3]["wall s"] and rows[2]["speedup"] == 1
    printed = capsys.readouterr()
    assert "| " + " | ".join(COLUMNS) + " |" in printed.out
    for line in ("pass 1, one at a time: 3/6 prompt", "pass 2, batched (4): 4/6 prompt", "batched (4): 6/6 prompt"):
        assert line in printed.err
    text = out.read_text()
    assert text.startswith("# Evaluation decoding benchmark") and "--batch-size 4" in text
    assert text.count("| one at a time | 1 |") == 1 and text.count("| batched (4) | 2 |") == 1


def test_bench_draws_longbench_like_lengths_in_the_range(capsys):
    argv = ["--model", "fox_pro", "--size", "tiny", "--override", "model.n_layers=1", "model.d_model=64",
            "model.head_dim=32", "--lengths", "9,40", "--random-lengths", "5", "--max-new-tokens", "4",
            "--batch-size", "2", "--passes", "1", "--device", "cpu"]
    rows = main(argv)
    assert [r["prompts"] for r in rows] == [5, 5] and rows[1]["same tokens"] == "5/5"
    n_tok = rows[0]["prompt tokens"]
    assert 5 * 9 <= n_tok <= 5 * 40 and n_tok not in (5 * 9, 5 * 40)  # drawn in the range, not at its ends
    assert main(argv)[0]["prompt tokens"] == n_tok  # seeded: the same prompts every run


def test_bench_rejects_bad_sizes(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--size", "tiny", "--depths", "0", "--device", "cpu"])
    assert "--depths, --max-new-tokens and --passes must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--size", "tiny", "--batch-size", "0", "--device", "cpu"])
    assert "argument --batch-size: must be an integer >= 1; got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--size", "tiny", "--passes", "0", "--device", "cpu"])
    assert "--passes must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--size", "tiny", "--dtype", "fp8", "--device", "cpu"])
    assert "argument --dtype: invalid choice: 'fp8'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", "transformer_pro", "--size", "tiny", "--acp-eviction", "--device", "cpu"])
    assert "--acp-eviction needs a forget gate" in capsys.readouterr().err
    for bad in (["--random-lengths", "0"], ["--random-lengths", "4", "--lengths", "8,8"]):
        with pytest.raises(SystemExit):
            main(["--size", "tiny", "--device", "cpu", *bad])
        assert "--random-lengths" in capsys.readouterr().err
