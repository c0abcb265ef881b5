"""The run directory: one run per directory and one process per run, its record written only once the run owns
it, and ``train.log`` holding what the console shows.

A run directory holds one run's files (``config.yaml``, Hydra's ``.hydra/``, ``metrics.jsonl``, ``checkpoints/``,
``train.log``, the evaluation outputs). ``RunLock`` keeps it to one process at a time; ``claim`` refuses a
directory another run has written unless the run resumes it or ``overwrite=true`` clears it first;
``write_record`` writes the run's config files; ``discard_if_empty`` removes the directory Hydra made for a start
that failed; ``ConsoleLog`` copies stdout and stderr into ``train.log``; ``write_atomic`` replaces a file whole or
not at all. A write that fails names the file and the cause (``not_written``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Callable, TypeVar

from .distributed import broadcast_from_main

T = TypeVar("T")

# What a run writes before its first step: its config and Hydra's, its log, the lock, wandb's id. A directory
# holding nothing else holds no run (at most an attempt that failed before its first step), and the next run there
# replaces them: a run's record starts with its first metrics row or checkpoint.
BEFORE_FIRST_STEP = frozenset({".hydra", ".lock", "config.yaml", "config.yaml.tmp", "train.log", "wandb",
                               "wandb_id.txt"})
LOCK = ".lock"

# The causes of a failed write that the user must fix, in the words the errors print. torch's C++ writer reports a
# full disk as "[enforce fail at inline_container.cc:...] unexpected pos", a RuntimeError whose context holds the
# OSError: the cause is looked for along the chain of exceptions.
WRITE_CAUSES = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only file system", errno.EACCES: "permission denied"}


class RunDirError(RuntimeError):
    """A file of the run directory could not be written (a full disk, a read-only mount), or another process
    holds the directory."""


def write_cause(e: BaseException | None) -> str | None:
    """The cause (``WRITE_CAUSES``) of a failed write ``e`` or of an error ``e`` wraps; None when there is none."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno in WRITE_CAUSES:
            return WRITE_CAUSES[e.errno]
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def not_written(path, e: BaseException, what: str = "write") -> str:
    """``could not write PATH: CAUSE``, the cause in words (``write_cause``) or else e's first line."""
    return f"could not {what} {path}: {write_cause(e) or (str(e).splitlines() or [type(e).__name__])[0]}"


def on_main(fn: Callable[[], T], is_main: bool) -> T:
    """``fn()`` run by rank 0 alone: its value, or the exception it raised, on every rank (no rank waits for a rank
    0 that failed)."""
    value = error = None
    if is_main:
        try:
            value = fn()
        except Exception as e:  # noqa: BLE001 - raised on every rank below
            error = e
    value, error = broadcast_from_main((value, error))
    if error is not None:
        raise error
    return value


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (a process killed meanwhile leaves the old file or the new one,
    never a cut one); an OSError becomes RunDirError naming the file and the cause."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):  # a read-only file system refuses the removal too
            tmp.unlink(missing_ok=True)
        raise RunDirError(not_written(path, e)) from e


def run_files(out: Path) -> list[str]:
    """Names in ``out`` that hold a run's record: everything but what a run writes before its first step."""
    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir() if p.name not in BEFORE_FIRST_STEP)


def claim(out: Path, found: list[str], *, resume: bool, overwrite: bool) -> None:
    """Make ``out`` this run's directory, given the earlier run's record ``found`` there (``run_files``): a fresh
    run needs none, ``resume`` continues that run, ``overwrite`` deletes it first. Otherwise raises
    FileExistsError naming it. Rank 0."""
    if not found or resume:
        return
    if not overwrite:
        raise FileExistsError(f"output_dir {out} already holds another run ({', '.join(found[:6])}"
                              f"{', ...' if len(found) > 6 else ''}): pass resume=true to continue it, "
                              "overwrite=true to replace it, or choose another output_dir")
    for name in found:
        p = out / name
        try:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        except OSError as e:
            raise RunDirError(not_written(p, e, "remove")) from e


def write_record(out: Path, files: dict[str, str], *, replace: bool) -> None:
    """Write the run's config files (``{name under out: text}``: config.yaml, ``.hydra/...``), each in one step:
    all of them for a new run (``replace``), only the missing ones for a resumed run, which keeps its own."""
    for name, text in files.items():
        path = out / name
        if replace or not path.exists():
            try:
                path.parent.mkdir(exist_ok=True)
            except OSError as e:
                raise RunDirError(not_written(path.parent, e)) from e
            write_atomic(path, text)


def discard_if_empty(out: Path) -> None:
    """Remove ``out`` if it is empty: the directory Hydra made for a start that failed before taking it (rmdir
    removes an empty directory only, so one that another process has just taken stays)."""
    with contextlib.suppress(OSError):
        out.rmdir()


class RunLock:
    """``out`` for this process alone while the ``with`` block runs: an exclusive ``flock`` on ``out/.lock``, taken
    by rank 0 (``enabled``; the other ranks learn its outcome). The kernel releases it when the process ends,
    however it ends, so the lock file a killed run leaves blocks nothing. The file names the holder (host, pid,
    start time); a second process is refused with RunDirError naming it."""

    def __init__(self, out: Path, enabled: bool = True):
        self.out, self.enabled, self._fd = Path(out), enabled, None

    def __enter__(self):
        on_main(self._take, self.enabled)
        return self

    def _take(self) -> None:
        path = self.out / LOCK
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunDirError(f"output_dir {self.out} cannot be used: {not_written(path, e)}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirError(f"output_dir {self.out} is in use by {holder} (its lock: {path}): wait until that run "
                              "ends, or choose another output_dir") from None
        self._fd = fd
        with contextlib.suppress(OSError):  # the holder's name is for the message; a full disk may refuse it
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{socket.gethostname()} pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}"
                      .encode(), 0)

    def __exit__(self, *exc):
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None
        return False


class _Tee:
    """A text stream that writes to the console stream and to the log file. A log write that fails (a full
    disk) stops the copying, said once on the console; the console itself goes on."""

    copied_to_log = True  # progress lines are printed whole here, not redrawn in place

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        if self.log is not None and not self.log.closed:
            try:
                self.log.write(text)
                self.log.flush()
            except OSError as e:
                self.log = None
                self.stream.write(f"\nwarning: train.log is no longer written ({e}); the console goes on\n")
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):  # isatty, fileno, encoding, ...: the console stream's
        return getattr(self.stream, name)


class ConsoleLog:
    """Within the ``with`` block, everything written to stdout and stderr (prints, progress bars, warnings, Python
    logging) also goes to ``path``: appended with ``append`` (a resumed run continues its own log), else replaced
    (a new run in a directory where an attempt failed before its first step). ``enabled=False`` (ranks other than
    0) does nothing."""

    def __init__(self, path: Path, enabled: bool = True, append: bool = True):
        self.path, self.enabled, self.append = Path(path), enabled, append

    def __enter__(self):
        if self.enabled:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._log = open(self.path, "a" if self.append else "w", encoding="utf-8")
            except OSError as e:
                raise RunDirError(not_written(self.path, e)) from e
            self._saved = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = _Tee(sys.stdout, self._log), _Tee(sys.stderr, self._log)
            # Hydra's console handler holds the stream it was built with: point it at the tee
            self._handlers = [(h, h.stream) for h in logging.getLogger().handlers
                              if isinstance(h, logging.StreamHandler) and h.stream in self._saved]
            for h, stream in self._handlers:
                h.setStream(sys.stdout if stream is self._saved[0] else sys.stderr)
        return self

    def __exit__(self, *exc):
        if self.enabled:
            for h, stream in self._handlers:
                h.setStream(stream)
            sys.stdout, sys.stderr = self._saved
            try:
                self._log.close()
            except OSError:  # what a full disk kept of the log stays; the error that matters is already raised
                pass
        return False
