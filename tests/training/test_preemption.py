"""PreemptionFlag: signals only set a flag (Ctrl-C too, saying so at once); submitit's SIGUSR2 handler runs after
the checkpoint (hand_over). A second Ctrl-C, which ends the process, is a trial of tests/training/test_faults.py."""

import os
import signal

import pytest
import torch

from forgetting_transformer.training.preemption import PreemptionFlag


@pytest.fixture
def restore_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_sigusr1_sets_the_flag_and_hand_over_is_a_no_op(restore_handlers):
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    flag = PreemptionFlag()
    assert not flag.should_stop(torch.device("cpu"))
    os.kill(os.getpid(), signal.SIGUSR1)
    assert flag.received == signal.SIGUSR1 and flag.should_stop(torch.device("cpu"))
    flag.hand_over()  # nothing deferred for SIGUSR1: returns
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL  # not taken over without submitit


def test_submitit_sigusr2_handler_is_deferred_until_hand_over(restore_handlers):
    calls = []
    signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))  # stands in for submitit's requeue
    flag = PreemptionFlag()
    os.kill(os.getpid(), signal.SIGUSR2)
    assert flag.received == signal.SIGUSR2 and calls == []  # the loop still has to write its checkpoint
    flag.hand_over()
    assert calls == [signal.SIGUSR2]


def test_ctrl_c_sets_the_flag_and_says_the_run_stops_after_this_step(restore_handlers, capfd):
    signal.signal(signal.SIGINT, lambda signum, frame: None)  # not pytest's KeyboardInterrupt, were the flag to miss it
    flag = PreemptionFlag()
    os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: the run is to checkpoint first
    assert flag.received == signal.SIGINT and flag.should_stop(torch.device("cpu"))
    assert "interrupted: the run stops after the current step (checkpointed)" in capfd.readouterr().err
