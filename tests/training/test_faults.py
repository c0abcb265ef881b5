"""Fault injection over a multi-checkpoint toy run (CPU): kill -9 at seeded random points, a damaged newest
checkpoint, a disk that fills up (during a checkpoint write, a metrics row, the plot), a read-only or forbidden run
dir, SIGTERM during evaluation and training, Ctrl-C once and twice; and what a user gets wrong about a run dir: a
resume with another config (refused, or allowed and recorded), a second process in a held dir, a damaged held-out
split.

Every trial must end either in a resumed run that is bit-identical to one uninterrupted reference run (every
metrics row, the final checkpoint's tensors, the per-token-loss curve) or in a clear error (``error: ...``, no
traceback); and after every fault the run dir's metrics.jsonl holds a prefix of the reference's rows (none mixed,
duplicated or lost). Runs are forked from pre-imported processes (tests/training/faults.py explains how faults are
placed), two at a time. ``FOX_FAULT_SEED`` picks another seed, ``FOX_FAULT_KILLS`` another number of kill trials.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from test_train_e2e import command

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("FOX_FAULT_SEED", "0"))
KILL_TRIALS = int(os.environ.get("FOX_FAULT_KILLS", "24"))
EXTRA = ("eval.per_token_rows=2", "train.keep_checkpoints=2")  # 12 steps, checkpoints at 4, 8, 12
ROW_KEYS = ("step", "loss", "grad_norm", "lr", "tokens", "heldout_loss")  # not the timing fields
RUN_TIMEOUT_S = 300


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str


class Runner:
    """Processes with train.py imported once; each run is a fork of one of them (two runs at a time)."""

    def __init__(self, n: int = 2):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # SIGINT at its default, as in a process started from a terminal: pytest may run with SIGINT ignored (a
        # shell script's background job), a child inherits that, and train.py then keeps ignoring Ctrl-C
        self.procs = [subprocess.Popen([sys.executable, "-u", str(Path(__file__).with_name("faults.py"))],
                                       cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
                      for _ in range(n)]
        self.free = queue.Queue()
        for p in self.procs:
            answers = queue.Queue()  # its answer lines, read by a thread so that waiting can time out
            threading.Thread(target=lambda p=p, a=answers: [a.put(json.loads(line)) for line in p.stdout],
                             daemon=True).start()
            self.free.put((p, answers))

    def run(self, data_dir, out: Path, *extra, fault=None, events=None, tag="run") -> Result:
        out = Path(out)
        logs = out.parent / f"{out.name}.{tag}"
        req = {"argv": command(data_dir, out, *EXTRA, *extra)[2:], "out": str(out), "fault": fault,
               "stdout": f"{logs}.out", "stderr": f"{logs}.err", "events": str(events) if events else None}
        proc, answers = self.free.get()
        hung = False
        try:
            proc.stdin.write(json.dumps(req) + "\n")
            proc.stdin.flush()
            pid = answers.get(timeout=60)["pid"]
            try:
                rc = answers.get(timeout=RUN_TIMEOUT_S)["rc"]
            except queue.Empty:  # fail the trial, never stall CI
                hung = True
                os.kill(pid, signal.SIGKILL)
                rc = answers.get(timeout=60)["rc"]
        finally:
            self.free.put((proc, answers))
        assert not hung, f"the run hung for {RUN_TIMEOUT_S} s; its stderr: {logs}.err"
        return Result(rc, Path(req["stdout"]).read_text(), Path(req["stderr"]).read_text())

    def close(self):
        for p in self.procs:
            p.stdin.close()
            p.wait(timeout=30)


def metrics(out: Path) -> tuple[list[tuple], str]:
    """(each complete metrics.jsonl row's deterministic fields, a torn last line or '')."""
    path = out / "metrics.jsonl"
    text = path.read_text() if path.exists() else ""
    lines = text.split("\n")
    return [tuple(json.loads(r).get(k) for k in ROW_KEYS) for r in lines[:-1]], lines[-1]


def checkpoint_tensors(path: Path) -> dict:
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    return _load_state_dict_from_keys(checkpoint_id=str(path))


def differences(a, b, path="") -> list[str]:
    """Where two nested states (tensors, arrays, containers, scalars) are not bit-identical."""
    if isinstance(a, torch.Tensor):
        ok = isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        ok = isinstance(b, np.ndarray) and np.array_equal(a, b)
    elif isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return [d for k in a for d in differences(a[k], b[k], f"{path}/{k}")]
    elif isinstance(a, (list, tuple)) and type(a) is type(b) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}/{i}")]
    else:
        ok = a == b
    return [] if ok else [path or "/"]


@dataclass
class Reference:
    out: Path
    rows: list
    events: list
    checkpoints: list
    final: dict
    curve: list


@pytest.fixture(scope="module")
def runner():
    r = Runner()
    yield r
    r.close()


@pytest.fixture(scope="module")
def reference(runner, markov_data_dir, tmp_path_factory) -> Reference:
    out = tmp_path_factory.mktemp("faults") / "reference"
    events = out.parent / "events.json"
    res = runner.run(markov_data_dir, out, events=events)
    assert res.rc == 0, res.stderr[-3000:]
    print(f"reference run: {len(json.loads(events.read_text()))} file-system events")
    rows, torn = metrics(out)
    assert [r[0] for r in rows] == [*range(1, 13), 12] and torn == ""
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == ["step_00000008", "step_00000012"]
    return Reference(out, rows, json.loads(events.read_text()), ckpts,
                     checkpoint_tensors(out / "checkpoints" / ckpts[-1]),
                     json.loads((out / "per_token_loss.json").read_text())["loss"])


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file of a run dir with its bytes, but the lock file (it names the last process that held the dir)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def check_prefix(out: Path, ref: Reference, after: str) -> None:
    rows, _ = metrics(out)  # a torn last line is what a cut write leaves; the resume drops it
    assert rows == ref.rows[: len(rows)], f"{after}: metrics.jsonl is not a prefix of the reference's rows: {rows}"


def check_identical(out: Path, ref: Reference, same_checkpoints: bool = True) -> None:
    """The resumed run is the reference: rows, final checkpoint, per-token loss; ``same_checkpoints``: the same
    checkpoints kept (a preempted run keeps the one of its stop step instead), and never a leftover."""
    rows, torn = metrics(out)
    assert torn == "" and rows == ref.rows, f"resumed rows differ from the reference: {rows}"
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == ref.checkpoints if same_checkpoints else (
        len(names) == len(ref.checkpoints) and names[-1] == ref.checkpoints[-1]
        and all(n.startswith("step_") and "." not in n for n in names)), f"checkpoints/ holds {names}"
    diff = differences(checkpoint_tensors(out / "checkpoints" / names[-1]), ref.final)
    assert not diff, f"the final checkpoint differs at {diff[:5]}"
    assert json.loads((out / "per_token_loss.json").read_text())["loss"] == ref.curve, "per-token loss differs"


def check_clear_error(res: Result, *needles: str) -> None:
    last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
    assert res.rc == 1 and last.startswith("error: ") and "Traceback" not in res.stderr, res.stderr[-2000:]
    for n in needles:
        assert n in last, (n, last)


def resume_and_check(runner, data_dir, out: Path, ref: Reference, same_checkpoints: bool = True) -> Result:
    res = runner.run(data_dir, out, "resume=true", tag="resume")
    assert res.rc == 0, f"resume failed (rc {res.rc}): {res.stderr[-2000:]}"
    check_identical(out, ref, same_checkpoints)
    return res


def run_trials(trials: dict) -> None:
    """Run ``{name: fn}`` two at a time; fail listing every trial that failed."""
    def attempt(item):
        name, fn = item
        try:
            fn()
            return None
        except AssertionError as e:
            return f"{name}: {e}"

    with ThreadPoolExecutor(2) as pool:
        failures = [f for f in pool.map(attempt, trials.items()) if f]
    assert not failures, f"{len(failures)} of {len(trials)} trials failed:\n" + "\n".join(failures)


def pick_events(events: list, rng: np.random.Generator, n: int, where=lambda kind, path: True) -> list[int]:
    """``n`` event numbers (1-based): a uniform pick over units, where the writes of one file in a row are one
    unit and every other event is its own, then a uniform event within the unit (so the thousands of shard writes
    do not crowd out the few renames, unlinks and metrics rows)."""
    units: list[list[int]] = []
    for i, (kind, path) in enumerate(events):
        if not where(kind, path):
            continue
        if units and kind == "write" and events[units[-1][-1]] == [kind, path] and units[-1][-1] == i - 1:
            units[-1].append(i)
        else:
            units.append([i])
    picks = rng.choice(len(units), size=n, replace=n > len(units))
    return [int(rng.choice(units[u])) + 1 for u in picks]


def test_kill_at_random_points_resumes_bit_identically(runner, reference, markov_data_dir, tmp_path):
    """kill -9 at seeded random file-system events of the reference run; every third trial is killed again at a
    random point of its resumed run; then a resume must reproduce the reference exactly."""
    rng = np.random.default_rng([SEED, 1])
    ats = pick_events(reference.events, rng, KILL_TRIALS)

    def trial(i, at, cut, second):
        out = tmp_path / f"kill{i}"
        res = runner.run(markov_data_dir, out, fault={"kind": "kill", "at": at, "cut": cut}, tag="killed")
        assert res.rc == -9, f"not killed at event {at} (rc {res.rc}): {res.stderr[-1500:]}"
        assert f"at event {at} ({' '.join(reference.events[at - 1])})" in res.stderr, res.stderr[-500:]
        check_prefix(out, reference, f"kill at event {at}")
        if second:
            res = runner.run(markov_data_dir, out, "resume=true", fault={"kind": "kill", "at": second, "cut": cut},
                             tag="killed2")
            assert res.rc in (-9, 0), f"resume before the second kill failed: {res.stderr[-1500:]}"
            check_prefix(out, reference, f"second kill at event {second}")
        resume_and_check(runner, markov_data_dir, out, reference)

    trials = {}
    for i, at in enumerate(ats):
        cut = float(rng.choice([0.0, rng.random()]))
        second = int(rng.integers(1, len(reference.events))) if i % 3 == 0 else 0
        trials[f"kill {i} at event {at} {reference.events[at - 1]} cut {cut:.2f} second {second}"] = (
            lambda i=i, at=at, cut=cut, second=second: trial(i, at, cut, second))
    run_trials(trials)


def damage(path: Path, rng: np.random.Generator) -> str:
    """Damage one file of checkpoint ``path`` as a disk or a copy might; returns what was done."""
    files = sorted(p for p in path.iterdir() if p.is_file())
    f = files[int(rng.integers(len(files)))]
    data = bytearray(f.read_bytes())
    how = str(rng.choice(["truncate", "flip", "zero", "delete"])) if data else "delete"
    if how == "truncate":
        f.write_bytes(data[: int(rng.integers(len(data)))])
    elif how == "flip":
        i = int(rng.integers(len(data)))
        data[i] ^= 1 << int(rng.integers(8))
        f.write_bytes(data)
    elif how == "zero":
        i = int(rng.integers(len(data)))
        data[i : i + 64] = bytes(len(data[i : i + 64]))
        f.write_bytes(data)
    else:
        f.unlink()
    return f"{how} {f.name}"


def test_a_damaged_newest_checkpoint_falls_back_or_fails_clearly(runner, reference, markov_data_dir, tmp_path):
    """A copy of the finished reference run with its newest checkpoint damaged (truncated, a flipped bit, zeroed
    bytes, a file gone) resumes from the one before and ends bit-identical; with both damaged, a clear error
    names both and leaves metrics.jsonl as it was (or, where the damage spared what a load reads, the resume is
    bit-identical)."""
    def trial(i, both):
        rng = np.random.default_rng([SEED, 2, i])
        out = tmp_path / f"damaged{i}"
        shutil.copytree(reference.out, out)
        done = [damage(out / "checkpoints" / name, rng) for name in reference.checkpoints[-2 if both else -1:]]
        before = (out / "metrics.jsonl").read_text()
        res = runner.run(markov_data_dir, out, "resume=true", tag="resume")
        if both and res.rc != 0:
            check_clear_error(res, "no checkpoint under", *reference.checkpoints)
            assert (out / "metrics.jsonl").read_text() == before, "a failed resume changed metrics.jsonl"
            return
        assert res.rc == 0, f"resume after {done} failed (rc {res.rc}): {res.stderr[-2000:]}"
        check_identical(out, reference)

    run_trials({f"damaged {i} ({'both' if i >= 8 else 'newest'})": (lambda i=i: trial(i, i >= 8)) for i in range(10)})


def test_a_full_disk_fails_clearly_and_resumes(runner, reference, markov_data_dir, tmp_path):
    """The disk fills up at a seeded event of a checkpoint write (one of them failing as torch's C++ writer reports
    it, a RuntimeError about inline_container.cc), of a metrics row (cut short) or of the final plot: the run stops
    with one line naming the file and "no space left on device", and leaves no partial checkpoint; once there is
    space again, the resume is bit-identical (the cut row dropped)."""
    rng = np.random.default_rng([SEED, 3])
    in_ckpt = pick_events(reference.events, rng, 5, lambda kind, path: path.startswith("checkpoints")
                          and kind in ("open", "write", "mkdir"))
    in_rows = pick_events(reference.events, rng, 2, lambda kind, path: path == "metrics.jsonl" and kind == "write")
    wrapped = pick_events(reference.events, rng, 1, lambda kind, path: path.endswith(".distcp") and kind == "write")
    plot = [i + 1 for i, (kind, path) in enumerate(reference.events) if kind == "open" and path.endswith(".png")]
    points = ([(at, "could not write checkpoint", False) for at in in_ckpt]
              + [(at, "could not append to", False) for at in in_rows]
              + [(at, "could not write checkpoint", True) for at in wrapped]
              + [(at, f"could not write {{out}}{os.sep}per_token_loss.png", False) for at in plot])

    def trial(i, at, where, torch_writer):
        out = tmp_path / f"full{i}"
        res = runner.run(markov_data_dir, out, fault={"kind": "enospc", "at": at, "cut": 0.5, "wrapped": torch_writer},
                         tag="full")
        check_clear_error(res, where.format(out=out), "no space left on device")
        assert "inline_container" not in res.stderr, res.stderr[-1000:]
        check_prefix(out, reference, f"a full disk at event {at}")
        leftovers = [p.name for p in (out / "checkpoints").iterdir() if "." in p.name] if (
            out / "checkpoints").exists() else []
        assert not leftovers, f"a partial checkpoint was left: {leftovers}"
        resume_and_check(runner, markov_data_dir, out, reference)

    run_trials({f"full {i} at event {at} {reference.events[at - 1]}{' (torch)' if wrapped_ else ''}":
                (lambda i=i, at=at, where=where, wrapped_=wrapped_: trial(i, at, where, wrapped_))
                for i, (at, where, wrapped_) in enumerate(points)})


def test_a_read_only_or_forbidden_run_dir_fails_in_one_line(runner, reference, markov_data_dir, tmp_path):
    """A run dir on a read-only mount (a resume of the finished run, or a new run whose dir cannot be made) or one
    that stops taking writes with EACCES at a checkpoint: one line naming the path and the cause, no traceback,
    nothing of the run changed; writable again, the resume is bit-identical."""
    first_ckpt = next(i + 1 for i, (kind, path) in enumerate(reference.events) if path.startswith("checkpoints"))

    def read_only_resume():
        out = tmp_path / "ro"
        shutil.copytree(reference.out, out)
        before = snapshot(out)
        res = runner.run(markov_data_dir, out, "resume=true", fault={"kind": "erofs", "at": 1}, tag="ro")
        check_clear_error(res, f"{out}{os.sep}.lock", "read-only file system")
        assert snapshot(out) == before, "a read-only resume changed the run dir"

    def read_only_new():
        out = tmp_path / "ro_new"
        res = runner.run(markov_data_dir, out, fault={"kind": "erofs", "at": 1}, tag="ro")
        check_clear_error(res, f"could not write {out}: read-only file system")
        assert not out.exists()

    def forbidden_checkpoint():
        out = tmp_path / "eacces"
        res = runner.run(markov_data_dir, out, fault={"kind": "eacces", "at": first_ckpt}, tag="eacces")
        check_clear_error(res, "could not write checkpoint step_00000004", "permission denied")
        check_prefix(out, reference, "EACCES at the first checkpoint")
        resume_and_check(runner, markov_data_dir, out, reference)

    run_trials({"read-only resume": read_only_resume, "read-only new run": read_only_new,
                "EACCES at a checkpoint": forbidden_checkpoint})


def test_sigterm_during_evaluation_or_training_stops_and_resumes(runner, reference, markov_data_dir, tmp_path):
    """SIGTERM before each forward pass of the final evaluation (2 held-out batches, 1 per-token batch) and
    before 3 seeded training forward passes: the run checkpoints (or has checkpointed), exits with 75, and the
    resume is bit-identical."""
    rng = np.random.default_rng([SEED, 4])
    points = [("eval", n) for n in (1, 2, 3)] + [("train", int(n)) for n in rng.choice(24, 3, replace=False) + 1]

    def trial(i, where, at):
        out = tmp_path / f"term{i}"
        res = runner.run(markov_data_dir, out, fault={"kind": "sigterm", "where": where, "at": at}, tag="term")
        assert res.rc == 75, f"rc {res.rc}: {res.stderr[-1500:]}"
        said = "during the final evaluation" if where == "eval" else "; resume=true continues"
        assert "stopping on signal 15" in res.stdout and said in res.stdout, res.stdout[-1000:]
        check_prefix(out, reference, f"SIGTERM at {where} forward {at}")
        resume_and_check(runner, markov_data_dir, out, reference, same_checkpoints=where == "eval")

    run_trials({f"SIGTERM {where} forward {at}": (lambda i=i, where=where, at=at: trial(i, where, at))
                for i, (where, at) in enumerate(points)})


def test_ctrl_c_checkpoints_and_a_second_one_exits_at_once(runner, reference, markov_data_dir, tmp_path):
    """Ctrl-C (SIGINT) before a seeded training forward pass stops the run as SIGTERM does: a line at once, the
    checkpoint of that step, exit code 75, no traceback, and a bit-identical resume. A second Ctrl-C during that
    checkpoint ends the process there (killed by SIGINT) with one line: no partial checkpoint is left (the
    newest complete one stays) and the resume is bit-identical. Ctrl-C before the first step (as train.log is
    opened) exits with code 130 and one line, and the new run leaves no run dir."""
    rng = np.random.default_rng([SEED, 5])
    first, second = (int(n) for n in rng.choice(24, 2, replace=False) + 1)
    log_opened = next(i + 1 for i, event in enumerate(reference.events) if event == ["open", "train.log"])

    def once():
        out = tmp_path / "int1"
        res = runner.run(markov_data_dir, out, fault={"kind": "sigterm", "where": "train", "at": first,
                                                      "signal": int(signal.SIGINT)}, tag="int")
        assert res.rc == 75 and "Traceback" not in res.stderr, f"rc {res.rc}: {res.stderr[-1500:]}"
        assert "interrupted: the run stops after the current step" in res.stderr, res.stderr[-1000:]
        assert f"stopping on signal {int(signal.SIGINT)} after step" in res.stdout, res.stdout[-1000:]
        check_prefix(out, reference, f"SIGINT at training forward {first}")
        resume_and_check(runner, markov_data_dir, out, reference, same_checkpoints=False)

    def twice():
        out = tmp_path / "int2"
        res = runner.run(markov_data_dir, out, fault={"kind": "sigterm", "where": "train", "at": second,
                                                      "signal": int(signal.SIGINT), "again": "write checkpoints/"},
                         tag="int")
        assert res.rc == -signal.SIGINT and "Traceback" not in res.stderr, f"rc {res.rc}: {res.stderr[-1500:]}"
        assert res.stderr.strip().splitlines()[-1].startswith("interrupted again: exiting now"), res.stderr[-1000:]
        check_prefix(out, reference, f"SIGINT twice from training forward {second}")
        partial = [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_") and "." not in p.name
                   and not (p / ".metadata").exists()] if (out / "checkpoints").exists() else []
        assert not partial, f"a partial checkpoint looks whole: {partial}"
        resume_and_check(runner, markov_data_dir, out, reference)

    def before_training():
        out = tmp_path / "int0"
        res = runner.run(markov_data_dir, out, fault={"kind": "sigint", "at": log_opened}, tag="int")
        assert res.rc == 130 and "Traceback" not in res.stderr, f"rc {res.rc}: {res.stderr[-1500:]}"
        assert res.stderr.strip().splitlines()[-1] == "interrupted before the first step: nothing to checkpoint"
        assert not out.exists(), f"the run left {sorted(p.name for p in out.iterdir())}"

    run_trials({f"SIGINT at training forward {first}": once, f"SIGINT twice from training forward {second}": twice,
                "SIGINT before the first step": before_training})


def test_a_refused_resume_leaves_the_run_as_it_was(runner, reference, markov_data_dir, tmp_path):
    """A resume that changes the computation (the model's width, the sequence length, the seed, the learning rate)
    is refused in one line naming each such key, old → new, and not the keys that may change (a log interval): no
    file of the run changes (config.yaml and .hydra/ included), and the run then resumes with its own config (its
    evaluation repeated, bit-identical)."""
    out = tmp_path / "refused"
    shutil.copytree(reference.out, out)
    before = snapshot(out)
    res = runner.run(markov_data_dir, out, "resume=true", "model.d_model=128", "data.seq_len=64", "seed=1",
                     "optim.lr=1e-3", "train.log_every=2", tag="refused")
    check_clear_error(res, "resume=true would change the run's computation: ", "model.d_model 64 → 128",
                      "data.seq_len 128 → 64", "seed 0 → 1", "optim.lr 0.003 → 0.001", "resume_changes=allow")
    assert "log_every" not in res.stderr and snapshot(out) == before, "a refused resume changed the run dir"
    resume_and_check(runner, markov_data_dir, out, reference)


def test_resume_changes_allow_records_each_change_from_its_step(runner, reference, markov_data_dir, tmp_path):
    """``resume_changes=allow`` applies a change from the step the run resumes at: config_changes.jsonl says so
    (step, key, old → new), train.log too, and config.yaml becomes the config in force. A later resume with the
    first value is refused; one that falls back to before the change (its newest checkpoint gone) drops the row and
    records it again, and trains bit for bit as the run that first made the change."""
    out = tmp_path / "allowed"
    shutil.copytree(reference.out, out)
    shutil.rmtree(out / "checkpoints" / "step_00000012")  # the resume starts from step 8
    res = runner.run(markov_data_dir, out, "resume=true", "optim.lr=1e-3", "resume_changes=allow", tag="allow")
    assert res.rc == 0, res.stderr[-2000:]
    row = {"from_step": 9, "key": "optim.lr", "old": 0.003, "new": 0.001}

    def recorded():
        changes = [json.loads(r) for r in (out / "config_changes.jsonl").read_text().splitlines()]
        return changes, yaml.safe_load((out / "config.yaml").read_text())["optim"]["lr"]

    assert recorded() == ([row], 0.001)
    assert "config change from step 9: optim.lr 0.003 → 0.001" in (out / "train.log").read_text()
    rows, _ = metrics(out)
    lr = ROW_KEYS.index("lr")
    assert rows[:8] == reference.rows[:8] and rows[8][lr] != reference.rows[8][lr] and rows[-1][0] == 12
    final = checkpoint_tensors(out / "checkpoints" / "step_00000012")

    res = runner.run(markov_data_dir, out, "resume=true", tag="back")
    check_clear_error(res, "optim.lr 0.001 → 0.003")
    shutil.rmtree(out / "checkpoints" / "step_00000012")
    res = runner.run(markov_data_dir, out, "resume=true", "optim.lr=1e-3", tag="again")
    assert res.rc == 0, res.stderr[-2000:]
    assert recorded() == ([row], 0.001) and metrics(out)[0] == rows
    assert not differences(checkpoint_tensors(out / "checkpoints" / "step_00000012"), final)


def test_a_second_process_is_refused_while_a_run_holds_its_dir(runner, reference, markov_data_dir, tmp_path):
    """While a process holds the run dir (its lock), a second one, resuming or replacing it, is refused in one
    line naming the holder (host, pid) and changes nothing; once the holder is gone, its lock file (as one a killed
    run leaves) blocks nothing: the resume is bit-identical."""
    from forgetting_transformer.training.rundir import RunLock

    out = tmp_path / "locked"
    shutil.copytree(reference.out, out)
    before = snapshot(out)
    with RunLock(out):
        for args in (("resume=true",), ("overwrite=true",)):
            res = runner.run(markov_data_dir, out, *args, tag="second")
            check_clear_error(res, f"output_dir {out} is in use by {socket.gethostname()} pid {os.getpid()} since ")
        assert snapshot(out) == before, "a refused process changed the run dir"
    resume_and_check(runner, markov_data_dir, out, reference)


def test_a_damaged_heldout_split_stops_the_run_before_its_first_step(runner, markov_data_dir, tmp_path):
    """heldout.zarr is opened and checked, a batch of it read, before step 1: a token id outside the vocabulary or
    a missing chunk file stops the run with one line naming the file, and the new run leaves no run dir."""
    import zarr

    def trial(name, damage):
        data = tmp_path / f"data_{name}"
        shutil.copytree(markov_data_dir, data)
        damage(data / "heldout.zarr")
        out = tmp_path / f"heldout_{name}"
        res = runner.run(data, out, tag="heldout")
        check_clear_error(res, str(data / "heldout.zarr"))
        assert not out.exists(), f"the run left {sorted(p.name for p in out.iterdir())}"

    def bad_token(path):
        arr = zarr.open_array(str(path), mode="r+")
        arr[0, 5] = 99  # vocab is 64

    def lost_chunk(path):
        next(p for p in sorted(path.rglob("*")) if p.is_file() and "zarr.json" not in p.name).unlink()

    run_trials({"token out of range": lambda: trial("token", bad_token),
                "missing chunk": lambda: trial("chunk", lost_chunk)})
