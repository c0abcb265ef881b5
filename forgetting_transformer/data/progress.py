"""Progress lines for long data jobs: reading documents, training a tokenizer, tokenizing, writing and checking
arrays.

A plain line is printed once at least ``every`` seconds have passed since the previous one, checked at each
update, so a SLURM log, a pipe and train.log (which copies the console) all show the work advancing::

    tokenizing: 1,024/50,000 docs (2%) | 88.1 docs/s | 1.52M tokens | elapsed 0:00:12 | ETA 0:09:26

Work that makes no updates for a long time (the merge phase of BPE training, inside the tokenizers library)
runs under :func:`heartbeat`, which checks from a background thread. ``every`` defaults to the environment's
``FOX_PROGRESS_SECONDS`` (10 when unset; the variable training's progress lines read too). Lines go to
``sys.stderr`` as it is at each write.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Callable, Iterator

__all__ = ["ProgressLine", "heartbeat", "progress_every", "clock_text", "rate_text", "size_text"]


def progress_every() -> float:
    """Seconds between progress lines: ``FOX_PROGRESS_SECONDS``, 10 when unset."""
    value = os.environ.get("FOX_PROGRESS_SECONDS", "10")
    try:
        every = float(value)
    except ValueError:
        raise ValueError(f"FOX_PROGRESS_SECONDS={value!r}: expected a number of seconds") from None
    if every < 0:
        raise ValueError(f"FOX_PROGRESS_SECONDS={value!r}: must be >= 0")
    return every


def clock_text(seconds: float) -> str:
    """``H:MM:SS``."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def rate_text(rate: float) -> str:
    """A number with three significant digits and a k/M/G suffix."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.3g}{suffix}"
    return f"{rate:.3g}"


def size_text(nbytes: int) -> str:
    """A byte count in kB/MB/GB (powers of 1000), one decimal."""
    for scale, suffix in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {suffix}"
    return f"{nbytes} B"


class ProgressLine:
    """``update(n)`` after each unit of work; ``close()`` (or the ``with`` block's end) prints where it ended when
    progress lines were printed, so a job shorter than ``every`` stays silent.

    ``total``: units expected (None: unknown, no percentage or ETA); ``detail``: a callable whose text is
    appended (e.g. tokens so far); ``eta``: False where the units counted are not what the remaining time
    depends on; ``stream``: default ``sys.stderr`` as it is at each write; ``clock``: seconds,
    monotonic. Updates may come from several threads."""

    def __init__(self, desc: str, unit: str, total: int | None = None, *, every: float | None = None,
                 enabled: bool = True, stream=None, clock: Callable[[], float] = time.monotonic,
                 detail: Callable[[], str] | None = None, eta: bool = True):
        self.desc, self.unit, self.total, self.n, self.eta = desc, unit, total, 0, eta
        self.every = every if every is not None else progress_every() if enabled else 0.0
        self.enabled, self.stream, self.clock, self.detail = enabled, stream, clock, detail
        self.t0 = self.t_line = clock()
        self.lines, self.n_line, self.closed = 0, None, False
        self._lock = threading.RLock()

    def elapsed(self) -> float:
        return max(self.clock() - self.t0, 0.0)

    def text(self) -> str:
        elapsed = self.elapsed()
        rate = self.n / elapsed if elapsed > 0 else 0.0
        count = f"{self.n:,}/{self.total:,} {self.unit}" if self.total is not None else f"{self.n:,} {self.unit}"
        if self.total:
            count += f" ({100 * self.n / self.total:.0f}%)"
        parts = [f"{self.desc}: {count}", f"{rate_text(rate)} {self.unit}/s" if self.n else f"-- {self.unit}/s"]
        if self.detail is not None:
            parts.append(self.detail())
        parts.append(f"elapsed {clock_text(elapsed)}")
        if self.eta and self.total is not None and self.n < self.total:
            parts.append(f"ETA {clock_text((self.total - self.n) / rate)}" if rate > 0 else "ETA --")
        return " | ".join(parts)

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.n += n
        self.poll()

    def poll(self) -> None:
        """Print a line if ``every`` seconds have passed since the last one."""
        with self._lock:  # checked and printed at once, so two threads never print the same interval's line
            if self.enabled and not self.closed and self.clock() - self.t_line >= self.every:
                self.line()

    def line(self) -> None:
        """Print the progress line now."""
        with self._lock:
            self.t_line, self.n_line = self.clock(), self.n
            self.lines += 1
            self._write(self.text())

    def say(self, text: str) -> None:
        """Print a line of the job's own (where it starts, what it found) when enabled, on the same stream."""
        if self.enabled:
            with self._lock:
                self._write(text)

    def _write(self, text: str) -> None:
        out = self.stream if self.stream is not None else sys.stderr
        out.write(text + "\n")
        out.flush()

    def close(self, last: str | None = None) -> None:
        """Print where the work ended if progress lines were printed; with ``last``, print that line instead,
        whether or not progress lines were printed."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if not self.enabled:
                return
            if last is not None:
                self.say(last)
            elif self.lines and self.n_line != self.n:
                self.line()

    def __enter__(self) -> "ProgressLine":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


@contextlib.contextmanager
def heartbeat(bar: ProgressLine, interval: float | None = None) -> Iterator[ProgressLine]:
    """Poll ``bar`` from a background thread every ``interval`` seconds (default ``max(bar.every, 1)``: no more
    than a line a second) while the block runs: lines keep coming while the calling thread is inside a call that
    makes no updates but releases the GIL, as the tokenizers library's BPE training does."""
    if not bar.enabled:
        yield bar
        return
    stop = threading.Event()
    wait = max(bar.every, 1.0) if interval is None else interval

    def beat() -> None:
        while not stop.wait(wait):
            bar.poll()

    thread = threading.Thread(target=beat, name=f"progress: {bar.desc}", daemon=True)
    thread.start()
    try:
        yield bar
    finally:
        stop.set()
        thread.join()
