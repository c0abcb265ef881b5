"""Graceful stop on SIGUSR1 / SIGTERM (SLURM sends one before the time limit or on preemption), on SIGINT (Ctrl-C),
and on SIGUSR2 when submitit (the hydra SLURM launcher) is listening for it.

The handler only sets a flag; the training loop checks it after each optimizer step, agrees on it across ranks,
writes a checkpoint and exits with ``PREEMPTED_EXIT_CODE`` so the job script can requeue itself. The final
evaluation checks it after each batch (``raise_if_stopping``) and stops the same way: its checkpoint is already
written, and the resumed run evaluates again. Under submitit,
SIGUSR2 is submitit's own "about to time out / preempted" signal and its handler requeues the job: that handler
is deferred until the checkpoint is on disk (``hand_over``), so the requeued job resumes from the step where the
signal arrived instead of from the last periodic checkpoint.

Ctrl-C says at once that the run stops after the current step; a second Ctrl-C ends the process there and then
(the checkpoint being written is discarded: it is written atomically, so the previous ones stay whole). Under
torchrun a Ctrl-C reaches each rank twice (from the terminal, and forwarded by torchrun's agent), so there every
SIGINT only asks for the stop.
"""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "try again later"


class Preempted(Exception):
    """A preemption signal stops the run (after its checkpoint is written); ``when`` says where it stopped, ``flag``
    is the ``PreemptionFlag`` that caught the signal (it hands the job over once the run has ended)."""

    def __init__(self, when: str, flag: "PreemptionFlag"):
        super().__init__(when)
        self.when, self.flag = when, flag


class PreemptionFlag:
    def __init__(self, signals=(signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)):
        self.received: int | None = None
        self._abort_on_second_interrupt = "TORCHELASTIC_RUN_ID" not in os.environ  # set by torchrun
        self._flag: torch.Tensor | None = None
        # A Python handler already on SIGUSR2 is submitit's requeue; outside submitit SIGUSR2 keeps its default.
        self._deferred = {}
        usr2 = signal.getsignal(signal.SIGUSR2)
        if callable(usr2) and signal.SIGUSR2 not in signals:
            self._deferred[signal.SIGUSR2] = usr2
            signals = (*signals, signal.SIGUSR2)
        for sig in signals:
            # a process started with SIGINT ignored (a shell script's background job) keeps ignoring it, as Python does
            if not (sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN):
                signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        # os.write, not print: the handler may run in the middle of a print to the same stream
        if signum == signal.SIGINT and self.received == signal.SIGINT and self._abort_on_second_interrupt:
            os.write(2, b"\ninterrupted again: exiting now; resume=true continues from the newest complete "
                        b"checkpoint\n")
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            return
        if signum == signal.SIGINT and self.received is None and os.environ.get("RANK", "0") == "0":
            os.write(2, b"\ninterrupted: the run stops after the current step (checkpointed) or evaluation batch; "
                        b"Ctrl-C again stops it at once\n")
        self.received = signum

    def should_stop(self, device: torch.device) -> bool:
        """True on every rank if any rank got a signal (ranks may receive it at slightly different steps)."""
        if not dist.is_initialized():
            return self.received is not None
        if self._flag is None or self._flag.device != device:
            # one tensor for every check (after each step and each evaluation batch)
            self._flag = torch.zeros((), device=device)
        self._flag.fill_(float(self.received is not None))
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)
        return bool(self._flag.item())

    def raise_if_stopping(self, device: torch.device) -> None:
        """Raise Preempted on every rank if any rank got a signal."""
        if self.should_stop(device):
            raise Preempted("during a loop", self)

    def hand_over(self) -> None:
        """Call, once the checkpoint is written, the handler deferred for the received signal (submitit's: it
        requeues the job and exits, or raises when the job may not be requeued). Returns when there is none."""
        handler = self._deferred.get(self.received)
        if handler is not None:
            handler(self.received, None)
