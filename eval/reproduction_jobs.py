"""The reproduction suite's scheduler: jobs (a run's training and evaluations) in GPU slots, one status line per job
every few seconds. ``scripts/reproduce.py`` builds the jobs; this module only places them.

A job is any callable with ``name``, ``status``, ``t0``, ``alone`` and ``progress()``; the scheduler sets its ``gpu``
(a CUDA_VISIBLE_DEVICES id, or None for the CPU) and ``gpu_jobs`` (the jobs its GPU runs at once, 1 when alone).
"""

from __future__ import annotations

import threading
import time


def visible_gpus(spec: str | None) -> list[str | None]:
    """The slots jobs run in: GPU ids (``0,1``), every visible GPU (None), or ``cpu:N``: N jobs at a time on the
    CPU (slot None: no CUDA_VISIBLE_DEVICES)."""
    if spec and spec.startswith("cpu:"):
        try:
            n = int(spec[4:])
        except ValueError:
            n = 0
        if n < 1:
            raise SystemExit(f"--gpus {spec}: expected cpu:N with N >= 1")
        return [None] * n
    if spec:
        return [g.strip() for g in spec.split(",") if g.strip()]
    import torch

    n = torch.cuda.device_count()
    return [str(i) for i in range(n)] if n else [None]


class Chain:
    """Jobs that run one after another in the same slot with their GPU alone: runs whose speeds are compared train
    back to back on one GPU with nothing beside them (ACP against dense)."""

    alone = True

    def __init__(self, jobs: list):
        self.jobs, self.current = list(jobs), jobs[0]
        self.name = " then ".join(j.name for j in self.jobs)
        self.status, self.t0, self.ok, self.gpu, self.gpu_jobs = "queued", None, False, None, 1

    def __call__(self) -> None:
        self.t0 = time.time()
        for job in self.jobs:
            self.current, job.gpu, job.gpu_jobs = job, self.gpu, self.gpu_jobs
            job()
            print(f"{job.name}: {job.status} in {time.time() - job.t0:.0f} s", flush=True)
        self.ok = all(j.ok for j in self.jobs)
        self.status = "done" if self.ok else "; ".join(f"{j.name} {j.status}" for j in self.jobs if not j.ok)

    def progress(self) -> str:
        return self.current.progress()


def chain_jobs(jobs: list) -> list:
    """``jobs`` with those sharing a ``back_to_back`` key (not None) gathered into one ``Chain`` each, at the first
    one's place, in their order."""
    out, chains = [], {}
    for job in jobs:
        key = getattr(job, "back_to_back", None)
        if key is None:
            out.append(job)
        elif key in chains:
            chains[key].append(job)
        else:
            chains[key] = [job]
            out.append(chains[key])
    return [Chain(j) if isinstance(j, list) else j for j in out]


def slots_for(job, free: list[str | None], gpus: list[str | None]) -> list[str | None]:
    """The slots the job takes now: one free slot, or (``job.alone``) every slot of a GPU whose slots are all
    free; none while it has to wait."""
    if not job.alone:
        return free[:1]
    return next(([g] * gpus.count(g) for g in dict.fromkeys(free) if free.count(g) == gpus.count(g)), [])


def run_jobs(jobs: list, gpus: list[str | None], every: float = 10.0) -> None:
    """Run the jobs in order, each in a free slot (a GPU named twice in ``gpus`` has two slots); a job with
    ``alone`` set waits for every slot of one GPU and takes them all. A status line per job every ``every`` s."""
    free, lock, threads = list(gpus), threading.Lock(), []
    queue = list(jobs)
    last = time.time()
    while queue or any(t.is_alive() for t in threads):
        with lock:
            for t in [t for t in threads if not t.is_alive()]:
                threads.remove(t)
                free += t.slots
                print(f"{t.job.name}: {t.job.status} in {time.time() - t.job.t0:.0f} s", flush=True)
            while queue and (slots := slots_for(queue[0], free, gpus)):
                job = queue.pop(0)
                for slot in slots:
                    free.remove(slot)
                # jobs on its GPU at once: one for a job alone, else its GPU's slots
                job.gpu, job.gpu_jobs = slots[0], 1 if slots[0] is None else gpus.count(slots[0]) // len(slots)
                t = threading.Thread(target=job, daemon=True)
                t.job, t.slots = job, slots
                t.start()
                threads.append(t)
                print(f"{job.name}: started on {'the cpu' if job.gpu is None else f'gpu {job.gpu}'}", flush=True)
        if time.time() - last >= every:
            last = time.time()
            print("\n".join(t.job.progress() for t in threads), flush=True)
        time.sleep(1.0)
