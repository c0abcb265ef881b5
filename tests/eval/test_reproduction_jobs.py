"""The reproduction suite's scheduler: jobs that share a back-to-back key run one after another in one slot, with
their GPU to themselves, and every job records the jobs its GPU ran at once."""

import threading
import time

import pytest

from eval.reproduction_jobs import Chain, chain_jobs, run_jobs, visible_gpus


class FakeJob:
    def __init__(self, name, log, key=None, barrier=None, ok=True):
        self.name, self.log, self.back_to_back, self.barrier, self.will_pass = name, log, key, barrier, ok
        self.alone, self.gpu, self.gpu_jobs, self.status, self.t0, self.ok = False, None, None, "queued", None, False

    def __call__(self):
        self.t0 = time.time()
        self.log.append(("start", self.name, self.gpu, self.gpu_jobs))
        if self.barrier:
            self.barrier.wait()  # breaks unless its partner runs at the same time
        else:
            time.sleep(0.3)  # long enough for the scheduler to start a job beside it, were it allowed to
        self.log.append(("end", self.name))
        self.ok, self.status = self.will_pass, "done" if self.will_pass else "failed (exit 1)"

    def progress(self):
        return self.name


def test_jobs_with_one_key_become_one_chain_at_the_first_ones_place():
    log = []
    a, b, c, d = (FakeJob(n, log, key) for n, key in (("a", "k"), ("b", None), ("c", "k"), ("d", "j")))
    out = chain_jobs([a, b, c, d])
    assert [type(x) for x in out] == [Chain, FakeJob, Chain]
    assert out[0].jobs == [a, c] and out[1] is b and out[2].jobs == [d]
    assert out[0].name == "a then c" and out[0].alone


def test_a_chain_runs_its_jobs_in_order_with_its_gpu_alone_then_the_others_share_it():
    log = []
    both = threading.Barrier(2, timeout=10)
    jobs = [FakeJob("twin", log, "s0"), FakeJob("x", log, barrier=both), FakeJob("acp", log, "s0"),
            FakeJob("y", log, barrier=both)]
    chained = chain_jobs(jobs)
    run_jobs(chained, visible_gpus("0,0"), every=0.5)
    events = [(e[0], e[1]) for e in log]
    assert events[:4] == [("start", "twin"), ("end", "twin"), ("start", "acp"), ("end", "acp")]
    assert {e for e in events[4:]} == {("start", "x"), ("start", "y"), ("end", "x"), ("end", "y")}
    starts = {e[1]: e[2:] for e in log if e[0] == "start"}
    assert starts == {"twin": ("0", 1), "acp": ("0", 1), "x": ("0", 2), "y": ("0", 2)}
    assert chained[0].ok and chained[0].status == "done"


def test_a_chain_goes_on_after_a_failed_job_and_reports_it():
    log = []
    chain = Chain([FakeJob("twin", log, "s0", ok=False), FakeJob("acp", log, "s0")])
    run_jobs([chain], visible_gpus("cpu:1"), every=0.5)
    assert [e[1] for e in log if e[0] == "start"] == ["twin", "acp"]
    assert not chain.ok and chain.status == "twin failed (exit 1)"


def test_visible_gpus_rejects_a_bad_cpu_count():
    assert visible_gpus("cpu:2") == [None, None] and visible_gpus("0,1") == ["0", "1"]
    with pytest.raises(SystemExit, match="--gpus cpu:x: expected cpu:N with N >= 1"):
        visible_gpus("cpu:x")


def test_a_run_whose_gpu_held_another_jobs_memory_counts_as_shared(tmp_path):
    """A job of another command on the same GPU shows in the run's metrics as memory outside its allocator; such a
    run's tokens/s is left out like that of a run its own command doubled up."""
    import json

    from eval.reproduction_results import alone, load_results

    def write(name, elsewhere, gpu_jobs=1):
        d = tmp_path / "runs" / name
        d.mkdir(parents=True)
        (d / "done.json").write_text(json.dumps({"label": "fox_pro", "seed": 0, "lr": 1e-3, "part": "main",
                                                 "device": "GPU", "torch": "t", "triton": "t", "gpu_jobs": gpu_jobs}))
        rows = [{"step": s, "tokens_per_s": 1e5, "gpu_elsewhere_gib": g} for s, g in enumerate(elsewhere)]
        rows.append({"step": len(rows), "heldout_loss": 4.0})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    write("alone", [30.0, 0.9, 1.1, 0.9])  # the first window (compile, another run finishing) is left out
    write("shared", [0.9, 0.9, 33.0, 0.9])
    write("placed", [0.9, 0.9, 0.9], gpu_jobs=3)
    write("cpu", [None, None])
    got = {r.name: (r.gpu_jobs, alone(r)) for r in load_results(tmp_path)}
    assert got == {"alone": (1, True), "shared": (2, False), "placed": (3, False), "cpu": (1, True)}
