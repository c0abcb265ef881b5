"""scripts/bench_generate.py on the CPU at toy size: every mode's row, the kept-KV column, and --out."""

from tests.script_modules import load_script

COLUMNS, main = load_script("bench_generate").COLUMNS, load_script("bench_generate").main


def test_bench_prints_and_writes_a_row_per_model_batch_and_mode(tmp_path, capsys):
    out = tmp_path / "docs" / "bench.md"
    argv = ["--models", "fox_pro", "transformer_pro", "--size", "tiny", "--prompt-len", "40", "--new-tokens", "20",
            "--batch", "1", "2", "--eviction", "--sdpa-baseline", "--block-size", "16", "--device", "cpu",
            "--override", "model.n_layers=1", "model.d_model=64", "model.head_dim=32", "--out", str(out)]
    rows = main(argv)
    assert [(r["model"], r["batch"], r["mode"]) for r in rows] == [
        ("fox_pro tiny", 1, "full"), ("fox_pro tiny", 1, "evict"), ("fox_pro tiny", 2, "full"),
        ("fox_pro tiny", 2, "evict"), ("transformer_pro tiny", 1, "full"), ("transformer_pro tiny", 1, "sdpa"),
        ("transformer_pro tiny", 2, "full"), ("transformer_pro tiny", 2, "sdpa")]
    for r in rows:
        assert r["prefill ms"] > 0 and r["ms/token"] > 0 and r["tokens/s"] > 0
        assert (r["kept"] < 1) == (r["mode"] == "evict")  # untrained FoX gates (f ~ 0.5) forget within tokens
    printed = capsys.readouterr().out
    assert "| " + " | ".join(COLUMNS) + " |" in printed
    text = out.read_text()
    assert text.startswith("# Generation benchmark") and "--sdpa-baseline" in text and text.count("| fox_pro") == 4


def test_bench_writes_nothing_without_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["--models", "fox_llama", "--size", "tiny", "--prompt-len", "20", "--new-tokens", "4", "--batch", "1",
          "--device", "cpu", "--override", "model.n_layers=1"])
    assert list(tmp_path.iterdir()) == []
