"""Fault injection for train.py: a pre-imported process that forks one training run per request, with a fault
planted at a chosen file-system event.

Why events: between two file-system mutations nothing on disk changes, so a process killed at any instant leaves
the same run directory as one killed just before some mutation (or within a write, when the kernel had taken
part of it). Numbering the mutations a run makes under its output dir (``open`` / ``os.open`` for writing, each
``write`` to such a file, ``mkdir``, ``rename``/``replace``, ``unlink``/``rmdir``) therefore enumerates every run
directory a kill can leave; the same run makes the same mutations in the same order, so event ``k`` of a reference
run is event ``k`` of the faulted one.

Faults (``fault`` of a request):
- ``{"kind": "kill", "at": k, "cut": f}``: SIGKILL at event ``k``; at a ``write`` the first fraction ``f`` of
  the data is written first (a write the kernel took in part).
- ``{"kind": "enospc", "at": k, "cut": f}``: from event ``k`` on, every ``open`` for writing, ``write`` and
  ``mkdir`` under the output dir fails with ENOSPC (a full disk; event ``k``'s write keeps fraction ``f``). With
  ``"wrapped": true`` event ``k``'s write fails as torch's C++ writer reports a full disk: a RuntimeError
  ``[enforce fail at inline_container.cc:672] . unexpected pos``, the OSError its context.
- ``{"kind": "erofs" | "eacces", "at": k}``: from event ``k`` on, every event under the output dir fails with
  EROFS (a read-only mount) or EACCES (a directory the user may not write).
- ``{"kind": "sigint", "at": k}``: SIGINT (Ctrl-C) at event ``k``.
- ``{"kind": "sigterm", "where": "eval" | "train", "at": n}``: SIGTERM just before the ``n``-th forward pass
  of the evaluation (or of training); ``"signal": 2`` sends SIGINT (Ctrl-C) instead, and ``"again": prefix`` sends
  it once more at the first event after it that ``prefix`` begins (e.g. ``write checkpoints/``, a shard's write).

Protocol: ``python tests/training/faults.py`` reads one JSON request per stdin line (``argv`` for train.py,
``out`` the output dir, ``stdout``/``stderr`` files, ``fault`` or null, ``events`` a file to record the event
list into, or null) and answers two JSON lines per request: ``{"pid": the run's process}`` when it starts,
``{"rc": exit code, or -signal}`` when it ends.
"""

from __future__ import annotations

import builtins
import errno
import importlib.util
import io
import json
import os
import signal
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_REAL = {name: getattr(os, name) for name in ("rename", "replace", "unlink", "remove", "rmdir", "mkdir")}
_REAL_OPEN, _REAL_OS_OPEN = builtins.open, os.open
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
ERRNOS = {"enospc": errno.ENOSPC, "erofs": errno.EROFS, "eacces": errno.EACCES}
TORCH_FULL_DISK = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"


class Plan:
    """Counts file-system events under ``root`` and fires the fault at the planned one."""

    def __init__(self, root: str, fault: dict | None, record: list | None):
        self.root, self.fault, self.record = os.path.abspath(root), fault or {}, record
        self.n, self.failing, self.signalled = 0, None, False

    def under(self, path) -> bool:
        if isinstance(path, int):
            return False
        p = os.path.abspath(os.fsdecode(os.fspath(path)))
        return p == self.root or p.startswith(self.root + os.sep)

    def hit(self, kind: str, path) -> bool:
        """Count one event; True when it is the planned one. Once a failing fault has fired, raises its error for
        the events it fails (a full disk: those that need space)."""
        self.n += 1
        rel = os.path.relpath(os.path.abspath(os.fsdecode(os.fspath(path))), self.root)
        if self.record is not None:
            self.record.append([kind, rel])
        if self.fault.get("again") and self.signalled and f"{kind} {rel}".startswith(self.fault["again"]):
            self.fault = {**self.fault, "again": None}
            os.kill(os.getpid(), self.fault["signal"])
        if self.fault.get("kind") == "sigint" and self.n == self.fault["at"]:
            os.kill(os.getpid(), signal.SIGINT)
        planned = (self.fault.get("kind") == "kill" or self.fault.get("kind") in ERRNOS) and self.n == self.fault["at"]
        if planned:
            os.write(2, f"fault: {self.fault['kind']} at event {self.n} ({kind} {rel})\n".encode())
            self.failing = ERRNOS.get(self.fault["kind"])
        if self.failing and (self.failing != errno.ENOSPC or kind in ("open", "write", "mkdir")) and not (
                planned and kind == "write"):
            raise OSError(self.failing, os.strerror(self.failing), os.fsdecode(os.fspath(path)))
        return planned

    def fire_at_write(self, write, data) -> None:
        """The planned event is this write: take ``cut`` of it, then die or fail."""
        view = data if isinstance(data, str) else memoryview(data).cast("B")
        write(view[: int(len(view) * self.fault.get("cut", 0.0))])
        if self.fault["kind"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            raise OSError(self.failing, os.strerror(self.failing))
        except OSError:
            if not self.fault.get("wrapped"):
                raise
            raise RuntimeError(TORCH_FULL_DISK)  # noqa: B904 - torch's writer keeps the OSError as the context


class Watched:
    """A file opened for writing under the output dir: each ``write`` is an event."""

    def __init__(self, f, path, plan: Plan):
        self._f, self._path, self._plan = f, path, plan

    def write(self, data):
        if self._plan.hit("write", self._path):
            self._f.flush()
            self._plan.fire_at_write(self._f.write, data)
            self._f.flush()
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()
        return False

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


def install(plan: Plan) -> None:
    """Route this process's file-system mutations through ``plan``."""

    def watched_open(file, mode="r", *args, **kwargs):
        if not (any(c in mode for c in "wax+") and plan.under(file)):
            return _REAL_OPEN(file, mode, *args, **kwargs)
        if plan.hit("open", file):
            _die(plan, file)
        return Watched(_REAL_OPEN(file, mode, *args, **kwargs), file, plan)

    def watched_os_open(path, flags, *args, **kwargs):
        if flags & _WRITING and kwargs.get("dir_fd") is None and plan.under(path) and plan.hit("open", path):
            _die(plan, path)
        return _REAL_OS_OPEN(path, flags, *args, **kwargs)

    def wrap(name):
        real = _REAL[name]

        def fn(path, *args, dir_fd=None, **kwargs):
            if dir_fd is not None:
                kwargs["dir_fd"] = dir_fd
            full = path if dir_fd is None else os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"),
                                                            os.fsdecode(path))
            if plan.under(full) and plan.hit(name, full):
                _die(plan, full)
            return real(path, *args, **kwargs)

        return fn

    builtins.open = io.open = watched_open
    os.open = watched_os_open
    for name in _REAL:
        setattr(os, name, wrap(name))


def _die(plan: Plan, path):
    if plan.fault["kind"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise OSError(plan.failing, os.strerror(plan.failing), os.fsdecode(os.fspath(path)))


def plant_sigterm(fault: dict, plan: Plan) -> None:
    """SIGTERM (or ``fault["signal"]``) this process just before the ``at``-th evaluation (or training) forward
    pass: both loops enter ``autocast_context`` once per batch (evaluation through its own module, training through
    training/loop.py's); ``plan`` learns it was sent (for ``again``)."""
    from forgetting_transformer.training import evaluate, loop

    owner = evaluate if fault["where"] == "eval" else loop
    real, count = owner.autocast_context, [0]

    def counted(*args, **kwargs):
        count[0] += 1
        if count[0] == fault["at"]:
            plan.signalled = True
            os.kill(os.getpid(), fault.get("signal", signal.SIGTERM))
        return real(*args, **kwargs)

    owner.autocast_context = counted


def child(req: dict) -> None:
    """Run train.py's main in this (forked) process as the request says; never returns."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(req[name], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(target, fd)
        os.close(target)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    import torch

    import train

    torch.set_num_threads(1)  # two runs share two cores; the reference runs the same way
    fault, record = req.get("fault"), [] if req.get("events") else None
    plan = Plan(req["out"], fault, record)
    if fault and fault["kind"] == "sigterm":
        plant_sigterm(fault, plan)
    install(plan)
    sys.argv = [str(ROOT / "train.py"), *req["argv"]]
    train.one_line_errors()  # as `python train.py` does
    # Hydra finds configs/ beside the script of a __main__ function, as for `python train.py`
    train.main.__wrapped__.__module__ = "__main__"
    code = 0
    try:
        train.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported as the run's traceback, as python train.py would
        traceback.print_exc()
        code = 1
    if record is not None:
        with _REAL_OPEN(req["events"], "w") as f:
            json.dump(record, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve() -> None:
    os.chdir(ROOT)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401  (imported once here, not in every run)

    # every run forks from here with train.py imported (by its path: the repository root is not on sys.path)
    spec = importlib.util.spec_from_file_location("train", ROOT / "train.py")
    sys.modules["train"] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(req)
        sys.stdout.write(json.dumps({"pid": pid}) + "\n")  # lets the test kill a run that hangs
        sys.stdout.flush()
        _, status = os.waitpid(pid, 0)
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        sys.stdout.write(json.dumps({"rc": rc}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
