"""eval.eviction on a run written by train.py: loss with and without eviction, generations compared, JSON."""

import json

import pytest

from eval.eviction import run


def test_eviction_report_of_a_trained_run(tiny_text_run, tmp_path, capsys):
    out = tmp_path / "ev"
    # the auto threshold on a 4-step model keeps everything; an explicit one drops keys
    [auto] = run.main([str(tiny_text_run), "--rows", "2", "--length", "512", "--chunk", "128", "--prompt-len", "128",
                       "--new-tokens", "6", "--device", "cpu", "--out", str(out)])
    assert json.loads((out / f"{tiny_text_run.name}.json").read_text()) == auto
    assert auto["generations"] == len(auto["rows"]) >= 1 and auto["dtype"] == "float32"
    assert abs(auto["loss_evicted"] - auto["loss_full"]) <= auto["loss_diff_max_abs"]
    assert 0 < auto["kept_fraction"] <= 1 and auto["kv_bytes_evicted"] <= auto["kv_bytes_full"]
    [coarse] = run.main([str(tiny_text_run), "--rows", "2", "--length", "512", "--chunk", "128", "--prompt-len",
                         "128", "--new-tokens", "6", "--device", "cpu", "--threshold", "-0.5"])
    assert coarse["kept_fraction"] < auto["kept_fraction"] and coarse["kv_bytes_evicted"] < coarse["kv_bytes_full"]
    assert coarse["loss_diff_max_abs"] > auto["loss_diff_max_abs"]
    assert "| model | loss_full |" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--length", "100", "--prompt-len", "96", "--new-tokens", "8"], "--prompt-len 96 + --new-tokens 8"),
    (["--rows", "0"], "argument --rows: must be an integer >= 1; got 0"),
])
def test_bad_flags_are_named(tiny_text_run, args, message, capsys):
    with pytest.raises((ValueError, SystemExit)) as e:
        run.main([str(tiny_text_run), "--device", "cpu", *args])
    assert message in (str(e.value) + capsys.readouterr().err)
