"""scripts/reproduce.py at a toy size on the CPU: every part trains, evaluates and writes its result files, a rerun
skips what is done, the sweep picks the learning rates the later parts train at, and the report and the
reproduction tables regenerate from the result files alone."""

import argparse
import fnmatch
import json
import lzma
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import eval.reproduction_suite as rs
from forgetting_transformer.data.prepare import EMBEDDED_CORPUS, iter_documents
from tests.script_modules import load_script

ROOT = Path(__file__).resolve().parents[2]
rp = load_script("reproduce")

TOY = ["model.n_layers=2", "model.d_model=64", "model.head_dim=32", "data.seq_len=128", "train.batch_size=4",
       "train.micro_batch_size=4", "train.log_every=2", "schedule.warmup_tokens=512", "schedule.total_tokens=4096",
       "strategy.compile=false", "eval.heldout_batches=2", "eval.per_token_rows=2", "eval.per_token_len=512",
       "eval.window=11"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Book shards cut from the embedded sample as the corpus lays them: six train shards (the suite reads the first
    two, the long part all six) and a validation file."""
    root = tmp_path_factory.mktemp("corpus")
    books = [t for _, t in iter_documents([EMBEDDED_CORPUS])]
    shards = [("train-00", books[0:3]), ("train-01", books[3:6]), ("validation", books[6:9])]
    for name, part in shards + [(f"train-{i:02d}", books[8 + i:9 + i]) for i in range(2, 6)]:
        with lzma.open(root / f"{name}.jsonl.xz", "wt", encoding="utf-8") as f:
            for i, text in enumerate(part):
                f.write(json.dumps({"id": i, "text": text[:60000]}) + "\n")
    return root


# the evaluations at prompt lengths and counts a toy model on the CPU scores in seconds
TOY_EVALS = ["--niah-args=--lengths 256,512", "--retrieval-args=--lengths 256,512 --trials 4",
             "--frontier-args=--lengths 256 --continuation 128 --new-tokens 8 --fractions 0.02,0.5 --acp-eps 1e-2",
             "--pruning-args=--rows 4 --length 256"]


def reproduce(corpus, tmp, *args):
    cmd = [sys.executable, str(ROOT / "scripts" / "reproduce.py"), "books", "--corpus", str(corpus),
           "--out", str(tmp / "results"), "--work", str(tmp / "work"), "--data-dir", str(tmp / "data"),
           "--vocab-size", "512", "--doc-len", "512", *TOY_EVALS, "--gpus", "cpu:2", *args,
           "--override", *TOY]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3000)  # ~4 min unloaded


# Every part at the toy size, a run or a few of each (the sweep whole: the other parts train at its picks); not the
# fla baselines, whose kernels need a GPU, nor the 16k ACP pair, PaTH's rate check, the T_max sweep and the shorter
# training lengths: runs of the other parts at another context, rate or gate init (listed by dry runs below)
TOY_PARTS = [p for p in rs.PARTS if p not in ("baselines", "baseline-seeds", "acp-16k", "path-lr", "tmax",
                                              "train-lengths")]
TOY_ONLY = ",".join(["fox_pro-*", "transformer_pro-*-s0", "fox_llama-lr0.0005-s0", "fox_llama-*-s1",
                     "fox_pro_no_kv_shift-*", "fox_pro_fixed-*", "fox_pro_acp-*-s0", "path_pro-*", "path_fox_pro-*",
                     "fox_pro_released-*-s0", "transformer_pro_released-*-s0", "fox_pro_released_no_qk_norm-*-s0",
                     "fox_pro_released_4x-*-s0", "fox_pro_released_dense-*-s0", "fox_pro_released_acp-*-s0",
                     "fox_pro_released_rope-*-s0", "path_fox_pro_released-*-s0"])


@pytest.fixture(scope="module")
def suite(corpus, tmp_path_factory):
    """The suite at the toy size: the sweep's parts first (the others refuse to start without them)."""
    tmp = tmp_path_factory.mktemp("suite")
    early = reproduce(corpus, tmp, "--parts", "main")
    assert early.returncode != 0 and "run --parts lr,lr-wide first" in early.stderr, early.stderr[-2000:]
    res = reproduce(corpus, tmp, "--parts", ",".join(TOY_PARTS), "--only", TOY_ONLY)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return tmp, res


def last_heldout(run_dir):
    rows = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines() if r.strip()]
    return [r["heldout_loss"] for r in rows if "heldout_loss" in r][-1]


def runs_of(tmp):
    return {p.name: json.loads((p / "done.json").read_text()) for p in (tmp / "results" / "runs").iterdir()}


def test_every_run_of_every_part_is_done_with_its_files(suite):
    tmp, _ = suite
    runs = runs_of(tmp)
    unique = {run.name(lr) for run, lr in rp.planned(rs.suite(), tmp / "results", TOY_PARTS)
              if any(fnmatch.fnmatch(run.name(lr), x) for x in TOY_ONLY.split(","))}
    assert len(runs) == len(unique) and 23 <= len(unique) <= 24 and len(rs.suite()) == 140
    assert {d["part"] for d in runs.values()} == set(TOY_PARTS)
    for name, done in runs.items():
        d = tmp / "results" / "runs" / name
        for f in ("config.yaml", "metrics.jsonl", "per_token_loss.json", "train.log"):
            assert (d / f).is_file(), (name, f)
        assert done["device"] == "cpu" and done["command"].startswith("python train.py experiment=books/")
        # no directory of the machine in the kept files (train.log aside, the console verbatim)
        data = "$DATA-6-shards" if done["part"] == "long" else "$DATA"  # the long part's shards beside the suite's
        assert f"data.data_dir={data} output_dir=$WORK/" in done["command"], done["command"]
        for f in (d / "config.yaml", d / "per_token_loss.json", d / "done.json"):
            assert str(tmp) not in f.read_text(), f
        assert (d / "acp" / "acp.json").is_file() == done["model"].startswith("fox"), name
        assert (d / "niah").is_dir() == (done["part"] in ("main", "path")), name
        assert (d / "acp_rows" / "acp_rows.json").is_file() == (done["label"] == "fox_pro_released_acp"), name
    fox = tmp / "results" / "runs" / next(n for n in runs if n.startswith("fox_pro-") and runs[n]["part"] == "main")
    niah = sorted(p.name for p in (fox / "niah").glob("*.json"))
    assert niah == [f"{fox.name}_easy.json", f"{fox.name}_standard.json"]
    assert (fox / "gates" / "gates.png").is_file()
    assert not list((tmp / "results").rglob("*.npz")) and not list((tmp / "results").rglob("checkpoints"))


def test_later_parts_train_at_the_sweeps_picks(suite):
    tmp, _ = suite
    runs = runs_of(tmp)
    out = tmp / "results"
    for family, model in rp.FAMILY_MODEL.items():
        sweep = {d["lr"]: last_heldout(out / "runs" / n) for n, d in runs.items()
                 if d["label"] == model and d["part"].startswith("lr")}
        assert sorted(sweep) == rp.sweep_lrs()
        pick = min(sweep, key=sweep.get)
        assert rp.pick_lr(out, family) == pick
        later = [d for d in runs.values() if not d["part"].startswith("lr") and d["part"] != "llama-seeds"
                 and (d["model"].startswith(("fox", "path")) == (family == "fox"))]  # PaTH: FoX (Pro)'s pick
        assert later and all(d["lr"] == pick and f"optim.lr={pick}" in d["command"] for d in later)
    ablation = runs[next(n for n in runs if n.startswith("fox_pro_no_kv_shift"))]
    assert "model.kv_shift=false" in ablation["command"]
    seeded = [d for d in runs.values() if d["part"] == "llama-seeds"]  # the LLaMA pair's own pick, not the family's
    assert seeded and all(d["lr"] == rs.LLAMA_PICK and d["seed"] in rs.LLAMA_SEEDS for d in seeded)


def test_the_released_part_trains_the_released_definition_and_the_others_keep_theirs(suite):
    """Runs of the released part train the presets (per-head output norm, QK-norm eps 1e-5); the Pro runs of the
    other parts keep the definition they were trained with."""
    from omegaconf import OmegaConf

    tmp, _ = suite
    runs = runs_of(tmp)
    parts = ("released", "released-ablations")
    released = {n: d for n, d in runs.items() if d["part"] in parts}
    assert sorted({(d["label"], d["seed"]) for d in released.values()}) == [
        ("fox_pro_released", 0), ("fox_pro_released_no_qk_norm", 0), ("transformer_pro_released", 0)]
    for name, done in runs.items():
        model = OmegaConf.load(tmp / "results" / "runs" / name / "config.yaml").model
        if done["model"] not in rs.LEGACY_PRO:
            continue
        now = done["part"] in (*parts, "long", "acp-released", "released-gates", "path-released")  # (the presets)
        assert model.output_norm_per_head == now, name
        assert model.qk_norm_eps == (1e-5 if now else None), name
    assert all("model.qk_norm=false" in d["command"] for d in released.values()
               if d["label"] == "fox_pro_released_no_qk_norm")
    planned = [run for run in rs.suite() if run.part in parts]  # the pair and - KV-shift at 5 seeds, the rest at 3
    expected = [(label, s) for label in ("fox_pro_released", "transformer_pro_released",
                                         "fox_pro_released_no_kv_shift") for s in (0, 1, 2, 3, 4)]
    expected += [(f"fox_pro_released_no_{x}", s) for x in ("output_gate", "output_norm", "qk_norm") for s in (0, 1, 2)]
    assert sorted({(r.label, r.seed) for r in planned}) == sorted(expected)


def test_the_released_pair_runs_the_retrieval_probes_and_the_eviction_frontier(suite):
    """The released FoX (Pro) and Transformer (Pro) keep the probes' JSON and the frontier's (ACP's points for FoX
    alone, which has a forget gate); the other runs have neither."""
    tmp, _ = suite
    for name, done in runs_of(tmp).items():
        run = tmp / "results" / "runs" / name
        pair = done["label"] in ("fox_pro_released", "transformer_pro_released")
        assert (run / "retrieval").is_dir() == pair and (run / "eviction").is_dir() == pair, name
        if not pair:
            continue
        probe = json.loads(next((run / "retrieval").glob("*_retrieval.json")).read_text())
        assert probe["lengths"] == [256, 512] and probe["trials"] == 4
        assert len(probe["needle_gain"]["cells"]) == 2 * len(probe["depths"])
        frontier = json.loads(next((run / "eviction").glob("*.json")).read_text())
        assert [(f["length"], f["text_window"]) for f in frontier["full"]] == [(256, 0), (256, 1), (256, 2)]
        policies = {p["policy"] for p in frontier["points"]}
        assert policies == ({"acp", "streaming", "h2o", "snapkv"} if done["model"] == "fox_pro" else
                            {"streaming", "h2o", "snapkv"}), name
        assert "$WORK" in frontier["text_file"] and "$WORK" in probe["command"]  # no path of the machine


def test_the_long_part_trains_4x_the_tokens_on_all_six_shards_with_the_suites_tokenizer(suite):
    tmp, _ = suite
    out = tmp / "results"
    done = next(d for d in runs_of(tmp).values() if d["label"] == "fox_pro_released_4x")
    cmd = done["command"]  # the toy's --override comes last and trains it small; the part's own overrides first
    assert "data.data_dir=$DATA-6-shards " in cmd and "model.output_norm_per_head" not in cmd
    assert f"schedule.total_tokens={4 * rs.BOOKS_TOKENS} schedule.warmup_tokens={4 * rs.BOOKS_WARMUP}" in cmd
    short, long = (json.loads((out / f).read_text()) for f in ("data.json", "data-6-shards.json"))
    assert sorted(long["shards"]) == [f"train-{i:02d}.jsonl.xz" for i in range(6)] + ["validation.jsonl.xz"]
    assert long["tokenizer_sha256"] == short["tokenizer_sha256"] and long["heldout"] == short["heldout"]
    assert long["train"]["tokens_kept"] > short["train"]["tokens_kept"]


def test_the_protocol_tokens_the_long_part_multiplies_are_the_presets():
    from hydra import compose, initialize_config_dir

    from forgetting_transformer.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=books/fox_pro_125m", "data.data_dir=x"])
    assert (cfg.schedule.total_tokens, cfg.schedule.warmup_tokens) == (rs.BOOKS_TOKENS, rs.BOOKS_WARMUP)


def test_acp_runs_measure_pruning_over_training(suite):
    tmp, _ = suite
    acp = [p for p in (tmp / "results" / "runs").iterdir() if p.name.startswith("fox_pro_acp")]
    assert [p.name.endswith("-s0") for p in acp] == [True]  # the toy suite trains seed 0, which keeps checkpoints
    traj = json.loads(acp[0].joinpath("acp_over_training.json").read_text())
    steps = [c["step"] for c in traj["checkpoints"]]
    assert steps == list(range(1, 9))  # 8 steps, a checkpoint each (ACP_CHECKPOINTS evenly spaced)
    assert all(0 <= c["tile_fraction"] <= 1 for c in traj["checkpoints"])
    assert "model.acp=true" in json.loads((acp[0] / "done.json").read_text())["command"]


def test_acp_released_trains_after_its_dense_twin_and_measures_pruning_over_rows(suite):
    """The dense twin and the ACP run of seed 0 go as one job (twin first, nothing beside them on the two CPU
    slots); the ACP run's pruned share covers the requested held-out rows."""
    tmp, res = suite
    twin = next(n for n in runs_of(tmp) if n.startswith("fox_pro_released_dense-"))
    acp = twin.replace("_dense-", "_acp-")
    lines = res.stdout.splitlines()
    start = lines.index(f"{twin} then {acp}: started on the cpu")
    done = [i for i, ln in enumerate(lines) if ln.startswith((f"{twin}: done", f"{acp}: done"))]
    assert len(done) == 2 and start < done[0] < done[1] and lines[done[0]].startswith(twin)
    between = lines[start + 1:done[1]]
    assert not [ln for ln in between if ": started on" in ln], between  # nothing started beside the pair
    rows = json.loads((tmp / "results" / "runs" / acp / "acp_rows" / "acp_rows.json").read_text())
    assert len(rows["rows"]) == len(rows["tile_fraction"]) == 4 and rows["tokens"] == 256
    assert rows["mean"] == pytest.approx(np.mean(rows["tile_fraction"]))
    assert "model.acp=true" in json.loads((tmp / "results" / "runs" / acp / "done.json").read_text())["command"]


def test_a_rerun_skips_every_finished_run(corpus, suite):
    tmp, _ = suite
    before = {p: p.stat().st_mtime_ns for p in (tmp / "results" / "runs").rglob("done.json")}
    again = reproduce(corpus, tmp, "--parts", ",".join(TOY_PARTS), "--only", TOY_ONLY)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("done, skipped") == len(runs_of(tmp)) and "started" not in again.stdout
    assert {p: p.stat().st_mtime_ns for p in (tmp / "results" / "runs").rglob("done.json")} == before


def test_report_and_tables_regenerate_from_the_files_alone(suite):
    tmp, _ = suite
    from eval.reproduction import render_tables, write_report

    tables = render_tables(tmp / "results")
    assert {"sweep", "claim1", "claim2", "claim3", "claim4", "claim5", "claim6", "baselines", "path", "released",
            "llama_sweep", "runs", "verdicts", "verdict_claim1", "verdict_claim2"} <= set(tables)
    ran = ("sweep", "claim1", "claim2", "claim4", "claim5", "claim6", "path", "released", "verdicts",
           "verdict_claim3", "verdict_claim4", "verdict_claim5", "verdict_path", "verdict_released")
    assert not [k for k in ran if "Not run yet" in tables[k]]
    assert tables["baselines"] == "Not run yet: `--parts baselines`."  # the toy suite leaves them out
    assert tables["verdict_claim2"] == "No run has L(i) to 16,384 tokens yet."  # toy L(i) ends at 512 tokens
    assert tables["claim3"].count("\n|") >= 4  # the rule and the toy suite's three Table 3 rows
    report = write_report(tmp / "results", tmp / "images")
    assert "## claim4" in report.read_text()
    assert "| FoX (Pro) − QK-norm − FoX (Pro) |" in tables["released"]  # the pairs the toy suite ran
    assert "| FoX (Pro) + RoPE − FoX (Pro) |" in tables["released"] and "KV-shift − FoX" not in tables["released"]
    assert (tmp / "images" / "books_per_token_loss.png").stat().st_size > 10_000
    assert (tmp / "images" / "books_per_token_loss_path.png").stat().st_size > 10_000
    earlier, released = tables["path"].split("\n\nThe released definition (`--parts path-released,path-lr`):\n\n")
    rows = earlier.splitlines()[2:]
    labels = ["Transformer (Pro)", "FoX (Pro)", "PaTH (Pro)", "PaTH-FoX (Pro)"]
    assert len(rows) == 4 and all(row.startswith(f"| {label} (") for row, label in zip(rows, labels)), rows
    assert "| PaTH-FoX (Pro) − FoX (Pro) |" in released  # the toy suite's released PaTH-FoX, seed 0
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tables.py"), "--table", "books", "--inputs",
                          str(tmp / "results")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "### claim1" in res.stdout and "FoX (Pro)" in res.stdout, res.stderr


def test_dry_run_lists_the_commands_and_trains_nothing(corpus, tmp_path):
    res = reproduce(corpus, tmp_path, "--parts", "lr", "--dry-run")
    assert res.returncode == 0
    assert res.stdout.count("python train.py experiment=books/") == 4 and not (tmp_path / "work").exists()


def dry_run(corpus, tmp_path, parts, ignore=None):
    """``--dry-run`` of ``parts`` over a copy of the committed results, whose sweep gives the picks (``ignore``:
    the committed runs to leave out, which would be skipped); it reads them and trains nothing."""
    out = tmp_path / "results"
    shutil.copytree(ROOT / "results" / "books", out, ignore=ignore)
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "reproduce.py"), "books", "--corpus", str(corpus),
                          "--out", str(out), "--work", str(tmp_path / "work"), "--parts", parts, "--dry-run"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not (tmp_path / "work").exists()
    return [ln for ln in res.stdout.splitlines() if "python train.py" in ln], out


def test_the_path_part_lists_path_and_path_fox_at_the_fox_pick(corpus, tmp_path):
    lines, out = dry_run(corpus, tmp_path, "path", ignore=lambda d, names: [n for n in names if n.startswith("path")])
    from eval.reproduction import load_results, picks

    lr = picks(load_results(out))["fox"]
    assert [ln.split(" [")[0] for ln in lines] == [f"path_pro-lr{lr:g}-s0", f"path_fox_pro-lr{lr:g}-s0"]
    assert all("[path]" in ln and f"optim.lr={lr}" in ln for ln in lines)
    assert "experiment=books/path_fox_pro_125m" in lines[1]


def test_the_path_lr_part_lists_both_released_path_models_either_side_of_the_fox_pick(corpus, tmp_path):
    lines, _ = dry_run(corpus, tmp_path, "path-lr")
    assert [ln.split(" ")[0] for ln in lines] == [f"{m}_released-lr{lr}-s0" for m in ("path_pro", "path_fox_pro")
                                                  for lr in ("0.0005", "0.002")]
    assert all("[path-lr]" in ln and "model.output_norm_per_head" not in ln for ln in lines)  # the presets


def test_the_acp_16k_part_lists_a_dense_twin_then_acp_at_16k_context(corpus, tmp_path):
    lines, _ = dry_run(corpus, tmp_path, "acp-16k")
    assert [ln.split(" ")[0] for ln in lines] == ["fox_pro_released_dense_16k-lr0.001-s0",
                                                  "fox_pro_released_acp_16k-lr0.001-s0"]
    context = " data.seq_len=16384 train.batch_size=8 train.micro_batch_size=4"
    assert lines[0].endswith(context) and lines[1].endswith(context + " model.acp=true")
    pair = [r for r in rs.suite() if r.part == "acp-16k"]
    assert {r.back_to_back for r in pair} == {"acp-16k-s0"} and [r.pruning for r in pair] == [False, True]
    cmds = rp.eval_commands(pair[1], tmp_path / "run", tmp_path)
    pruning = next(c for c in cmds if "eval.gates.pruning" in c)
    assert "--length" not in pruning  # the pruned share at the run's own (16k) training length


def test_the_tmax_part_sweeps_both_gates_t_max_seed_by_seed_and_hydra_takes_the_override(corpus, tmp_path):
    lines, _ = dry_run(corpus, tmp_path, "tmax")
    names = [ln.split(" ")[0] for ln in lines]
    assert names[:6] == [f"fox_pro_released_{kind}_tmax{t}-lr0.001-s0" for t in (32, 2048, 16384)
                         for kind in ("data_independent", "fixed")]
    assert len(names) == 18 and names[-1] == "fox_pro_released_fixed_tmax16384-lr0.001-s2"  # a pass per seed
    assert "experiment=books/fox_pro_fixed_125m " in lines[1] and lines[1].endswith(" model.fgate_init=[2,32]")
    run = next(r for r in rs.suite() if r.name(1e-3) == "fox_pro_released_fixed_tmax2048-lr0.001-s1")
    cfg = rp.compose_run(rp.train_overrides(run, 1e-3, tmp_path, tmp_path / "run", []))
    assert list(cfg.model.fgate_init) == [2, 2048] and cfg.model.fgate == "fixed" and cfg.seed == 1


def test_the_train_lengths_part_keeps_the_tokens_per_step_and_the_steps(tmp_path):
    runs = [r for r in rs.suite() if r.part == "train-lengths"]
    assert [r.name(1e-3) for r in runs[:4]] == [f"{m}_ctx{n}-lr0.001-s0" for n in (1024, 2048)
                                                for m in ("fox_pro_released", "transformer_pro_released")]
    assert len(runs) == 12 and {r.seed for r in runs} == {0, 1, 2}
    for run in runs[:4]:
        cfg = rp.compose_run(rp.train_overrides(run, 1e-3, tmp_path, tmp_path / "run", []))
        assert cfg.train.batch_size * cfg.data.seq_len == 131_072 and cfg.train.micro_batch_size * 2 == \
            cfg.train.batch_size
        assert cfg.eval.per_token_len == 16384  # L(i) to 16k whatever the training length
    assert rp.steps_of(rp.train_overrides(runs[0], 1e-3, tmp_path, tmp_path / "run", [])) == 400


def test_a_gpu_id_given_twice_runs_two_jobs_on_that_gpu_at_once():
    import threading
    import time

    both = threading.Barrier(2, timeout=10)  # breaks (and the jobs fail) unless both jobs run at the same time

    class FakeJob:
        def __init__(self, name):
            self.name, self.alone, self.gpu, self.status, self.t0 = name, False, None, "queued", None

        def __call__(self):
            self.t0 = time.time()
            both.wait()
            self.status = "done"

        def progress(self):
            return self.name

    jobs = [FakeJob("a"), FakeJob("b")]
    assert rp.visible_gpus("0,0") == ["0", "0"]
    rp.run_jobs(jobs, rp.visible_gpus("0,0"), every=0.5)
    assert [(j.status, j.gpu, j.gpu_jobs) for j in jobs] == [("done", "0", 2), ("done", "0", 2)]


def test_a_job_that_needs_its_gpu_alone_takes_every_slot_of_it():
    """On --gpus 0,0 a Mamba-2 job runs by itself (no job starts beside it) and records one job on its GPU; the
    two jobs after it then share the GPU."""
    import threading
    import time

    running, seen, both = set(), [], threading.Barrier(2, timeout=10)

    class FakeJob:
        def __init__(self, name, alone):
            self.name, self.alone, self.gpu, self.status, self.t0 = name, alone, None, "queued", None

        def __call__(self):
            self.t0 = time.time()
            running.add(self.name)
            seen.append(set(running))
            if self.alone:
                time.sleep(1.5)  # long enough for the scheduler to start a job beside it, were it allowed to
            else:
                both.wait()
            running.discard(self.name)
            self.status = "done"

        def progress(self):
            return self.name

    jobs = [FakeJob("mamba2", True), FakeJob("a", False), FakeJob("b", False)]
    rp.run_jobs(jobs, rp.visible_gpus("0,0"), every=0.5)
    assert [(j.status, j.gpu, j.gpu_jobs) for j in jobs] == [("done", "0", 1), ("done", "0", 2), ("done", "0", 2)]
    assert seen[0] == {"mamba2"} and all("mamba2" not in s for s in seen[1:])
    run = next(r for r in rs.suite() if r.model == "mamba2")
    assert rp.Job(run, 4e-3, None, argparse.Namespace(work=Path("w"), out=Path("o"), data_dir=Path("d"),
                                                      shard_list=list(rp.DEFAULT_SHARDS))).alone


def test_speeds_compare_only_runs_that_had_their_gpu_alone():
    from eval.reproduction_results import load_results
    from eval.reproduction_verdicts import speed

    runs = load_results(ROOT / "results" / "books")
    pro = [r for r in runs if r.label == "fox_pro_released" and r.gpu_jobs == 1]
    assert len(pro) == 3 and any(r.label == "fox_pro_released" and r.gpu_jobs == 3 for r in runs)
    assert "FoX (Pro) 373k against Transformer (Pro) 402k" in speed(runs)
    for r in pro[1:]:
        r.gpu_jobs = 3
    one = speed(runs)
    assert "means over 1 and 3 runs" in one and f"FoX (Pro) {pro[0].tokens_per_s / 1e3:.0f}k" in one
    pro[0].gpu_jobs = 2
    assert "FoX (Pro)" not in speed(runs) and "FoX (LLaMA)" in speed(runs)


def test_baselines_pair_with_fox_at_equal_seeds_and_each_grid_has_its_own_ends():
    """DeltaNet with three seeds gets an interval and a verdict, the one-seed baselines stay inconclusive; HGRN2's
    best rate (1e-3) is the low end of its own grid though not of the union of the grids."""
    from eval.reproduction_results import RunResult
    from eval.reproduction_verdicts import baselines, baselines_sentence, summary

    def r(label, lr, seed, part, loss):
        return RunResult(f"{label}-lr{lr:g}-s{seed}", label, seed, lr, part, "GPU", "v", loss, None)

    runs = [r(m, lr, 0, "lr", loss) for m, lr, loss in (("fox_pro", 1e-3, 4.0), ("fox_pro", 2e-3, 4.1),
                                                        ("transformer_pro", 1e-3, 4.3), ("transformer_pro", 2e-3, 4.2))]
    runs += [r("fox_pro_released", 1e-3, s, "released", loss) for s, loss in enumerate((4.10, 4.12, 4.11))]
    runs += [r("deltanet", lr, 0, "baselines", loss) for lr, loss in ((1e-3, 4.5), (2e-3, 4.3), (4e-3, 4.6))]
    runs += [r("deltanet", 2e-3, s, "baseline-seeds", loss) for s, loss in ((1, 4.33), (2, 4.31))]
    runs += [r("hgrn2", lr, 0, "baselines", loss) for lr, loss in ((1e-3, 4.0), (2e-3, 4.1), (4e-3, 4.2))]
    runs += [r("mamba2", lr, 0, "baselines", loss) for lr, loss in ((5e-4, 4.3), (1e-3, 4.2), (2e-3, 4.25))]
    said = baselines_sentence(runs)
    diffs = [0.20, 0.21, 0.20]
    half = 4.302653 * np.std(diffs, ddof=1) / 3 ** 0.5
    assert f"DeltaNet +0.203 [{np.mean(diffs) - half:+.3f}, {np.mean(diffs) + half:+.3f}], reproduced (3 seeds)" in said
    assert "HGRN2 -0.100, inconclusive (1 seed)" in said and "Mamba-2 +0.100, inconclusive (1 seed)" in said
    assert said.endswith("Mamba-2 and HGRN2 have fewer than three seeds.")
    assert "For HGRN2 the best rate is an end of the grid" in baselines(runs)
    row = next(ln for ln in summary(runs).splitlines() if "FoX beats Mamba-2" in ln)
    assert row.endswith("| Mamba-2: inconclusive (1 seed); HGRN2: inconclusive (1 seed, below FoX (Pro)); DeltaNet: "
                        "reproduced (3 seeds) |")


def test_the_long_part_pairs_its_runs_at_equal_seeds_beside_the_same_seeds_at_1x():
    from eval.reproduction import long_table
    from eval.reproduction_results import RunResult
    from eval.reproduction_verdicts import long, summary

    def r(label, lr, seed, part, loss):
        return RunResult(f"{label}-lr{lr:g}-s{seed}", label, seed, lr, part, "GPU", "v", loss, None)

    runs = [r(m, lr, 0, "lr", loss) for m, lr, loss in (("fox_pro", 1e-3, 4.0), ("fox_pro", 2e-3, 4.1),
                                                        ("transformer_pro", 1e-3, 4.3), ("transformer_pro", 2e-3, 4.2))]
    runs += [r("fox_pro_released", 1e-3, s, "released", loss) for s, loss in enumerate((4.10, 4.12, 4.11))]
    runs += [r("transformer_pro_released", 2e-3, s, "released", loss) for s, loss in enumerate((4.25, 4.26, 4.24))]
    assert long(runs) == "Not run yet: `--parts long`."
    runs += [r("fox_pro_released_4x", 1e-3, s, "long", loss) for s, loss in ((0, 3.90), (1, 3.92))]
    runs += [r("transformer_pro_released_4x", 2e-3, s, "long", loss) for s, loss in ((0, 4.00), (1, 4.04))]
    runs.append(r("fox_pro_released_no_kv_shift_4x", 1e-3, 0, "long", 3.95))
    text = long_table(runs)
    assert "| 0 | 3.9000 | 4.1000 | 4.0000 | 4.2500 | 3.9500 | – |" in text
    assert "| Transformer (Pro) − FoX (Pro), 4× tokens | +0.1000, +0.1200 |" in text
    assert "| Transformer (Pro) − FoX (Pro), 1×, the same seeds | +0.1500, +0.1400 |" in text  # not seed 2's
    assert "| FoX (Pro) − KV-shift − FoX (Pro), 4× tokens | +0.0500 | – | higher | inconclusive (fewer" in text
    said = long(runs)
    half = 12.706205 * np.std([0.10, 0.12], ddof=1) / 2 ** 0.5
    assert said.startswith(f"**Verdict (2 seeds): at 4× the tokens Transformer (Pro) − FoX (Pro) is +0.110 "
                           f"[{0.11 - half:+.3f}, {0.11 + half:+.3f}], inconclusive.** At the protocol's tokens the "
                           "same seeds give +0.145; the paper's gap (360M, Table 3) is +0.030.")
    moved = [0.10 - 0.15, 0.12 - 0.14]  # 4x gap − 1x gap at each seed
    half = 12.706205 * np.std(moved, ddof=1) / 2 ** 0.5
    assert (f"From 1× to 4× the gap moves by -0.035 [{np.mean(moved) - half:+.3f}, {np.mean(moved) + half:+.3f}]."
            in said)
    assert said.endswith("Removing KV-shift at 4× the tokens: +0.050 (one seed), inconclusive (1 seed).")
    row = next(ln for ln in summary(runs).splitlines() if "at 4× the tokens" in ln)
    assert row == ("| 1. FoX (Pro) beats the Transformer (Pro) at 4× the tokens | inconclusive (2 seeds): "
                   "Transformer − FoX +0.110 against +0.145 at 1×; the paper's +0.030 at 360M |")
    before = [r for r in runs if "_4x" not in r.label]
    row = next(ln for ln in summary(before).splitlines() if "at 4× the tokens" in ln)
    assert row.endswith("| not run (`--parts long`) |")


def test_a_corpus_without_its_files_is_an_error(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "reproduce.py"), "books", "--corpus", str(tmp_path),
                          "--out", str(tmp_path / "o"), "--parts", "lr"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode != 0 and "train-00.jsonl.xz not found" in res.stderr


def test_the_committed_docs_hold_the_tables_of_the_committed_results():
    """docs/reproduction.md and docs/eviction.md regenerate without a GPU: their generated tables are those of
    results/books, and reproduction.md holds every table."""
    from eval.reproduction import doc_blocks, render_tables

    tables = render_tables(ROOT / "results" / "books")
    for doc in ("reproduction.md", "eviction.md"):
        blocks = doc_blocks((ROOT / "docs" / doc).read_text())
        assert set(blocks) <= set(tables) and blocks, doc
        for name in blocks:
            assert blocks[name] == tables[name], f"docs/{doc} table '{name}' is stale: run scripts/reproduce.py " \
                "books --out results/books --report --doc docs/reproduction.md docs/eviction.md"
    assert set(doc_blocks((ROOT / "docs" / "reproduction.md").read_text())) == set(tables) - {"frontier"}


def test_paired_intervals_and_verdicts():
    from eval.reproduction import paired_interval, verdict

    mean, lo, hi = paired_interval([0.1, 0.2, 0.3])  # sd 0.1, n 3: t(0.975, 2) = 4.303
    assert mean == pytest.approx(0.2) and hi - mean == pytest.approx(4.303 * 0.1 / 3 ** 0.5)
    assert lo == pytest.approx(0.2 - 4.303 * 0.1 / 3 ** 0.5)
    assert paired_interval([0.1]) is None
    assert verdict((0.2, 0.1, 0.3), +1) == "reproduced" and verdict((0.2, 0.1, 0.3), -1) == "contradicts the paper"
    assert verdict((-0.2, -0.3, -0.1), -1) == "reproduced" and verdict((0.0, -0.1, 0.1), +1) == "inconclusive"
    assert verdict(None, +1).startswith("inconclusive") and verdict((0.2, 0.1, 0.3), None) == "differs"


def test_update_doc_rewrites_only_the_marked_tables(tmp_path):
    from eval.reproduction import update_doc

    doc = tmp_path / "d.md"
    doc.write_text("intro\n<!-- begin table: a -->\nold\n<!-- end table: a -->\nprose stays\n")
    update_doc(doc, {"a": "| new |", "b": "unused"})
    assert doc.read_text() == "intro\n<!-- begin table: a -->\n| new |\n<!-- end table: a -->\nprose stays\n"
    doc.write_text("<!-- begin table: z -->\n<!-- end table: z -->\n")
    with pytest.raises(ValueError, match="table 'z' is not one of"):
        update_doc(doc, {"a": ""})


def prose_numbers(text: str) -> list[str]:
    """Measured-looking numbers in a page's own prose: outside generated blocks, code and the papers' quotes
    (paragraphs opening with **Paper**), a number with two or more decimals, or any decimal number of nats, × or %."""
    text = re.sub(r"<!-- begin table: (\S+) -->.*?<!-- end table: \1 -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    paragraphs = [p for p in text.split("\n\n") if not p.lstrip().startswith("**Paper")]
    pattern = re.compile(r"(?<![\w.])\d+\.\d{2,}(?![\w.])|(?<![\w.])\d+\.\d+ ?(?:nats|×|%)")
    return [m.group(0) for p in paragraphs for m in pattern.finditer(p)]


PROTOCOL_CONSTANTS = {"0.95"}  # AdamW's beta2 (configs/optim), stated in the protocol


def test_the_reproduction_page_states_measured_numbers_only_in_generated_blocks():
    found = [x for x in prose_numbers((ROOT / "docs" / "reproduction.md").read_text()) if x not in PROTOCOL_CONSTANTS]
    assert found == [], "docs/reproduction.md states measured numbers by hand: write them from the result files " \
                        "(eval/reproduction_verdicts.py)"


def test_the_prose_check_catches_a_hand_written_loss_and_ignores_generated_blocks_and_quotes():
    page = ("A gap of 0.138 here. And 0.6 nats there, 1.35× faster, 84.7% pruned. 52.4M tokens, β 0.9.\n\n"
            "**Paper.** Perplexity 6.62.\n\n<!-- begin table: x -->\n4.1335\n<!-- end table: x -->\n")
    assert prose_numbers(page) == ["0.138", "0.6 nats", "1.35", "84.7%"]


def test_the_baseline_parts_list_each_baselines_grid_and_the_seeds_at_its_pick(corpus, tmp_path):
    cmds, _ = dry_run(corpus, tmp_path, "baselines,baseline-seeds",
                      ignore=lambda d, names: [n for n in names if n.startswith(tuple(rs.BASELINE_LRS))])
    lines = [ln.split(" [")[0] for ln in cmds]
    grids = {"mamba2": (1e-3, 2e-3, 4e-3, 8e-3), "hgrn2": (5e-4, 1e-3, 2e-3, 4e-3), "deltanet": (1e-3, 2e-3, 4e-3)}
    assert lines == ([f"{m}-lr{lr:g}-s0" for m, lrs in grids.items() for lr in lrs]
                     + [f"{m}-lr{lr:g}-s{seed}" for m, lr in (("mamba2", 4e-3), ("hgrn2", 1e-3), ("deltanet", 2e-3))
                        for seed in (1, 2)])
    assert any("experiment=books/mamba2_125m" in ln for ln in cmds)
