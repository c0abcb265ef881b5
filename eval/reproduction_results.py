"""The reproduction's result files read back (``OUT/runs/<run>/``, written by ``scripts/reproduce.py``), and the
statistics its tables and verdicts share: learning-rate picks, position bands of L(i), paired 95% intervals and
the verdict rule. No model or GPU needed."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

LABELS = {"fox_pro": "FoX (Pro)", "transformer_pro": "Transformer (Pro)", "fox_llama": "FoX (LLaMA)",
          "transformer_llama": "Transformer (LLaMA)", "transformer_llama_no_rope": "Transformer (LLaMA) w/o RoPE",
          "path_pro": "PaTH (Pro)", "path_fox_pro": "PaTH-FoX (Pro)"}
FAMILY = {"fox": "fox_pro", "transformer": "transformer_pro"}
BANDS = ((1, 512), (513, 4096), (4097, 8192), (8193, 16384))  # positions i (1-based, inclusive) of L(i)
ABLATIONS = ("fox_pro", "fox_pro_no_kv_shift", "fox_pro_no_output_gate", "fox_pro_no_output_norm",
             "fox_pro_no_qk_norm", "fox_pro_data_independent", "fox_pro_fixed", "fox_pro_rope", "transformer_llama",
             "transformer_llama_no_rope")


@dataclass
class RunResult:
    """What one finished run of the suite left in ``OUT/runs/<name>/``."""

    name: str
    label: str
    seed: int
    lr: float
    part: str
    device: str
    versions: str
    heldout: float  # inf when the run diverged
    tokens_per_s: float | None
    loss_curve: np.ndarray | None = None  # L(i), (T,)
    acp: dict | None = None
    niah: dict = field(default_factory=dict)  # mode → result
    acp_over_training: dict | None = None
    acp_rows: dict | None = None  # eval.gates.pruning's JSON: ACP's pruned tile share per held-out row
    path: Path | None = None
    params: float | None = None  # millions, as train.py printed them
    rows: list | None = None  # the held-out rows of L(i)
    row_bands: np.ndarray | None = None  # (rows, bands): each row's mean loss per band of ``band`` positions
    band: int | None = None
    gpu_jobs: int = 1  # jobs its GPU ran at once: tokens/s compare between runs that had the GPU alone
    retrieval: dict | None = None  # eval.retrieval.run's JSON
    frontier: dict | None = None  # eval.eviction.frontier's JSON


SHARED_GIB = 4.0  # GPU memory outside a run's allocator above which another job shared its GPU (its context: ~1)


def _gpu_jobs(done: dict, rows: list[dict]) -> int:
    """The jobs the run's GPU ran at once: as its command placed them, or at least 2 when its metrics saw another
    process's memory on the GPU (a job of another command; the first window, compile included, left out)."""
    elsewhere = [r["gpu_elsewhere_gib"] for r in rows if r.get("gpu_elsewhere_gib") is not None][1:]
    placed = int(done.get("gpu_jobs", 1))
    return max(placed, 2) if elsewhere and max(elsewhere) > SHARED_GIB else placed


def alone(r: "RunResult") -> bool:
    """Whether the run had its GPU to itself, so that its tokens/s compares with another's."""
    return r.gpu_jobs == 1 and r.tokens_per_s is not None


def _read_run(d: Path) -> RunResult | None:
    if not (d / "done.json").is_file():
        return None
    done = json.loads((d / "done.json").read_text())
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()] \
        if (d / "metrics.jsonl").is_file() else []
    losses = [r["heldout_loss"] for r in rows if "heldout_loss" in r]
    speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:]  # the first window holds the compile
    heldout = float("inf") if (d / "failed.json").is_file() or not losses else float(losses[-1])
    res = RunResult(d.name, done["label"], done["seed"], done["lr"], done["part"], done["device"],
                    f"torch {done['torch']}, triton {done['triton']}", heldout,
                    float(np.median(speeds)) if speeds else None, path=d, gpu_jobs=_gpu_jobs(done, rows))
    if (d / "per_token_loss.json").is_file():
        ptl = json.loads((d / "per_token_loss.json").read_text())
        res.loss_curve, res.rows = np.asarray(ptl["loss"]), ptl["rows"]
        if "row_bands" in ptl:  # runs trained before train.py kept per-row losses have none
            res.row_bands, res.band = np.asarray(ptl["row_bands"]), int(ptl["band"])
    log = d / "train.log"
    found = re.search(r": ([0-9.]+)M parameters", log.read_text(errors="replace")) if log.is_file() else None
    res.params = float(found.group(1)) if found else None
    if (d / "acp" / "acp.json").is_file():
        res.acp = json.loads((d / "acp" / "acp.json").read_text())
    for f in sorted((d / "niah").glob("*.json")) if (d / "niah").is_dir() else []:
        r = json.loads(f.read_text())
        res.niah[r["mode"]] = r
    for f in sorted((d / "retrieval").glob("*_retrieval.json")) if (d / "retrieval").is_dir() else []:
        res.retrieval = json.loads(f.read_text())
    for f in sorted((d / "eviction").glob("*.json")) if (d / "eviction").is_dir() else []:
        res.frontier = json.loads(f.read_text())
    if (d / "acp_over_training.json").is_file():
        res.acp_over_training = json.loads((d / "acp_over_training.json").read_text())
    if (d / "acp_rows" / "acp_rows.json").is_file():
        res.acp_rows = json.loads((d / "acp_rows" / "acp_rows.json").read_text())
    return res


def load_results(out) -> list[RunResult]:
    runs_dir = Path(out) / "runs"
    if not runs_dir.is_dir():
        raise FileNotFoundError(f"{runs_dir}: no runs (write them with scripts/reproduce.py books --parts ...)")
    return [r for d in sorted(runs_dir.iterdir()) if (r := _read_run(d)) is not None]


def fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "–"
    return "diverged" if math.isinf(x) else f"{x:.{digits}f}"


def picks(runs: list[RunResult]) -> dict[str, float]:
    """family → the sweep's learning rate (lowest held-out loss at seed 0 among the sweep parts)."""
    out = {}
    for family, model in FAMILY.items():
        sweep = [r for r in runs if r.label == model and r.part.startswith("lr") and r.seed == 0]
        if sweep:
            out[family] = min(sweep, key=lambda r: r.heldout).lr
    return out


def primary(runs: list[RunResult], label: str, family: str, pick: dict) -> list[RunResult]:
    """The runs of ``label`` at its family's pick, by seed."""
    lr = pick.get(family)
    return sorted((r for r in runs if r.label == label and r.lr == lr), key=lambda r: r.seed)


def bands_of(curve: np.ndarray) -> list[float | None]:
    return [float(curve[a - 1:b].mean()) if len(curve) >= b else None for a, b in BANDS]


def rise_past(r: "RunResult", n: int = 4096) -> float:
    """L(i) past a training length n: its mean over (2n, 4n] minus over (n/8, n]. At the protocol's n = 4,096 these
    are BANDS' last and second bands."""
    return float(r.loss_curve[2 * n:4 * n].mean() - r.loss_curve[n // 8:n].mean())


def band_cells(curve: np.ndarray | None) -> list[str]:
    """L(i) per band, then the rise past the training length, L(8,193–16,384) − L(513–4,096), formatted."""
    b = bands_of(curve) if curve is not None else [None] * len(BANDS)
    rise = b[3] - b[1] if b[3] is not None and b[1] is not None else None
    return [*(fmt(x) for x in b), fmt(rise)]


T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)  # Student t, 97.5%, df 1..10


Z_975 = 1.959964  # the normal distribution's 97.5% quantile


def t_975(df: int) -> float:
    """Student t's 97.5% quantile: the table to 10 degrees of freedom, then the Cornish-Fisher expansion (within
    2e-3 of the exact value from 11 on)."""
    if df <= len(T_975):
        return T_975[df - 1]
    z = Z_975
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def wilson(k: float, n: int) -> list[float]:
    """95% Wilson score interval of a proportion k / n (k may be a mean of per-trial rates times n). It stays in
    [0, 1], unlike a t interval."""
    p, z2 = k / n, Z_975 ** 2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z_975 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def paired_interval(diffs) -> tuple[float, float, float] | None:
    """Mean of paired differences and its 95% t interval (None for fewer than two pairs)."""
    n = len(diffs)
    if n < 2:
        return None
    mean = float(np.mean(diffs))
    half = t_975(n - 1) * float(np.std(diffs, ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half


def interval_text(ci: tuple[float, float, float] | None) -> str:
    return f"{ci[0]:+.4f} [{ci[1]:+.4f}, {ci[2]:+.4f}]" if ci else "–"


def verdict(interval: tuple[float, float, float] | None, paper_sign: int | None) -> str:
    """``reproduced`` / ``contradicts the paper`` when the interval excludes zero, else ``inconclusive``; without
    a claim of the paper (``paper_sign`` None): ``differs`` / ``inconclusive``."""
    if paper_sign is None:
        excludes = interval is not None and (interval[1] > 0 or interval[2] < 0)
        return "differs" if excludes else "inconclusive" if interval else "– (fewer than two seeds)"
    if interval is None:
        return "inconclusive (fewer than two seeds)"
    _, lo, hi = interval
    if lo > 0 or hi < 0:
        return "reproduced" if (1 if lo > 0 else -1) == paper_sign else "contradicts the paper"
    return "inconclusive"




# ------------------------------------------------------------------------------------------------ the compared runs

BASELINES = ("mamba2", "hgrn2", "deltanet")
LABELS.update({"fox_pro_released": "FoX (Pro)", "transformer_pro_released": "Transformer (Pro)", "mamba2": "Mamba-2",
               "hgrn2": "HGRN2", "deltanet": "DeltaNet",
               "fox_pro_released_data_independent": "FoX (Pro), data-independent gate",
               "fox_pro_released_fixed": "FoX (Pro), fixed gate", "fox_pro_released_rope": "FoX (Pro) + RoPE"})
# the long part: the released pair and FoX (Pro) without KV-shift at 4x the tokens, over all six train shards
LONG = (("fox_pro_released_4x", "fox_pro_released", "fox", "FoX (Pro)"),
        ("transformer_pro_released_4x", "transformer_pro_released", "transformer", "Transformer (Pro)"),
        ("fox_pro_released_no_kv_shift_4x", "fox_pro_released_no_kv_shift", "fox", "FoX (Pro) − KV-shift"))
LABELS.update({label: f"{name}, 4× tokens" for label, _, _, name in LONG})


def by_seed(runs: list[RunResult], label: str, lr: float | None) -> dict[int, RunResult]:
    return {r.seed: r for r in runs if r.label == label and lr is not None and r.lr == lr}


# PaTH on the released definition (parts path-released, path-lr): (PaTH model, its baseline, the PaTH paper's sign
# of model − baseline, name)
PATH_PAIRS = (("path_fox_pro_released", "fox_pro_released", -1, "PaTH-FoX (Pro) − FoX (Pro)"),
              ("path_pro_released", "transformer_pro_released", -1, "PaTH (Pro) − Transformer (Pro)"))
LABELS.update({"path_pro_released": "PaTH (Pro)", "path_fox_pro_released": "PaTH-FoX (Pro)"})


def full_curve(r: RunResult) -> bool:
    """The run's L(i) reaches the last band (16,384 tokens)."""
    return r.loss_curve is not None and len(r.loss_curve) >= BANDS[-1][1]


def full_seeds(runs: list[RunResult], label: str, lr: float | None) -> dict[int, RunResult]:
    """``by_seed``'s runs whose L(i) reaches the last band."""
    return {s: r for s, r in by_seed(runs, label, lr).items() if full_curve(r)}


def path_pairs(runs: list[RunResult]) -> list[tuple[str, list[float], int]]:
    """(name, PaTH model − its baseline at each shared seed, the paper's sign) for PATH_PAIRS, each model at its
    family's pick (PaTH at FoX (Pro)'s)."""
    pick = picks(runs)
    lr = {"fox_pro_released": pick.get("fox"), "transformer_pro_released": pick.get("transformer")}
    return [(name, paired(by_seed(runs, label, pick.get("fox")), by_seed(runs, base, lr[base])), sign)
            for label, base, sign, name in PATH_PAIRS]


def path_rates(runs: list[RunResult]) -> dict[str, dict[float, float]]:
    """PaTH model → {lr: held-out loss at seed 0}: the pick (path-released) and the rates either side (path-lr)."""
    return {label: {r.lr: r.heldout for r in runs if r.label == label and r.seed == 0} for label, *_ in PATH_PAIRS}


def acp_released(runs: list[RunResult], context: str = "") -> tuple[dict, dict, dict]:
    """(dense, twin, acp) by seed, at the FoX pick: the released FoX (Pro) of the ``released`` part, its dense twins
    (the same command, trained just before the ACP run on the same GPU) and the ACP runs (``acp-released``).
    ``context="_16k"``: the ``acp-16k`` pair (no ``released`` run: dense is empty)."""
    lr = picks(runs).get("fox")
    dense, twin, acp = (by_seed(runs, label, lr) for label in (f"fox_pro_released{context}",
                                                                f"fox_pro_released_dense{context}",
                                                                f"fox_pro_released_acp{context}"))
    return dense, twin, acp


def acp_speedups(twin: dict[int, RunResult], acp: dict[int, RunResult]) -> dict[int, float]:
    """seed → the ACP run's tokens/s over its dense twin's, where both had a GPU of the same model to themselves."""
    return {s: acp[s].tokens_per_s / twin[s].tokens_per_s for s in sorted(set(acp) & set(twin))
            if alone(acp[s]) and alone(twin[s]) and acp[s].device == twin[s].device}


def llama_pick(runs: list[RunResult]) -> dict[str, float]:
    """label → the LLaMA pair's rate with several seeds (the ``llama-seeds`` part: their own sweep's best), else
    the Pro pair's picks that ``main`` trains them at."""
    pick, out = picks(runs), {}
    for label, family in (("fox_llama", "fox"), ("transformer_llama", "transformer")):
        seeded = [r.lr for r in runs if r.label == label and r.part == "llama-seeds"]
        lr = seeded[0] if seeded else pick.get(family)
        if lr is not None:
            out[label] = lr
    return out


def baseline_pick(runs: list[RunResult]) -> dict[str, float]:
    """label → the baseline's rate with the lowest held-out loss at seed 0 (part ``baselines``)."""
    out = {}
    for label in BASELINES:
        rs = [r for r in runs if r.label == label and r.part == "baselines" and r.seed == 0]
        if rs:
            out[label] = min(rs, key=lambda r: r.heldout).lr
    return out


def compared(runs: list[RunResult]) -> list[tuple[str, float]]:
    """(label, lr) of claim 1's models: the Pro pair as released at the Pro picks, the LLaMA pair at its pick, each
    baseline at its best rate."""
    pick = picks(runs)
    out = [(label, pick[family]) for label, family in (("fox_pro_released", "fox"),
                                                         ("transformer_pro_released", "transformer"))
           if family in pick]
    return out + list(llama_pick(runs).items()) + list(baseline_pick(runs).items())


def paired(a: dict[int, RunResult], b: dict[int, RunResult], value=lambda r: r.heldout) -> list[float]:
    """value(a) − value(b) at the seeds both have."""
    return [value(a[s]) - value(b[s]) for s in sorted(set(a) & set(b))]


ROW_BANDS = ((1, 1024), (1025, 4096), (4097, 8192), (8193, 16384))  # L(i) bands that per-row losses resolve


def row_band_diffs(a: RunResult, b: RunResult, lo: int, hi: int) -> np.ndarray | None:
    """Per held-out row, a's mean loss over positions lo..hi minus b's (the same rows), from the per-row band
    means; None where either run kept none or the band does not fall on their band edges."""
    if a.row_bands is None or b.row_bands is None or a.rows != b.rows or a.band != b.band:
        return None
    band = a.band
    if (lo - 1) % band or hi % band or hi // band > a.row_bands.shape[1]:
        return None
    cols = slice((lo - 1) // band, hi // band)
    return a.row_bands[:, cols].mean(1) - b.row_bands[:, cols].mean(1)  # equal-width bands: the mean of means


def claim2_runs(runs: list[RunResult]) -> list[RunResult]:
    """One run per model for the L(i) figure: claim 1's models at seed 0, and the Transformer (LLaMA) without RoPE
    beside the Transformer (LLaMA) at its rate."""
    out = [rs[min(rs)] for label, lr in compared(runs) if (rs := {s: r for s, r in by_seed(runs, label, lr).items()
                                                                  if r.loss_curve is not None})]
    no_rope = [r for r in runs if r.label == "transformer_llama_no_rope" and r.seed == 0 and r.loss_curve is not None
               and r.lr == picks(runs).get("transformer")]  # (the gates part's; released-gates trains its own rate)
    for r in no_rope[:1]:
        out += [x for x in runs if x.label == "transformer_llama" and x.lr == r.lr and x.seed == 0 and x not in out]
        out.append(r)
    return out


def display_name(r: RunResult, chosen: list[RunResult]) -> str:
    """The model's name, with its rate where another of the chosen runs has the same model."""
    name = LABELS.get(r.label, r.label)
    return f"{name} at {r.lr:g}" if sum(x.label == r.label for x in chosen) > 1 else name
