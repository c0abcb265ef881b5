"""The run directory: one run per directory, and ``train.log`` holding what the console shows.

A run directory holds one run's files (``config.yaml``, ``metrics.jsonl``, ``checkpoints/``, ``train.log``, the
evaluation outputs) and Hydra's ``.hydra/``. ``claim`` refuses a directory another run has written unless the run
resumes it or ``overwrite=true`` clears it first; ``discard_if_unused`` removes a directory that a failed start
left holding only Hydra's files; ``ConsoleLog`` copies stdout and stderr into ``train.log``; ``write_atomic``
replaces a file whole or not at all.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path


class RunDirError(RuntimeError):
    """A file of the run directory could not be written (a full disk, a read-only mount)."""


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (a process killed meanwhile leaves the old file or the new one,
    never a cut one); an OSError becomes RunDirError naming the file."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise RunDirError(f"could not write {path}: {e}") from e

def run_files(out: Path) -> list[str]:
    """Names in ``out`` that a run wrote (everything but Hydra's own files and an empty train.log)."""
    if not out.is_dir():
        return []
    names = []
    for p in sorted(out.iterdir()):
        if p.name == ".hydra" or (p.name == "train.log" and p.stat().st_size == 0):
            continue
        names.append(p.name)
    return names


def claim(out: Path, found: list[str], *, resume: bool, overwrite: bool, delete: bool) -> None:
    """Make ``out`` this run's directory, given the earlier run's files ``found`` there (``run_files``; every rank
    passes rank 0's list): a fresh run needs none, ``resume`` continues that run, ``overwrite`` deletes them first
    (where ``delete``: rank 0). Otherwise raises FileExistsError naming them, on every rank alike."""
    if not found or resume:
        return
    if not overwrite:
        raise FileExistsError(f"output_dir {out} already holds another run ({', '.join(found[:6])}"
                              f"{', ...' if len(found) > 6 else ''}): pass resume=true to continue it, "
                              "overwrite=true to replace it, or choose another output_dir")
    for name in found if delete else []:
        p = out / name
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def discard_if_unused(out: Path) -> None:
    """Remove ``out`` when it holds nothing but Hydra's files: what a run that failed before writing leaves."""
    if out.is_dir() and not run_files(out):  # run_files ignores exactly Hydra's files
        shutil.rmtree(out)


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
    logging) also goes to ``path``, appended: a resumed run continues its own log. ``enabled=False`` (ranks other
    than 0) does nothing."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path, self.enabled = Path(path), enabled

    def __enter__(self):
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._log = open(self.path, "a", encoding="utf-8")
            except OSError as e:
                raise RunDirError(f"could not open {self.path}: {e}") from e
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
