"""Two torchrun "nodes" on this machine: two launcher agents that find each other through torchrun's c10d
rendezvous over TCP (what slurm/train_multinode.sbatch starts on each node), one gloo rank each. The run logs
exactly the losses of the same 2-rank run started by one standalone launcher."""

import os
import socket
import subprocess
import sys
from pathlib import Path

from test_train_e2e import command, data_dir, rows  # noqa: F401  (data_dir is a fixture)

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
EXTRA = ("strategy=fsdp", "train.max_steps=4", "eval.per_token_loss=false")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_by_rendezvous_match_one_node(data_dir, tmp_path):  # noqa: F811
    one = tmp_path / "one_node"
    cmd = command(data_dir, one, *EXTRA)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          *cmd[1:]], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]

    two = tmp_path / "two_nodes"
    cmd = command(data_dir, two, *EXTRA)
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
              "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}", "--rdzv_id=fox-test", *cmd[1:]]
    agents = [subprocess.Popen(launch, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True) for _ in range(2)]
    logs = [a.communicate(timeout=600)[0] for a in agents]
    assert all(a.returncode == 0 for a in agents), "\n".join(log[-3000:] for log in logs)
    assert sum(log.count("output dir:") for log in logs) == 1  # global rank 0 alone prints

    reference, multi = rows(one), rows(two)
    assert [r["step"] for r in multi] == [r["step"] for r in reference] == [1, 2, 3, 4, 4]
    for a, b in zip(reference, multi):
        for key in ("loss", "grad_norm", "heldout_loss"):
            assert a.get(key) == b.get(key), (a["step"], key, a.get(key), b.get(key))
