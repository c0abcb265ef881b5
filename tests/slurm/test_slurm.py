"""train.py on a real (one-node, loopback-only) SLURM cluster started for this module.

munged, slurmctld and slurmd run from Debian's slurm-wlm/munge (installed with apt-get when missing; the module
is skipped only when they cannot be installed or started as root), with every state/log/spool/pid file under a
pytest tmp dir, and are torn down afterwards. Checks:
  (a) `python train.py -m hydra/launcher=slurm ...` (hydra-submitit-launcher) runs a 2-job sweep, each job in its
      own output dir with its metrics and checkpoints;
  (b) slurm/train.sbatch: a job signalled like at its time limit (SIGUSR1 to its steps) checkpoints, exits 75,
      requeues itself, resumes from the checkpoint and logs exactly the losses of an uninterrupted run.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VOCAB, DOC_LEN = 64, 256  # of the markov_data_dir fixture (tests/conftest.py)
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "sinfo", "scontrol", "scancel", "squeue")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


def which(name):
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def ensure_slurm_installed():
    """Install slurm-wlm and munge with apt-get when missing; skip the module (with the reason) if that fails."""
    if all(which(b) for b in DAEMONS):
        return
    if os.geteuid() != 0:
        pytest.skip("slurm-wlm/munge are not installed and installing them needs root")
    if not which("apt-get"):
        pytest.skip("slurm-wlm/munge are not installed and there is no apt-get to install them")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    apt_opts = ["-o", "Acquire::http::Timeout=30", "-o", "Acquire::Retries=1", "-o", "DPkg::Lock::Timeout=60"]
    for cmd in (["apt-get", *apt_opts, "update", "-qq"],
                ["apt-get", *apt_opts, "install", "-y", "-qq", "--no-install-recommends", "slurm-wlm", "munge"]):
        try:
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        except (OSError, subprocess.TimeoutExpired) as e:
            pytest.skip(f"cannot install slurm-wlm/munge: {' '.join(cmd)}: {e}")
        if res.returncode != 0:
            reason = f"cannot install slurm-wlm/munge: {' '.join(cmd)} exited {res.returncode}: {res.stderr[-1500:]}"
            print(reason)
            pytest.skip(reason)
    missing = [b for b in DAEMONS if not which(b)]
    if missing:
        pytest.skip(f"apt-get installed slurm-wlm/munge but {missing} are still missing")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_resources():
    """CPUs and RealMemory (MiB) of this machine as slurmd sees them."""
    out = subprocess.run([which("slurmd"), "-C"], capture_output=True, text=True, timeout=30).stdout
    cpus = int(re.search(r"CPUs=(\d+)", out).group(1)) if "CPUs=" in out else os.cpu_count()
    mem = int(re.search(r"RealMemory=(\d+)", out).group(1)) if "RealMemory=" in out else 1024
    return cpus, mem


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.node = socket.gethostname().split(".")[0]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        self.env.update(SLURM_CONF=str(root / "slurm.conf"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                        PATH=os.pathsep.join([str(Path(sys.executable).parent), self.env.get("PATH", ""), *SBIN]))

    def log_tail(self, n=3000):
        parts = []
        for f in sorted(self.root.glob("log/*.log")):
            parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-n:]}")
        return "\n".join(parts)

    def start(self):
        r = self.root
        for d in ("munge", "state", "spool", "log", "run"):
            (r / d).mkdir(mode=0o700, parents=True, exist_ok=True)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = r / "munge" / "munge.socket"
        self.spawn([which("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={socket_path}",
                    f"--pid-file={r / 'run' / 'munged.pid'}", f"--log-file={r / 'log' / 'munged.log'}",
                    f"--seed-file={r / 'munge' / 'munged.seed'}"], "munged")
        wait_for(lambda: socket_path.exists(), 20, "munged socket", self)
        cpus, mem = node_resources()
        conf = f"""
ClusterName=foxtest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path},cred_expire=5
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}
SlurmdPidFile={r / 'run' / 'slurmd.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd.log'}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmdTimeout=60
PropagateResourceLimits=NONE
MailProg=/bin/true
TmpFS={r}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={max(mem - 512, 256)} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""
        (r / "slurm.conf").write_text(conf.lstrip())
        self.spawn([which("slurmctld"), "-D", "-i", "-f", str(r / "slurm.conf")], "slurmctld")
        self.spawn([which("slurmd"), "-D", "-N", self.node, "-f", str(r / "slurm.conf")], "slurmd")

        def idle():
            res = self.run(["sinfo", "-h", "-N", "-o", "%t"], check=False)
            return res.returncode == 0 and res.stdout.strip() == "idle"
        wait_for(idle, 60, "the node to be idle in sinfo", self)

    def spawn(self, cmd, name):
        out = open(self.root / "log" / f"{name}.stdout.log", "w")
        proc = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=self.root)
        self.procs.append(proc)
        return proc

    def run(self, cmd, check=True, timeout=60, **kw):
        res = subprocess.run(cmd, env=kw.pop("env", self.env), capture_output=True, text=True, timeout=timeout, **kw)
        if check and res.returncode != 0:
            raise AssertionError(f"{cmd} exited {res.returncode}:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
        return res

    def job(self, job_id):
        """`scontrol show job` as a dict (only the first record: the job itself)."""
        out = self.run(["scontrol", "show", "job", "-o", str(job_id)]).stdout.splitlines()[0]
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def stop(self):
        # Cancel whatever still runs (its processes are children of slurmstepd, not of this test), give slurmd
        # time to kill them, then stop the daemons we started: SIGTERM, SIGKILL if they linger.
        try:
            ids = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=20).stdout.split()
            if ids:
                self.run(["scancel", "--full", *ids], check=False, timeout=20)
                wait_for(lambda: not self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=20).stdout.strip(),
                         30, None, self)
        except Exception as e:  # noqa: BLE001 - the daemons must be stopped whatever happened
            print(f"cancelling jobs at teardown: {e}")
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def wait_for(cond, timeout, what, cluster=None, interval=0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(interval)
    if what is None:
        return False
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n" + (cluster.log_tail() if cluster else ""))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    t0 = time.time()
    ensure_slurm_installed()
    print(f"slurm-wlm/munge available after {time.time() - t0:.1f} s")
    if os.geteuid() != 0:
        pytest.skip("slurmd has to run as root to start jobs")
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        print(f"cluster up after {time.time() - t0:.1f} s")
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def data_dir(markov_data_dir):
    return markov_data_dir


def tiny(data_dir, total_tokens=12288):
    return ["data=longcrawl64", f"data.data_dir={data_dir}", "data.seq_len=128", f"data.vocab_size={VOCAB}",
            "data.bos_id=0", "model.n_layers=2", "model.d_model=64", "model.head_dim=32", "train.batch_size=8",
            "train.micro_batch_size=4", "train.log_every=1", "train.checkpoint_every=4",
            "schedule.warmup_tokens=2048", f"schedule.total_tokens={total_tokens}", "eval.heldout_batches=2",
            "eval.per_token_loss=false"]


def rows(out):
    return [json.loads(r) for r in (Path(out) / "metrics.jsonl").read_text().splitlines() if r]


def test_sweep_through_the_submitit_slurm_launcher(cluster, data_dir, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                        reason="hydra-submitit-launcher is not installed (pip install -r requirements.txt)")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep}",
           "hydra.launcher.gpus_per_node=null", "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10",
           "optim.lr=1e-3,2e-3", *tiny(data_dir)]
    res = cluster.run(cmd, check=False, timeout=180, cwd=ROOT)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}\n{cluster.log_tail()}"
    ids = set(re.findall(r"^(\d+)_\d+$", "\n".join(p.name for p in (sweep / ".submitit").iterdir()), re.M))
    assert len(ids) == 1, list((sweep / ".submitit").iterdir())  # one job array, one task per combination
    lrs = {}
    for num in (0, 1):
        out = sweep / str(num)
        metrics = rows(out)
        assert [r["step"] for r in metrics if "loss" in r] == list(range(1, 13))
        assert "heldout_loss" in metrics[-1]
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000008", "step_00000012"]
        assert f"output_dir: {out}" in (out / "config.yaml").read_text()
        lrs[num] = metrics[0]["lr"] / metrics[0]["tokens"] * 2048  # linear warmup: peak lr x tokens / warmup
    assert lrs[0] == pytest.approx(1e-3) and lrs[1] == pytest.approx(2e-3)
    array_id = ids.pop()
    for task in (0, 1):  # both ran as SLURM jobs (array tasks) that completed (the result lands just before)
        wait_for(lambda: cluster.job(f"{array_id}_{task}")["JobState"] != "RUNNING", 60, "the jobs to end", cluster)
        assert cluster.job(f"{array_id}_{task}")["JobState"] == "COMPLETED"


def sbatch_script(tmp_path, name="train.sbatch"):
    """slurm/<name> as it is, minus its GPU request (this node has no GPUs) and --exclusive."""
    text = (ROOT / "slurm" / name).read_text()
    assert "scontrol requeue" in text and "resume=true" in text
    text, n = re.subn(r"^#SBATCH --(gpus-per-task|gpus-per-node|gres|gpus|exclusive)\b.*\n", "", text, flags=re.M)
    assert n >= 1
    script = tmp_path / name
    script.write_text(text)
    return script


def test_signalled_job_requeues_and_resumes_with_identical_losses(cluster, data_dir, tmp_path):
    total = 40 * 8 * 128  # 40 steps; no periodic checkpoint: the job resumes from the one written on the signal
    args = [*tiny(data_dir, total), "train.checkpoint_every=1000"]
    reference = tmp_path / "reference"
    ref_proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), f"output_dir={reference}",
                                 *args], cwd=ROOT, env=cluster.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    out, log = tmp_path / "job", tmp_path / "job.log"
    res = cluster.run(["sbatch", "--parsable", f"--chdir={ROOT}", f"--output={log}", "--cpus-per-task=1",
                       "--time=10", str(sbatch_script(tmp_path)), f"output_dir={out}", *args], cwd=ROOT)
    job_id = res.stdout.strip().split(";")[0]

    def logged_steps():
        f = out / "metrics.jsonl"
        lines = f.read_text().split("\n")[:-1] if f.exists() else []  # complete lines only
        return max((json.loads(r)["step"] for r in lines if r), default=0)

    def finished():
        info = cluster.job(job_id)
        return info["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    try:
        wait_for(lambda: logged_steps() >= 3, 120, "the job to log 3 steps", cluster, interval=0.02)
        # What SLURM does before the time limit with --signal=USR1@120: SIGUSR1 to the job's steps (not the shell).
        cluster.run(["scancel", "--signal=USR1", job_id])
        wait_for(finished, 150, "the requeued job to finish", cluster, interval=0.5)
        ref_log = ref_proc.communicate(timeout=120)[0]
    finally:
        if ref_proc.poll() is None:
            ref_proc.kill()
            ref_proc.wait()
    info = cluster.job(job_id)
    text = log.read_text()
    assert ref_proc.returncode == 0, ref_log[-3000:]
    assert info["JobState"] == "COMPLETED", f"{info}\n{text[-3000:]}\n{cluster.log_tail()}"
    assert int(info["Restarts"]) == 1, info  # requeued once, by the script on exit code 75
    m = re.search(r"stopping on signal (\d+) after step (\d+)", text)
    assert m and int(m.group(1)) == int(signal.SIGUSR1), text[-3000:]
    stopped = int(m.group(2))
    assert stopped < 40, "the job was not interrupted"
    assert f"resumed from {out / 'checkpoints' / f'step_{stopped:08d}'} (step {stopped}," in text, text[-3000:]
    got = [(r["step"], r.get("loss"), r.get("grad_norm"), r.get("heldout_loss")) for r in rows(out)]
    want = [(r["step"], r.get("loss"), r.get("grad_norm"), r.get("heldout_loss")) for r in rows(reference)]
    assert got == want  # exactly the uninterrupted run's numbers, no step logged twice or missing


def test_multinode_template_on_one_node_requeues_on_the_batch_signal(cluster, data_dir, tmp_path):
    """slurm/train_multinode.sbatch with --nodes=1 and 2 CPU ranks (FSDP over gloo): torchrun's c10d rendezvous,
    SIGUSR1 to the batch shell (what --signal=B:USR1@300 does) forwarded to the ranks, requeue, resume. The
    losses match a 1-process run to float reduction order (docs/training.md: 2 ranks vs 1 within 1e-4)."""
    total = 24 * 8 * 128  # 24 steps
    args = [*tiny(data_dir, total), "train.checkpoint_every=1000"]
    reference = tmp_path / "reference"
    cluster.run([sys.executable, str(ROOT / "train.py"), f"output_dir={reference}", *args], timeout=120, cwd=ROOT)
    out, log = tmp_path / "job", tmp_path / "job.log"
    env = dict(cluster.env, NPROC_PER_NODE="2", RDZV_PORT=str(free_port()))
    res = cluster.run(["sbatch", "--parsable", f"--chdir={ROOT}", f"--output={log}", "--nodes=1",
                       f"--cpus-per-task={min(2, os.cpu_count())}", "--time=10",
                       str(sbatch_script(tmp_path, "train_multinode.sbatch")), f"output_dir={out}", *args],
                      cwd=ROOT, env=env)
    job_id = res.stdout.strip().split(";")[0]
    metrics = out / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 3, 120, "the job to log 3 steps",
             cluster, interval=0.02)
    cluster.run(["scancel", "--batch", "--signal=USR1", job_id])  # the batch shell only, as B:USR1@300 does
    wait_for(lambda: cluster.job(job_id)["JobState"] not in ("RUNNING", "PENDING", "REQUEUED", "COMPLETING"),
             150, "the requeued job to finish", cluster, interval=0.5)
    info, text = cluster.job(job_id), log.read_text()
    assert info["JobState"] == "COMPLETED", f"{info}\n{text[-4000:]}\n{cluster.log_tail()}"
    assert int(info["Restarts"]) == 1, info
    m = re.search(r"stopping on signal (\d+) after step (\d+)", text)
    assert m and int(m.group(1)) == int(signal.SIGUSR1), text[-3000:]
    stopped = int(m.group(2))
    assert stopped < 24 and f"(step {stopped}," in text.split("requeueing job")[1], text[-3000:]
    assert "fsdp on 2 x cpu" in text
    got, want = rows(out), rows(reference)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want):
        for key in ("loss", "heldout_loss"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), (a["step"], key)


def test_sweep_job_preempted_is_requeued_by_submitit_and_resumes(cluster, data_dir, tmp_path):
    """submitit's own preemption/timeout path: SIGUSR2 (its signal, sent `signal_delay_s` before the time limit)
    makes submitit requeue the job (max_num_timeout > 0); the requeued job reruns the same overrides in the same
    sweep subdir. train.py defers submitit's handler until it has written a checkpoint at the step the signal
    arrived, so the requeued job (resume=true) continues from that step and logs the same losses."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                        reason="hydra-submitit-launcher is not installed (pip install -r requirements.txt)")
    total = 32 * 8 * 128
    args = [*tiny(data_dir, total), "train.checkpoint_every=4"]
    reference = tmp_path / "reference"
    ref = subprocess.Popen([sys.executable, str(ROOT / "train.py"), f"output_dir={reference}", *args], cwd=ROOT,
                           env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=slurm",
                             f"hydra.sweep.dir={sweep}", "hydra.launcher.gpus_per_node=null",
                             "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10",
                             "hydra.launcher.max_num_timeout=2", "resume=true", *args], cwd=ROOT, env=cluster.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = sweep / "0" / "metrics.jsonl"
    try:
        wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 6, 120, "the job to log 6 steps",
                 cluster, interval=0.02)
        job_id = next(p.name for p in (sweep / ".submitit").iterdir() if re.fullmatch(r"\d+(_0)?", p.name))
        cluster.run(["scancel", "--signal=USR2", job_id])
        log = proc.communicate(timeout=150)[0]
        ref_log = ref.communicate(timeout=60)[0]
    finally:
        for p in (proc, ref):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert proc.returncode == 0, log[-3000:] + cluster.log_tail()
    assert ref.returncode == 0, ref_log[-3000:]
    info = cluster.job(job_id)
    assert int(info["Restarts"]) == 1, info
    job_log = "\n".join(p.read_text() for p in (sweep / ".submitit" / job_id).glob("*.out"))
    assert "Caught signal SIGUSR2" in job_log and "Requeued job" in job_log, job_log[-3000:]
    m = re.search(r"stopping on signal (\d+) after step (\d+)", job_log)
    assert m and int(m.group(1)) == signal.SIGUSR2, job_log[-3000:]
    stopped = int(m.group(2))
    ckpt = sweep / "0" / "checkpoints" / f"step_{stopped:08d}"
    assert f"resumed from {ckpt} (step {stopped}," in job_log, job_log[-3000:]
    got = [(r["step"], r.get("loss"), r.get("heldout_loss")) for r in rows(sweep / "0")]
    want = [(r["step"], r.get("loss"), r.get("heldout_loss")) for r in rows(reference)]
    assert got == want
