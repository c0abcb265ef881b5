"""Graceful stop on SIGUSR1 / SIGTERM (SLURM sends one before the time limit or on preemption).

The handler only sets a flag; the training loop checks it after each optimizer step, agrees on it across ranks,
writes a checkpoint and exits with ``PREEMPTED_EXIT_CODE`` so the job script can requeue itself.
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "try again later"


class PreemptionFlag:
    def __init__(self, signals=(signal.SIGUSR1, signal.SIGTERM)):
        self.received: int | None = None
        for sig in signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def should_stop(self, device: torch.device) -> bool:
        """True on every rank if any rank got a signal (ranks may receive it at slightly different steps)."""
        if not dist.is_initialized():
            return self.received is not None
        flag = torch.tensor(float(self.received is not None), device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
