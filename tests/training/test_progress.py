"""Progress lines: count, rate and ETA at least every ``every`` seconds (a patched clock, never wall time), plain
lines off a terminal and under train.py's log copy, redrawn in place on a terminal; train.py prints them for
training, the held-out loss and the per-token loss, on the console and in train.log."""

import io
import os

import pytest

from forgetting_transformer.training.progress import Progress, progress, progress_every
from test_train_e2e import command, run


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_line_each_interval_with_rate_and_eta():
    clock, out = Clock(), io.StringIO()
    with Progress(100, "held-out loss", "batch", every=10, stream=out, clock=clock) as bar:
        for _ in range(100):
            clock.t += 0.5  # 2 batches a second
            bar.update()
    lines = out.getvalue().splitlines()
    # 10 s after the start and after each line: t = 10, 20, ..., 50 (n = 20, 40, ..., 100); close adds none
    assert lines == [f"held-out loss: {n}/100 batch ({n}%) | 2 batch/s | elapsed 0:00:{n // 2:02d}"
                     + (f" | ETA 0:00:{(100 - n) // 2:02d}" if n < 100 else "") for n in (20, 40, 60, 80, 100)]


def test_nothing_before_the_interval_and_a_closing_line_after_lines():
    clock, out = Clock(), io.StringIO()
    bar = Progress(None, "tokenizing", "doc", every=10, stream=out, clock=clock)
    clock.t = 9.9
    bar.update(50)
    assert out.getvalue() == ""  # unknown total, before 10 s: quiet
    clock.t = 12
    bar.update(10)
    clock.t = 13
    bar.update(3)
    bar.close()
    assert out.getvalue().splitlines() == ["tokenizing: 60 doc | 5 doc/s | elapsed 0:00:12",
                                           "tokenizing: 63 doc | 4.85 doc/s | elapsed 0:00:13"]


def test_a_resumed_count_rates_only_this_process_and_hold_waits_an_interval():
    clock, out = Clock(), io.StringIO()
    bar = Progress(12, "training", "step", initial=4, every=10, stream=out, clock=clock,
                   detail=lambda: f"{bar.rate() * 1024:.0f} tokens/s")
    clock.t = 8
    bar.update()
    bar.hold()  # a metrics row was printed at t = 8
    clock.t = 16
    bar.update()
    assert out.getvalue() == ""
    clock.t = 18
    bar.update()
    assert out.getvalue() == "training: 7/12 step (58%) | 0.167 step/s | 171 tokens/s | elapsed 0:00:18 | ETA 0:00:30\n"


def test_a_terminal_gets_one_line_redrawn_and_a_log_copy_gets_plain_lines():
    clock, term = Clock(), Terminal()
    with Progress(4, "NIAH", "cell", stream=term, clock=clock) as bar:
        for _ in range(4):
            clock.t += 1
            bar.update()
    text = term.getvalue()
    assert text.count("\r") == 5 and text.count("\n") == 1 and text.endswith("NIAH: 4/4 cell (100%) | 1 cell/s | "
                                                                             "elapsed 0:00:04\x1b[K\n")

    class Copied(Terminal):
        copied_to_log = True  # as train.py's console copy says

    clock, copied = Clock(), Copied()
    for _ in progress(range(4), "NIAH", "cell", stream=copied, clock=clock, every=2):
        clock.t += 1
    assert "\r" not in copied.getvalue() and copied.getvalue().count("\n") == 2


def test_disabled_prints_nothing_and_bad_interval_names_the_variable(monkeypatch):
    out = io.StringIO()
    with Progress(3, "x", every=0, stream=out, enabled=False) as bar:
        bar.update(3)
    assert out.getvalue() == ""
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "soon")
    with pytest.raises(ValueError, match="FOX_PROGRESS_SECONDS='soon'"):
        progress_every()
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "60")
    assert progress_every() == 60.0


def test_train_py_prints_progress_for_training_and_evaluation_into_train_log(markov_data_dir, tmp_path):
    out = tmp_path / "run"
    res = run(command(markov_data_dir, out, "train.max_steps=4", "train.log_every=2"),
              env=dict(os.environ, FOX_PROGRESS_SECONDS="0"))
    assert res.returncode == 0, res.stderr[-2000:]
    for line in ("training: 1/4 step (25%) | ", "training: 3/4 step (75%) | ", "held-out loss: 2/2 batch (100%) | ",
                 "per-token loss: 1/1 batch (100%) | "):
        assert line in res.stderr, line
    assert "tokens/s | elapsed" in res.stderr and "| ETA " in res.stderr
    log = (out / "train.log").read_text()
    for line in res.stderr.splitlines() + res.stdout.splitlines():
        assert line in log, line
