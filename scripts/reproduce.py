#!/usr/bin/env python
"""Reproduce the FoX and ACP papers' claims at small scale: train every model of the suite on the Gutenberg books,
evaluate it, and keep the small result files (docs/reproduction.md).

    python scripts/reproduce.py books --corpus CORPUS --out results/books --parts lr      # one part
    python scripts/reproduce.py books --corpus CORPUS --out results/books --parts all     # the whole suite
    python scripts/reproduce.py books --out results/books --report --doc docs/reproduction.md docs/eviction.md
                                                                                       # tables + plots
    python scripts/reproduce.py books --corpus CORPUS --out results/books --parts main --dry-run

CORPUS holds the book shards (``train-00.jsonl.xz`` ..., ``validation.jsonl.xz``); ``--shards`` names the train
shards used (default ``train-00,train-01``). The data step tokenizes them into ``--data-dir`` with the suite's
byte-level BPE (16,384 tokens, trained on the train split the first time and kept as ``OUT/tokenizer.json`` so
that every later part tokenizes identically) in rows of 16,384 tokens.

Parts (each one under 10 minutes on a machine of two H100s, data preparation included: ``lr`` took 7.4 minutes,
``lr-wide`` 7.0; except the PaTH parts, whose models train at about a third of FoX's speed: ``path`` took 18
minutes with both runs on one H200, ``--gpus 0,0``; ``baselines``, whose Mamba-2 runs take 16 minutes each on an
H200; and ``long``; ``lr`` and ``lr-wide`` first, since the others train at the sweep's picks):

    lr         FoX (Pro) and Transformer (Pro), peak lr 1e-3 and 2e-3, seed 0
    lr-wide    the same at 5e-4 and 4e-3: with ``lr``, a 4-point sweep per model
    main       FoX (Pro) and Transformer (Pro) seed 1; FoX (LLaMA) and Transformer (LLaMA), seed 0
    lr-llama   FoX (LLaMA) at 5e-4, 2e-3, 4e-3 and Transformer (LLaMA) at 5e-4, 1e-3, 4e-3, seed 0: with ``main``,
               each LLaMA model's own 4-point sweep (the suite still trains them at the Pro picks)
    ablations  Table 3 from FoX (Pro): - KV-shift, - output gate, - output norm, - QK-norm
    gates      Table 3 (cont.): data-independent and fixed forget gates, FoX (Pro) + RoPE, Transformer w/o RoPE
    acp        FoX (Pro) with ACP (model.acp=true), seeds 0 and 1, checkpoints kept to measure pruning over training
    path       PaTH (Pro) and PaTH-FoX (Pro), seed 0, at the FoX (Pro) pick (not swept for PaTH; docs/path.md)
    released   FoX (Pro), Transformer (Pro) and FoX (Pro) without KV-shift as released (per-head output norm, QK-norm
               eps 1e-5), seeds 0-4; the other parts' Pro runs keep their old definition (``LEGACY_OVERRIDES``)
    released-ablations  the other three Table 3 switches (output gate, output norm, QK-norm) on the released
               FoX (Pro), seeds 0, 1, 2
    llama-seeds  FoX (LLaMA) and Transformer (LLaMA) at their own pick (1e-3, ``lr-llama``), seeds 1 and 2
    baselines  the paper's recurrent baselines Mamba-2, HGRN2 and DeltaNet (fla) at 1e-3, 2e-3 and 4e-3, seed 0, and
               one rate past the grid's end where that end came out best (Mamba-2 8e-3, HGRN2 5e-4)
    baseline-seeds  seeds 1 and 2 of each baseline at its best rate once that rate is inside its grid (DeltaNet 2e-3)
    long       the ``released`` pair and FoX (Pro) without KV-shift at 4x the tokens (warmup 10% of them, as always)
               over all six train shards (tokenized beside --data-dir, the same tokenizer), seeds 0 and 1
    acp-released  the released FoX (Pro) with ACP, seeds 0-2, its pruned tile share measured over 64 held-out
               rows; at seeds 0 and 1 a dense twin trains just before it on the same GPU, nothing beside either
               (whatever --gpus shares), so that their tokens/s compare
    acp-16k    the same at 16,384 tokens of context, seed 0: a dense twin, then ACP, back to back (131,072 tokens per
               step as always: 8 sequences)
    path-released  PaTH (Pro) and PaTH-FoX (Pro) as released (the presets), seeds 0, 1, 2, at the FoX (Pro) pick
    path-lr    the same two at 5e-4 and 2e-3, seed 0: with path-released, a 3-point check of their rate
    released-gates  Table 3's data-independent and fixed gates and FoX (Pro) + RoPE on the released FoX (Pro),
               and the Transformer (LLaMA) without RoPE at the LLaMA pair's own rate (1e-3), seeds 0, 1, 2
    tmax       the data-independent and fixed gates on the released FoX (Pro) at T_max 32, 2048 and 16384 (T_min 2;
               the presets' 256 is released-gates), seeds 0, 1, 2
    train-lengths  the released pair at 1,024 and 2,048 tokens of context (131,072 tokens per step as always), seeds
               0, 1, 2: L(i) past each training length

Every FoX and PaTH model trains at the FoX (Pro) pick of the sweep, every Transformer at the Transformer (Pro) pick.
Runs go one per GPU (``--gpus``, default every visible GPU; a GPU id given twice takes two at once); each trains
with ``train.py experiment=books/<model>_125m``, then evaluates (per-token loss to 16,384 tokens; needle in a
haystack for the main and PaTH models; the retrieval probes, 1k-16k, and the eviction frontier, 4k-32k prompts, for
the released FoX (Pro) and Transformer (Pro); the forget-gate and ACP analysis for the FoX models, not PaTH, whose
attention it does not model), and its small files land in ``OUT/runs/<run>/``. A run whose ``done.json`` exists is
skipped, so re-running a part finishes what an interrupted call left; checkpoints stay in ``--work``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from eval.reproduction import FAMILY as FAMILY_MODEL  # (the pair whose sweep sets each family's lr)
from eval.reproduction import load_results, picks
from eval.reproduction_data import prepare_data
from eval.reproduction_jobs import chain_jobs, run_jobs, visible_gpus
from eval.reproduction_suite import ALONE, PARTS, PRUNING_ROWS, SWEEP, Run, suite

ROOT = Path(__file__).resolve().parents[1]

SIZE = "125m"
VOCAB_SIZE, DOC_LEN = 16384, 16384
DEFAULT_SHARDS = ("train-00", "train-01")
NIAH_LENGTHS, NIAH_DEPTHS = "2k,4k,8k,16k", "0,50,100"
RETRIEVAL_LENGTHS = "1k,2k,4k,8k,16k"  # the retrieval probes' grid: these lengths x eval.retrieval's five depths
FRONTIER_LENGTHS, FRONTIER_WINDOWS = "4096,16384,32768", "3"  # frontier prompts: the training length, 4x, 8x
FRONTIER_ACP_EPS = "1e-6,1e-4,1e-2,0.1,0.5"  # ACP's points on the frontier (docs/eviction.md)
GATES_LEN, ACP_LEN = 1024, 4096  # tokens of a held-out book: F / A maps; ACP statistics (the training length)
ACP_CHECKPOINTS = 8  # the ACP runs keep this many checkpoints, evenly spaced, to measure pruning over training
SMALL_FILES = ("config.yaml", "metrics.jsonl", "per_token_loss.json", "acp_over_training.json")
_HYDRA_LOCK = threading.Lock()


# ----------------------------------------------------------------------------------------------------- learning rates


def sweep_lrs() -> list[float]:
    return sorted(lr for lrs in SWEEP.values() for lr in lrs)


def pick_lr(out: Path, family: str) -> float:
    """The family's learning rate: the sweep point of its model with the lowest held-out loss (the report's rule,
    ``eval.reproduction.picks``); an error names the sweep runs missing."""
    model = FAMILY_MODEL[family]
    names = [Run(model, model, family, "lr", lr=lr).name(lr) for lr in sweep_lrs()]
    missing = [n for n in names if not (out / "runs" / n / "done.json").is_file()]
    if missing:
        raise SystemExit(f"the {family} learning rate comes from the sweep, which lacks {', '.join(missing)}: "
                         f"run --parts lr,lr-wide first")
    return picks(load_results(out))[family]


def planned(runs: list[Run], out: Path, parts: list[str]) -> list[tuple[Run, float]]:
    """(run, lr) for every run of the given parts, the sweep's picks filled in. A run that another part of the call
    already holds (the same name: ``lr-llama`` at a rate that is a pick of ``main``) is planned once, in the first.
    Runs go in the order of ``parts``: the longest parts first keep every GPU busy to the end."""
    picks: dict[str, float] = {}
    todo, names = [], set()
    for run in sorted((r for r in runs if r.part in parts), key=lambda r: parts.index(r.part)):
        if run.lr is None and run.family not in picks:
            picks[run.family] = pick_lr(out, run.family)
        lr = run.lr if run.lr is not None else picks[run.family]
        if run.name(lr) not in names:
            names.add(run.name(lr))
            todo.append((run, lr))
    return todo


# ----------------------------------------------------------------------------------------------------- one run


def compose_run(run_cmd: list[str]):
    """A train.py command's config, composed with Hydra as train.py does."""
    from hydra import compose, initialize_config_dir

    from forgetting_transformer.config import register_configs

    register_configs()
    with _HYDRA_LOCK, initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("config", overrides=run_cmd)  # Hydra's global state: one job thread at a time


def steps_of(run_cmd: list[str]) -> int:
    """Optimizer steps of a train.py command."""
    cfg = compose_run(run_cmd)
    return -(-int(cfg.schedule.total_tokens) // (cfg.train.batch_size * cfg.data.seq_len))


def train_overrides(run: Run, lr: float, data_dir: Path, run_dir: Path, extra: list[str]) -> list[str]:
    """train.py's overrides for a run: its preset, lr, seed and switches, then ``extra`` (--override)."""
    base = [f"experiment=books/{run.model}_{SIZE}", f"data.data_dir={data_dir}", f"output_dir={run_dir}",
            f"optim.lr={lr}", f"seed={run.seed}"]
    cmd = base + run.overrides + list(extra)
    if run.acp_trajectory:
        every = max(1, steps_of(cmd) // ACP_CHECKPOINTS)
        cmd += [f"train.checkpoint_every={every}", f"train.keep_checkpoints={ACP_CHECKPOINTS + 1}"]
    return cmd


def eval_commands(run: Run, run_dir: Path, work: Path, extra: dict | None = None) -> list[list[str]]:
    """The evaluations that follow a run's training, as commands; ``extra`` maps ``niah``, ``retrieval``,
    ``frontier`` and ``pruning`` to arguments appended to theirs, which override the suite's (tests: a toy model on
    the CPU)."""
    extra = {"niah": [], "retrieval": [], "frontier": [], "pruning": [], **(extra or {})}
    py, cmds = sys.executable, []
    if run.niah:
        for mode in ("easy", "standard"):
            cmds.append([py, "-m", "eval.niah.run", str(run_dir), "--out", str(run_dir / "niah"), "--mode", mode,
                         "--haystack", str(work / "haystack.txt"), "--lengths", NIAH_LENGTHS,
                         "--depths", NIAH_DEPTHS, *extra["niah"]])
    if run.retrieval:
        cmds.append([py, "-m", "eval.retrieval.run", "--run", str(run_dir), "--out", str(run_dir / "retrieval"),
                     "--haystack", str(work / "haystack.txt"), "--lengths", RETRIEVAL_LENGTHS, *extra["retrieval"]])
    if run.frontier:
        acp = ["--policies", "acp,streaming,h2o,snapkv", "--acp-eps", FRONTIER_ACP_EPS] if run.family == "fox" else \
            ["--policies", "streaming,h2o,snapkv"]
        cmds.append([py, "-m", "eval.eviction.frontier", "--model", str(run_dir), "--out", str(run_dir / "eviction"),
                     "--text-file", str(work / "haystack.txt"), "--lengths", FRONTIER_LENGTHS, "--windows",
                     FRONTIER_WINDOWS, *acp, *extra["frontier"]])
    if run.model.startswith("fox"):
        book = str(work / "heldout_book.txt")
        cmds.append([py, "-m", "eval.gates.run", "--run", str(run_dir), "--text-file", book, "--what", "acp",
                     "--length", str(ACP_LEN), "--out", str(run_dir / "acp")])
        if run.gates:
            cmds.append([py, "-m", "eval.gates.run", "--run", str(run_dir), "--text-file", book, "--what", "F,A",
                         "--length", str(GATES_LEN), "--out", str(run_dir / "gates")])
        if run.pruning:
            cmds.append([py, "-m", "eval.gates.pruning", "--run", str(run_dir), "--rows", str(PRUNING_ROWS),
                         "--out", str(run_dir / "acp_rows"), *extra["pruning"]])  # at the training length
    if run.acp_trajectory:
        cmds.append([py, str(Path(__file__).resolve()), "_acp-trajectory", str(run_dir),
                     str(work / "heldout_book.txt")])
    return cmds


def acp_trajectory(run_dir: Path, text_file: Path) -> Path:
    """ACP's pruned share of the forward tiles at every kept checkpoint of a run, on the first ACP_LEN tokens of
    ``text_file`` → ``run_dir/acp_over_training.json``."""
    import torch

    from eval.common import load_model_and_tokenizer
    from eval.gates.run import analyze, text_tokens
    from forgetting_transformer.training.checkpoint import checkpoint_dirs

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for ckpt in checkpoint_dirs(run_dir / "checkpoints"):
        step = int(ckpt.name[5:])
        hf, tok, _ = load_model_and_tokenizer(run_dir, step=step, device=device)
        ids = torch.tensor([text_tokens(tok, text_file.read_text(encoding="utf-8"), ACP_LEN)], device=device)
        files = analyze(hf.model.float().eval(), ids, run_dir / "acp_steps" / f"step_{step}", what=["acp"],
                        progress=False)
        rec = json.loads(files["acp"].read_text())
        rows.append({"step": step, "tile_fraction": rec["tile_fraction"], "element_fraction": rec["element_fraction"]})
        print(f"step {step}: ACP prunes {100 * rec['tile_fraction']:.1f}% of the forward tiles", flush=True)
    out = run_dir / "acp_over_training.json"
    out.write_text(json.dumps({"tokens": ACP_LEN, "text": str(text_file), "checkpoints": rows}, indent=1) + "\n")
    return out


def environment(gpu: str | None) -> dict:
    """The device a run used (``gpu``: its index among this process's devices) and the library versions."""
    import torch
    import triton

    gpu = torch.cuda.get_device_name(int(gpu)) if gpu is not None and torch.cuda.is_available() else "cpu"
    return {"device": gpu, "torch": torch.__version__, "triton": triton.__version__,
            "python": sys.version.split()[0]}


def portable(text: str, paths: dict[str, str]) -> str:
    """``text`` with each machine path replaced by its placeholder (``$DATA``, ``$WORK``, ``$REPO``), longest path
    first: result files name no directory of the machine that wrote them."""
    for path, name in sorted(paths.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(path, name)
    return text


def keep_results(run_dir: Path, dest: Path, record: dict, paths: dict[str, str]) -> None:
    """Copy a run's small files to ``dest`` (L(i) rounded to 5 decimals; machine paths as placeholders, ``portable``;
    train.log verbatim) and write ``done.json`` last."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in SMALL_FILES:
        if (run_dir / name).is_file():
            (dest / name).write_text(portable((run_dir / name).read_text(), paths))
    ptl = dest / "per_token_loss.json"
    if ptl.is_file():
        res = json.loads(ptl.read_text())
        res["loss"] = [round(x, 5) for x in res["loss"]]
        ptl.write_text(json.dumps(res))
    for sub, patterns in (("niah", ("*.json", "*.png")), ("gates", ("gates.json", "gates.png")),
                          ("acp", ("acp.json", "acp.png")), ("acp_rows", ("acp_rows.json",)),
                          ("retrieval", ("*.json", "*.png")),
                          ("eviction", ("*.json", "*.png"))):
        for pattern in patterns:
            for f in (run_dir / sub).glob(pattern) if (run_dir / sub).is_dir() else []:
                (dest / sub).mkdir(exist_ok=True)
                if f.suffix == ".json":
                    (dest / sub / f.name).write_text(portable(f.read_text(), paths))
                else:
                    shutil.copyfile(f, dest / sub / f.name)
    record = {**record, "command": portable(record["command"], paths)}
    (dest / "done.json").write_text(json.dumps(record, indent=1) + "\n")


class Job:
    """A run in flight: train.py, then its evaluations, each a subprocess on one GPU, logged to ``run_dir/log``."""

    def __init__(self, run: Run, lr: float, gpu: str | None, args):
        self.run, self.lr, self.gpu, self.args = run, lr, gpu, args
        self.name = run.name(lr)
        self.run_dir = args.work / self.name
        self.log_path = args.work / f"{self.name}.log"  # beside the run dir, which holds train.py's run alone
        self.dest = args.out / "runs" / self.name
        self.status, self.ok, self.t0 = "queued", False, None
        self.gpu_jobs = 1  # jobs its GPU runs at once (``--gpus 0,0``: 2); tokens/s compare only at 1
        self.alone = run.model in ALONE  # takes every slot of its GPU
        self.back_to_back = run.back_to_back  # (eval.reproduction_jobs.chain_jobs)
        self.paths = {str(args.data_dir): "$DATA", str(args.work): "$WORK", str(ROOT): "$REPO"}
        self.data_dir = shard_data(args, run.shards)[0]

    def _call(self, cmd: list[str], log) -> int:
        env = dict(os.environ, PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="1")
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        t0 = time.time()
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        log.write(f"(exit {rc} after {time.time() - t0:.1f} s)\n")
        log.flush()
        return rc

    def __call__(self) -> None:
        self.t0 = time.time()
        if self.run_dir.exists():  # an interrupted earlier attempt: a run dir never mixes two runs
            shutil.rmtree(self.run_dir)
        self.args.work.mkdir(parents=True, exist_ok=True)
        train_cmd = [sys.executable, str(ROOT / "train.py"),
                     *train_overrides(self.run, self.lr, self.data_dir, self.run_dir, self.args.override)]
        with open(self.log_path, "w") as log:
            self.status = "training"
            rc = self._call(train_cmd, log)
            if rc == 0:
                for cmd in eval_commands(self.run, self.run_dir, self.args.work, self.args.eval_args):
                    self.status = f"evaluating ({cmd[2] if cmd[1] == '-m' else 'ACP over training'})"
                    rc = self._call(cmd, log)
                    if rc:
                        break
        record = {"run": self.name, "part": self.run.part, "label": self.run.label, "model": self.run.model,
                  "seed": self.run.seed, "lr": self.lr, "overrides": self.run.overrides,
                  "command": "python train.py " + " ".join(train_cmd[2:]),
                  "wall_s": round(time.time() - self.t0, 1), "gpu_jobs": self.gpu_jobs, **environment(self.gpu)}
        if rc:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            diverged = "FloatingPointError" in tail
            self.status = "diverged" if diverged else f"failed (exit {rc})"
            if diverged:  # a result of the sweep: kept, like a finished run
                self.dest.mkdir(parents=True, exist_ok=True)
                (self.dest / "failed.json").write_text(portable(json.dumps({**record, "log_tail": tail}, indent=1),
                                                                 self.paths) + "\n")
                shutil.copyfile(self.log_path, self.dest / "train.log")
                keep_results(self.run_dir, self.dest, record, self.paths)
            return
        self.dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.log_path, self.dest / "train.log")  # train.py's console and the evaluations'
        keep_results(self.run_dir, self.dest, record, self.paths)  # done.json last
        self.status, self.ok = "done", True

    def progress(self) -> str:
        """The job's state and the last metrics line train.py printed."""
        last = ""
        if self.log_path.is_file():
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.startswith("step ")]
            last = lines[-1][:100] if lines else ""
        elapsed = f"{time.time() - self.t0:.0f} s" if self.t0 else ""
        slot = "cpu" if self.gpu is None else f"gpu {self.gpu}"
        return f"  {self.name} [{slot}] {self.status} {elapsed} {last}"


# ----------------------------------------------------------------------------------------------------- entry


def shard_data(a, shards: tuple[str, ...] | None) -> tuple[Path, str]:
    """(tokenized data, record name in OUT) of a run's train shards: the suite's in --data-dir and data.json;
    another set beside them, in <data-dir>-<n>-shards and data-<n>-shards.json."""
    if shards is None or list(shards) == a.shard_list:
        return a.data_dir, "data.json"
    return a.data_dir.with_name(f"{a.data_dir.name}-{len(shards)}-shards"), f"data-{len(shards)}-shards.json"


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["_acp-trajectory"]:  # internal: the ACP runs' evaluation step (eval_commands)
        acp_trajectory(Path(argv[1]), Path(argv[2]))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite", choices=["books"], help="the suite to run (the Gutenberg books)")
    p.add_argument("--out", type=Path, required=True, help="where the small result files go (e.g. results/books)")
    p.add_argument("--corpus", type=Path, help="directory of the book shards and validation.jsonl.xz")
    p.add_argument("--shards", default=",".join(DEFAULT_SHARDS), help="train shards used (default %(default)s)")
    p.add_argument("--parts", default="", help=f"comma-separated parts of {','.join(PARTS)}, or all")
    p.add_argument("--data-dir", type=Path, default=ROOT / ".cache" / "books", help="tokenized data (zarr)")
    p.add_argument("--work", type=Path, default=ROOT / "outputs" / "reproduce",
                   help="run directories with their checkpoints (default %(default)s)")
    p.add_argument("--gpus", default=None, help="GPU ids to use, e.g. 0,1 (default: every visible GPU; an id given "
                   "twice, 0,0, runs two jobs at once on that GPU, except Mamba-2, which has its GPU alone), or "
                   "cpu:N for N jobs at a time on the CPU")
    p.add_argument("--override", nargs="*", default=[], help="extra train.py overrides for every run (tests: a "
                   "tiny model and a few steps); results written with overrides are not the suite's")
    p.add_argument("--only", default=None, help="only the runs whose name matches one of these comma-separated "
                   "patterns (fnmatch), e.g. 'fox_pro-*,transformer_pro-*-s0'")
    p.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help=argparse.SUPPRESS)  # tests: a tiny corpus
    p.add_argument("--doc-len", type=int, default=DOC_LEN, help=argparse.SUPPRESS)
    # tests: --niah-args='--lengths 256', what a toy model scores fast
    for name in ("niah", "retrieval", "frontier", "pruning"):
        p.add_argument(f"--{name}-args", default="", help=argparse.SUPPRESS)
    p.add_argument("--dry-run", action="store_true", help="print the runs and their commands, train nothing")
    p.add_argument("--report", action="store_true", help="write OUT/report.md and the plots from OUT's result files")
    p.add_argument("--doc", type=Path, nargs="+", default=None, help="with --report: also rewrite the generated "
                   "tables of these documents (docs/reproduction.md docs/eviction.md) and put the plots beside the "
                   "first one's images (docs/images/)")
    a = p.parse_args(argv)
    a.out, a.work, a.data_dir = a.out.resolve(), a.work.resolve(), a.data_dir.resolve()
    a.shard_list = [s.strip() for s in a.shards.split(",")]
    a.eval_args = {k: shlex.split(getattr(a, f"{k}_args")) for k in ("niah", "retrieval", "frontier", "pruning")}
    parts = list(PARTS) if a.parts == "all" else [x.strip() for x in a.parts.split(",") if x.strip()]
    bad = [x for x in parts if x not in PARTS]
    if bad:
        p.error(f"--parts {a.parts}: unknown part(s) {', '.join(bad)}; choose from {', '.join(PARTS)} or all")
    if not parts and not a.report:
        p.error("nothing to do: pass --parts and/or --report")
    if parts:
        if a.corpus is None:
            p.error("--parts needs --corpus (the directory of the book shards)")
        run_parts(a, parts)
    if a.report:
        from eval.reproduction import render_tables, update_doc, write_report

        try:
            print(write_report(a.out, a.doc[0].parent / "images" if a.doc else None))
            for doc in a.doc or []:
                print(update_doc(doc, render_tables(a.out)))
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"error: {e}") from None
    return 0


def pending(a, parts: list[str]) -> list[tuple[Run, float]]:
    """The runs of these parts that have no ``done.json`` yet (done ones are named and skipped)."""
    todo = []
    for run, lr in planned(suite(), a.out, parts):
        if a.only and not any(fnmatch.fnmatch(run.name(lr), x.strip()) for x in a.only.split(",")):
            continue
        if (a.out / "runs" / run.name(lr) / "done.json").is_file():
            print(f"{run.name(lr)}: done, skipped")
        else:
            todo.append((run, lr))
    return todo


def run_parts(a, parts: list[str]) -> None:
    """The sweep's parts first, pooled over the GPUs, then the parts that take its picks, pooled likewise."""
    groups = [[x for x in parts if x in SWEEP], [x for x in parts if x not in SWEEP]]
    if a.dry_run:
        for group in groups:
            try:
                todo = pending(a, group)
            except SystemExit as e:  # the sweep has not run yet: its picks are unknown
                print(f"{', '.join(group)}: {e}")
                continue
            for run, lr in todo:
                cmd = train_overrides(run, lr, shard_data(a, run.shards)[0], a.work / run.name(lr), a.override)
                print(f"{run.name(lr)} [{run.part}]: python train.py {' '.join(cmd)}")
        return
    t0 = time.time()
    record = prepare_data(a.corpus, a.shard_list, a.data_dir, a.out, a.work, vocab_size=a.vocab_size,
                          doc_len=a.doc_len)
    # the data's own vocabulary and bos id, so a run can never read ids of another tokenizer
    a.override = [f"data.vocab_size={record['vocab_size']}", f"data.bos_id={record['bos_id']}", *a.override]
    print(f"data: {record['train']['tokens_kept']:,} train and {record['heldout']['tokens_kept']:,} held-out tokens "
          f"from {', '.join(record['shards'])} in {time.time() - t0:.0f} s", flush=True)
    jobs = []
    for group in groups:
        if group:
            todo = pending(a, group)
            for shards in {run.shards for run, _ in todo} - {None}:  # the long part's shards, tokenized once
                data_dir, name = shard_data(a, shards)
                prepare_data(a.corpus, list(shards), data_dir, a.out, a.work, vocab_size=a.vocab_size,
                             doc_len=a.doc_len, record_name=name)
            jobs += (batch := [Job(run, lr, None, a) for run, lr in todo])
            run_jobs(chain_jobs(batch), visible_gpus(a.gpus))
    failed = [j for j in jobs if not j.ok]
    print(f"{len(jobs) - len(failed)} of {len(jobs)} runs done in {time.time() - t0:.0f} s; results in {a.out}")
    for j in failed:
        print(f"  {j.name}: {j.status}; log: {j.log_path}")
    if any(j.status.startswith("failed") for j in failed):
        raise SystemExit(1)


if __name__ == "__main__":
    sys.exit(main())
