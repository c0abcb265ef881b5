"""eval.per_token_loss on runs written by train.py: JSON per run, overlay plot, re-plot without the model."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from eval.common import load_run
from eval.per_token_loss import plot, run
from forgetting_transformer.data import read_rows
from tests.script_modules import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ptl")
    rng = np.random.default_rng(0)
    for name, n in (("train.zarr", 8), ("heldout.zarr", 3)):
        arr = zarr.create_array(str(tmp / "data" / name), shape=(n, 256), chunks=(1, 256), dtype="uint16")
        arr[:] = rng.integers(0, 50, size=(n, 256))
    out = []
    for model in ("fox_pro", "fox_llama"):
        d = tmp / model
        cmd = [sys.executable, str(ROOT / "train.py"), f"output_dir={d}", f"model={model}", "data=longcrawl64",
               f"data.data_dir={tmp / 'data'}", "data.seq_len=64", "data.vocab_size=50", "data.bos_id=0",
               "model.n_layers=1", "model.d_model=32", "model.n_heads=2", "train.batch_size=4",
               "train.micro_batch_size=4", "train.max_steps=2", "eval.heldout_batches=1", "eval.per_token_loss=false"]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, PYTHONUNBUFFERED="1"))
        assert res.returncode == 0, res.stderr[-3000:]
        out.append(d)
    return tmp, out


def test_load_run_restores_the_trained_weights(runs):
    tmp, (fox_pro, _) = runs
    model, cfg, ckpt = load_run(fox_pro)
    assert cfg.model.name == "fox_pro" and ckpt.name == "step_00000002"
    x, y = read_rows(tmp / "data" / "heldout.zarr", [0], 64, vocab_size=50, bos_id=0)
    fresh = load_run(fox_pro)[0]
    torch.testing.assert_close(model(x, y), fresh(x, y), rtol=0, atol=0)  # deterministic, fully loaded
    with pytest.raises(FileNotFoundError, match="step 7.*; the steps it has: 2$"):
        load_run(fox_pro, step=7)
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        load_run(tmp)


def test_cli_evaluates_beyond_training_length_and_plots(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0")  # a progress line per batch
    tmp, dirs = runs
    out = tmp_path / "res"
    run.main([str(d) for d in dirs] + ["--out", str(out), "--rows", "3", "--length", "256", "--window", "5",
                                        "--device", "cpu"])
    results = sorted(out.glob("*.json"))
    assert [p.stem for p in results] == ["fox_llama", "fox_pro"]
    res = json.loads(results[1].read_text())
    assert len(res["loss"]) == 256 and res["train_len"] == 64 and res["step"] == 2
    # L(i) is the mean over rows of the model's per-token loss: check one position independently.
    model, _, _ = load_run(dirs[0])
    x, y = read_rows(tmp / "data" / "heldout.zarr", [0, 1, 2], 256, vocab_size=50, bos_id=0)
    with torch.no_grad():
        expected = model(x, y).double().mean(0)
    np.testing.assert_allclose(res["loss"], expected.numpy(), rtol=1e-5)
    assert (out / "per_token_loss.png").stat().st_size > 10_000
    assert "per-token loss: 1/1 batch (100%) | " in capsys.readouterr().err  # 3 rows, batch size 4
    replot = plot.plot_per_token_loss(results, tmp_path / "again.png", window=3, logx=True)
    assert replot.stat().st_size > 10_000


def test_what_a_data_dir_cannot_have_checked_is_a_note(runs, tmp_path, capsys):
    """LongCrawl64's download has neither tokenizer.json nor meta.json: the evaluation runs and says in one line
    that the data's tokenizer and text escape could not be checked against the model's."""
    tmp, dirs = runs
    data = tmp / "data"
    run.evaluate_run(dirs[0], tmp_path, rows=1, length=64, batch_size=1, device="cpu")
    assert (f"note: the tokenizer and text escape of {data} could not be checked against the model's: {data} has no "
            f"tokenizer.json and no meta.json") in capsys.readouterr().err.splitlines()
    (tmp_path / "meta_only").mkdir()
    (tmp_path / "meta_only" / "meta.json").write_text(json.dumps({"text_escape": "json"}))  # the runs' (longcrawl64)
    from eval.common import check_same_tokenizer

    assert check_same_tokenizer(dirs[0], tmp_path / "meta_only") is None
    assert capsys.readouterr().err == (f"note: the tokenizer of {tmp_path / 'meta_only'} could not be checked against "
                                       f"the model's: {tmp_path / 'meta_only'} has no tokenizer.json\n")


@pytest.mark.parametrize("flag, value", [("--rows", "0"), ("--length", "-5"), ("--batch-size", "0"), ("--step", "-1")])
def test_numbers_below_one_are_argparse_errors_naming_the_flag(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        run.main(["some_run", "--out", "x", flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {flag}: must be an integer >= 1; got {value}" in err


def test_length_beyond_the_rows_is_a_clear_error(runs, tmp_path):
    _, dirs = runs
    with pytest.raises(ValueError, match="512"):
        run.evaluate_run(dirs[0], tmp_path, rows=1, length=512, batch_size=1, device="cpu")


def test_hugging_face_export_gives_the_same_curve(tiny_text_run, tmp_path):
    from omegaconf import OmegaConf

    export_hf = load_script("export_hf")
    hf_dir = export_hf.export(tiny_text_run, tmp_path / "hf")
    data_dir = OmegaConf.load(tiny_text_run / "config.yaml").data.data_dir
    a = run.evaluate_run(tiny_text_run, tmp_path / "a", rows=1, length=512, batch_size=1, device="cpu")
    with pytest.raises(ValueError, match="--data-dir"):
        run.evaluate_run(hf_dir, tmp_path / "b", rows=1, length=512, batch_size=1, device="cpu")
    b = run.evaluate_run(hf_dir, tmp_path / "b", rows=1, length=512, batch_size=1, device="cpu", data_dir=data_dir)
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    np.testing.assert_allclose(rb["loss"], ra["loss"], rtol=1e-6)
    assert ra["train_len"] == 256 and rb["train_len"] is None
    plot.plot_per_token_loss([a, b], tmp_path / "both.png")


def test_data_tokenized_differently_is_refused(tiny_text_run, tmp_path):
    """Books converted with a freshly trained tokenizer of the same size give garbage losses: refused, naming both
    tokenizers; data converted with the model's own tokenizer.json is accepted, and the JSON records it."""
    from omegaconf import OmegaConf

    from forgetting_transformer.data.prepare import EMBEDDED_CORPUS, prepare_corpus, tokenizer_fingerprint

    own = Path(OmegaConf.load(tiny_text_run / "config.yaml").data.data_dir) / "tokenizer.json"
    kw = dict(vocab_size=512, doc_len=1024, heldout_docs=1, progress=False)
    prepare_corpus([str(EMBEDDED_CORPUS)], tmp_path / "fresh", max_docs=5, seed=3, **kw)
    assert tokenizer_fingerprint(tmp_path / "fresh" / "tokenizer.json") != tokenizer_fingerprint(own)
    with pytest.raises(ValueError, match=r"tokenized with another tokenizer.*fresh/tokenizer.json \(fingerprint"):
        run.evaluate_run(tiny_text_run, tmp_path / "out", rows=1, length=256, batch_size=1, device="cpu",
                         data_dir=tmp_path / "fresh")
    prepare_corpus([str(EMBEDDED_CORPUS)], tmp_path / "same", max_docs=5, seed=3, tokenizer=str(own), **kw)
    out = run.evaluate_run(tiny_text_run, tmp_path / "out", rows=1, length=256, batch_size=1, device="cpu",
                           data_dir=tmp_path / "same")
    res = json.loads(out.read_text())
    assert res["tokenizer_fingerprint"] == tokenizer_fingerprint(own) == json.loads(
        (tmp_path / "same" / "meta.json").read_text())["tokenizer_fingerprint"]


def test_legend_labels_tell_runs_of_one_model_apart(tmp_path, monkeypatch):
    """Two runs of one model (train.py names both curves after the model) get their run dirs in the legend;
    --label names each curve; identical labels are refused, naming the files."""
    files = []
    for run_dir, name in (("run_a", "fox_pro"), ("run_b", "fox_pro"), ("run_c", "fox_llama")):
        (tmp_path / run_dir).mkdir()
        f = tmp_path / run_dir / "per_token_loss.json"  # where train.py writes it
        f.write_text(json.dumps({"name": name, "train_len": 4, "loss": [3.0, 2.0, 1.0, 1.0]}))
        files.append(f)
    legends = []

    def save(fig, png, **kw):
        legends.append([[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes])
        return png

    monkeypatch.setattr("forgetting_transformer.plotting.save_figure", save)
    plot.main([str(f) for f in files] + ["--out", str(tmp_path / "a.png"), "--window", "1"])
    assert legends[-1] == [["fox_pro (run_a)", "fox_pro (run_b)", "fox_llama"]] * 2  # both panels
    plot.main([str(f) for f in files] + ["--out", str(tmp_path / "b.png"), "--label", "lr 1e-3", "--label",
                                         "lr 2e-3", "--label", "LLaMA"])
    assert legends[-1] == [["lr 1e-3", "lr 2e-3", "LLaMA"]] * 2
    with pytest.raises(ValueError, match=r"run_a/per_token_loss.json and .*run_b/per_token_loss.json would both be "
                                         r"labelled 'same' in the legend; give each file its own label with --label"):
        plot.main([str(f) for f in files[:2]] + ["--out", str(tmp_path / "c.png"), "--label", "same", "--label",
                                                 "same"])
    (tmp_path / "elsewhere" / "run_a").mkdir(parents=True)  # a second run dir of the same name
    twin = tmp_path / "elsewhere" / "run_a" / "per_token_loss.json"
    twin.write_text(files[0].read_text())
    with pytest.raises(ValueError, match=r"both be labelled 'fox_pro \(run_a\)'"):
        plot.plot_per_token_loss([files[0], twin], tmp_path / "d.png")
    with pytest.raises(ValueError, match=r"1 labels \(--label\) for 2 result files"):
        plot.plot_per_token_loss(files[:2], tmp_path / "e.png", labels=["x"])
