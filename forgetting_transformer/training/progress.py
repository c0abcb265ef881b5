"""Progress of long loops (training between log steps, evaluations, corpus preparation): count, rate and ETA.

Not on a terminal (a SLURM log, a pipe), and under train.py (whose console is copied into train.log), a plain line
is printed once at least ``every`` seconds have passed since the last one (checked at each update), so logs
stay readable and train.log holds what the console shows::

    held-out loss: 12/40 batch (30%) | 3.1 batch/s | elapsed 0:00:04 | ETA 0:00:09

On a terminal the same text is redrawn in place (at most 5 times a second). ``every`` defaults to the
environment's ``FOX_PROGRESS_SECONDS`` (10 when unset); the number formats are the data jobs' progress lines
(``data/progress.py``).

Work whose units take long (the batches of an evaluation: a forward pass, a prefill, a decoding loop) runs
under :func:`heartbeat`, which checks from a background thread, and names the unit in progress with
``working_on``; the lines then say what runs and for how long (one line, wrapped here)::

    LongBench qasper: 8/200 example (4%) | 0.05 example/s | batch 2 of 25 (8 prompts of up to 15,500 tokens) for
    0:01:12: decoding token 17 of at most 128 | elapsed 0:03:05 | ETA 1:14:00
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Callable, Iterable, Iterator, TypeVar

from ..data import progress as data_progress
from ..data.progress import clock_text, progress_every, rate_text

T = TypeVar("T")
_REDRAW_S = 0.2


class Progress:
    """``update(n)`` after each unit of work; ``close()`` (or the ``with`` block's end) prints the final line.

    ``total``: units expected (None: unknown, no percentage or ETA); ``initial``: units done before (a resumed
    run: the rate and ETA count this process's work only); ``detail``: a callable whose text is appended (e.g.
    tokens/s); ``stream``: default ``sys.stderr`` as it is at each write; ``clock``: seconds, monotonic. Updates
    may come from several threads (``heartbeat``'s polls)."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", *, initial: int = 0,
                 every: float | None = None, stream=None, enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic, detail: Callable[[], str] | None = None):
        self.total, self.desc, self.unit, self.n, self.start_n = total, desc, unit, initial, initial
        self.every = progress_every() if every is None else every
        self.stream, self.enabled, self.clock, self.detail = stream, enabled, clock, detail
        self.t0 = self.t_line = self.t_draw = clock()
        self.closed, self.lines, self.n_line = False, 0, None
        self.work_text, self.t_work, self.step_text = None, None, None
        self._lock = threading.RLock()

    def _out(self):
        return self.stream if self.stream is not None else sys.stderr

    def _live(self) -> bool:
        """In-place redraws only on a terminal that is not being copied into a log."""
        out = self._out()
        return bool(getattr(out, "isatty", lambda: False)()) and not getattr(out, "copied_to_log", False)

    def rate(self) -> float:
        """Units per second done by this process so far."""
        elapsed = self.clock() - self.t0
        return (self.n - self.start_n) / elapsed if elapsed > 0 else 0.0

    def text(self) -> str:
        elapsed = max(self.clock() - self.t0, 0.0)
        done, rate = self.n - self.start_n, self.rate()
        count = f"{self.n}/{self.total} {self.unit}" if self.total is not None else f"{self.n} {self.unit}"
        if self.total:
            count += f" ({100 * self.n / self.total:.0f}%)"
        parts = [f"{self.desc}: {count}", f"{rate_text(rate)} {self.unit}/s" if done else f"-- {self.unit}/s"]
        if self.detail is not None:
            parts.append(self.detail())
        if self.work_text is not None:
            work = f"{self.work_text} for {clock_text(max(self.clock() - self.t_work, 0.0))}"
            parts.append(work if self.step_text is None else f"{work}: {self.step_text}")
        parts.append(f"elapsed {clock_text(elapsed)}")
        if self.total is not None and self.n < self.total:
            parts.append(f"ETA {clock_text((self.total - self.n) / rate)}" if rate > 0 else "ETA --")
        return " | ".join(parts)

    def working_on(self, work: str, step: str | None = None) -> None:
        """Name the unit of work in progress (``work``, timed from the first call that names it) and where it is
        (``step``); every line shows them until the next ``update``."""
        with self._lock:
            if work != self.work_text:
                self.work_text, self.t_work = work, self.clock()
            self.step_text = step

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.n += n
            self.work_text = self.step_text = None  # the unit named is done
        self.poll()

    def poll(self) -> None:
        """Redraw (on a terminal) or print a line if its interval has passed; ``update`` and ``heartbeat`` call it."""
        if not self.enabled:
            return
        with self._lock:  # checked and printed at once, so two threads never print the same interval's line
            if self.closed:
                return
            now = self.clock()
            if self._live():
                if now - self.t_draw >= _REDRAW_S:
                    self.t_draw = now
                    self._out().write("\r" + self.text() + "\x1b[K")
                    self._out().flush()
            elif now - self.t_line >= self.every:
                self.line()

    def line(self) -> None:
        """Print the progress line now."""
        with self._lock:
            self.t_line, self.n_line = self.clock(), self.n
            self.lines += 1
            self._out().write(self.text() + "\n")
            self._out().flush()

    def hold(self) -> None:
        """Another line (a metrics row) was just printed: the next progress line waits a whole interval."""
        self.t_line = self.clock()

    def close(self) -> None:
        with self._lock:
            if self.closed or not self.enabled:
                self.closed = True
                return
            self.closed = True
            if self._live():
                self._out().write("\r" + self.text() + "\x1b[K\n")
                self._out().flush()
            elif self.lines and self.n_line != self.n:  # progress lines were printed: say where it ended
                self.line()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


@contextlib.contextmanager
def heartbeat(bar: Progress) -> Iterator[Progress]:
    """Poll ``bar`` from a background thread while the block runs (``data.progress.heartbeat``), so its lines keep
    coming inside one long unit of work: a forward pass, a prefill, a decoding loop (torch releases the GIL in its
    ops). Polled every second, or every ``bar.every`` when that is shorter (but not 0: a line a second then)."""
    with data_progress.heartbeat(bar, interval=min(bar.every, 1.0) or 1.0):
        yield bar


def progress(items: Iterable[T], desc: str, unit: str = "it", *, total: int | None = None,
             **kwargs) -> Iterator[T]:
    """Yield ``items`` and count each one (``total`` defaults to ``len(items)`` where there is one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(total, desc, unit, **kwargs) as bar:
        for item in items:
            yield item
            bar.update()
