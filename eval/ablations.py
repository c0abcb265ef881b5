"""The FoX paper's Table 3 (ablations) from run directories or per-token-loss JSONs: one row per run, ticks for the
model switches, perplexity = exp(mean held-out loss per token). Rendered by ``scripts/make_tables.py --table 3`` and
by the reproduction report (``eval.reproduction``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from eval.tables import mark, rank_marks, tex_escape
from forgetting_transformer.markdown import table

# Table 3 columns: (header, model-config switch)
SWITCHES = [("RoPE", "rope"), ("Forget gate", "fgate"), ("QK-norm", "qk_norm"), ("Output gate", "output_gate"),
            ("Output norm", "output_norm"), ("KV-shift", "kv_shift")]
GATE_KINDS = {"data_dependent": "✓", "data_independent": "data-indep.", "fixed": "fixed", "none": ""}
DIFF_NAMES = {"rope": "RoPE", "qk_norm": "QK-norm", "output_gate": "output gate", "output_norm": "output norm",
              "kv_shift": "KV-shift"}  # as the paper's Table 3 writes them in "- QK-norm", "+ RoPE", ...
PRO = dict(qk_norm=True, output_gate=True, output_norm=True, kv_shift=True)
LLAMA = dict(qk_norm=False, output_gate=False, output_norm=False, kv_shift=False)
PRESETS = {  # the paper's names for these switch settings
    "FoX (Pro)": dict(rope=False, fgate="data_dependent", **PRO),
    "FoX (LLaMA)": dict(rope=False, fgate="data_dependent", **LLAMA),
    "Transformer (Pro)": dict(rope=True, fgate="none", **PRO),
    "Transformer (LLaMA)": dict(rope=True, fgate="none", **LLAMA),
    "Transformer (LLaMA) w/o RoPE": dict(rope=False, fgate="none", **LLAMA),
}


# ----------------------------------------------------------------------------------------------------- Table 3


def switches_of(model_cfg) -> dict:
    """The Table 3 switches of a model config (OmegaConf node or dict); a missing key is an error naming it."""
    out = {}
    for _, key in SWITCHES:
        if key not in model_cfg:
            raise ValueError(f"model config has no '{key}': not a config of this codebase's decoder")
        out[key] = str(model_cfg[key]) if key == "fgate" else bool(model_cfg[key])
    if out["fgate"] not in GATE_KINDS:
        raise ValueError(f"model.fgate={out['fgate']!r}: expected one of {sorted(GATE_KINDS)}")
    return out


def row_label(sw: dict) -> str:
    """A preset's name, else FoX (Pro) with the differences, e.g. 'FoX (Pro) - QK-norm + RoPE'."""
    for name, preset in PRESETS.items():
        if sw == preset:
            return name
    base = PRESETS["FoX (Pro)"]
    parts = []
    if sw["fgate"] == "none":
        parts.append("- forget gate")
    elif sw["fgate"] != base["fgate"]:
        parts.append(f"with {sw['fgate'].replace('_', '-')} forget gate")
    for key, name in DIFF_NAMES.items():
        if sw[key] != base[key]:
            parts.append(f"{'+' if sw[key] else '-'} {name}")
    return "FoX (Pro) " + " ".join(parts)


def _run_config(run_dir: Path):
    from omegaconf import OmegaConf

    return OmegaConf.load(run_dir / "config.yaml")


def _json_model_config(path: Path, res: dict):
    """The model config of a per-token-loss JSON: the run dir it sits in, the run its checkpoint belongs to, or the
    Hugging Face export it was computed from."""
    if (path.parent / "config.yaml").is_file():
        return _run_config(path.parent).model
    src = res.get("checkpoint")
    if src:
        src = Path(src)
        # a run's checkpoint: <run>/checkpoints/step_XXXXXXXX
        if src.parent.name == "checkpoints" and (src.parent.parent / "config.yaml").is_file():
            return _run_config(src.parent.parent).model
        if (src / "config.json").is_file():
            return json.loads((src / "config.json").read_text())
    raise FileNotFoundError(f"{path}: cannot find its model config (no config.yaml beside it, and its checkpoint "
                            f"entry {src!r} leads to no run or Hugging Face directory); pass the run directory")


def load_ablation_row(spec: str) -> dict:
    """``[LABEL=]PATH`` → ``{"label", "switches", "perplexity", "length", "source"}`` for Table 3."""
    label, path = None, Path(spec)
    if not path.exists() and "=" in spec:
        label, path = spec.split("=", 1)[0].strip(), Path(spec.split("=", 1)[1])
    if path.is_dir():
        if not (path / "config.yaml").is_file():
            raise FileNotFoundError(f"{path}: not a run directory (no config.yaml)")
        cfg = _run_config(path)
        metrics = path / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] \
            if metrics.is_file() else []
        losses = [r["heldout_loss"] for r in rows if "heldout_loss" in r]
        if not losses:
            raise ValueError(f"{metrics}: no heldout_loss row (did the run finish?); pass a per-token-loss JSON")
        model_cfg, loss, length = cfg.model, float(losses[-1]), int(cfg.data.seq_len)
    elif path.is_file():
        res = json.loads(path.read_text())
        if not isinstance(res.get("loss"), list) or not res["loss"]:
            raise ValueError(f"{path}: no 'loss' list; Table 3 takes per-token-loss JSONs or run directories")
        model_cfg, loss, length = _json_model_config(path, res), sum(res["loss"]) / len(res["loss"]), len(res["loss"])
    else:
        raise FileNotFoundError(f"Table 3 input {spec}: not found")
    sw = switches_of(model_cfg)
    return {"label": label or row_label(sw), "switches": sw, "perplexity": math.exp(loss), "length": length,
            "source": str(path)}


def render_table3(rows: list[dict], *, latex: bool = False) -> str:
    marks = rank_marks([r["perplexity"] for r in rows], lower=True)
    headers = ["Model"] + [h for h, _ in SWITCHES] + ["Perplexity↓"]
    body = []
    for r, rank in zip(rows, marks):
        ticks = [GATE_KINDS[r["switches"][k]] if k == "fgate" else ("✓" if r["switches"][k] else "")
                 for _, k in SWITCHES]
        ppl = f"{r['perplexity']:.2f}"
        if latex:
            ticks = [r"\checkmark" if t == "✓" else t for t in ticks]
            body.append(" & ".join([tex_escape(r["label"])] + ticks + [mark(ppl, rank, True)]) + r" \\")
        else:
            body.append([r["label"]] + ticks + [mark(ppl, rank, False)])
    if latex:
        head = " & ".join(headers).replace("↓", r"$\downarrow$") + r" \\"
        return "\n".join([r"\begin{tabular}{l" + "c" * (len(headers) - 1) + "}", r"\toprule", head, r"\midrule",
                          *body, r"\bottomrule", r"\end{tabular}"])
    lengths = sorted({r["length"] for r in rows})
    note = (f"Perplexity: exp of the mean held-out loss per token over sequences of "
            f"{' / '.join(f'{n:,}' for n in lengths)} tokens{' (differs between rows)' if len(lengths) > 1 else ''}"
            f"; best in bold, second underlined.")
    return table(headers, body, "l" + "c" * len(SWITCHES) + "r") + "\n\n" + note
