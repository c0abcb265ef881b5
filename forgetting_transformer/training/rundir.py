"""The run directory: one run per directory, and ``train.log`` holding what the console shows.

A run directory holds one run's files (``config.yaml``, ``metrics.jsonl``, ``checkpoints/``, ``train.log``, the
evaluation outputs) and Hydra's ``.hydra/``. ``claim`` refuses a directory another run has written unless the run
resumes it or ``overwrite=true`` clears it first; ``discard_if_unused`` removes a directory that a failed start
left holding only Hydra's files; ``ConsoleLog`` copies stdout and stderr into ``train.log``.
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

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
    """A text stream that writes to the console stream and to the log file."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.log.write(text)
        self.log.flush()
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
            self._log = open(self.path, "a", encoding="utf-8")
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
            self._log.close()
        return False
