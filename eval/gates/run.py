"""Forget-gate matrices F, attention maps A and ACP pruning statistics of a trained model on one text.

    python -m eval.gates.run --run outputs/run1 --text-file book.txt --layers 0,1 --heads 0,1,2,3 --out results/gates
        [--length 512] [--what F,A,acp] [--block 64x64] [--threshold auto|FLOAT] [--eps 4.54e-5]
        [--step N] [--tokenizer PATH] [--device cuda]

``--run`` is a run directory written by train.py or a Hugging Face export. The first ``--length`` tokens of the
text (the tokenizer's bos first; default text: the embedded Gutenberg corpus) go through the model once; forward
hooks capture each Attention module's input, from which q, k, v and log f are recomputed with the module's own
submodules and checked against the module's output (see ``eval.gates.analysis``).

For the chosen ``--layers`` x ``--heads`` (default: up to 4 layers spread over the depth, heads 0-3):
    F_ij = prod_{l=j+1..i} f_l = exp(c_i - c_j)   (j <= i; 0 above the diagonal)
    A_ij = softmax_{j<=i}(q_i.k_j / sqrt(d) + c_i - c_j)
For every head of every layer, ACP (Adaptive Computation Pruning) with threshold delta (``auto``: the kernel's
``-2U - log T + log eps``, U from the QK-norm weights when the model has QK-norm): the fraction of forward tiles
(``--block`` BLOCK_MxBLOCK_N) pruned, and of causal (i, j) with c_i - c_j < delta.

Writes to ``--out``: ``gates.npz`` (F, A float32 (layers, heads, T, T); log f (layers, T, H)), ``gates.json``
(model, text, tokens, layers, heads), ``acp.json`` (per layer and head: delta, tiles, fractions), ``gates.png``
(F | A side by side, rows = layers, columns = heads) and ``acp.png`` (histogram of per-head pruned fractions and
their distribution per layer). ``python -m eval.gates.plot <out>`` re-plots them without the model.
A model without a forget gate (Transformer) supports ``--what A`` only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from eval.cli import positive_int
from eval.gates import analysis
from forgetting_transformer.ops.forgetting_attention import acp

WHAT = ("F", "A", "acp")


def parse_ints(option: str, s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} {s!r}: expected comma-separated integers, e.g. 0,1,2") from None


def parse_what(s: str) -> list[str]:
    parts = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in parts if x not in WHAT]
    if bad or not parts:
        raise ValueError(f"--what {s!r}: expected a comma-separated subset of {','.join(WHAT)}")
    return parts


def parse_block(s: str) -> tuple[int, int]:
    """"64" → (64, 64); "64x128" → (64, 128): BLOCK_M (queries) x BLOCK_N (keys)."""
    parts = s.lower().split("x")
    try:
        m, n = (int(parts[0]), int(parts[0])) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
    except (ValueError, IndexError):
        raise ValueError(f"--block {s!r}: expected BLOCK or BLOCK_MxBLOCK_N, e.g. 64 or 64x128") from None
    if len(parts) > 2 or m < 1 or n < 1:
        raise ValueError(f"--block {s!r}: expected BLOCK or BLOCK_MxBLOCK_N with positive sizes")
    return m, n


def parse_threshold(s: str):
    if s == "auto":
        return s
    try:
        return float(s)
    except ValueError:
        raise ValueError(f"--threshold {s!r}: expected 'auto' or a negative number") from None


def default_layers(n_layers: int) -> list[int]:
    """Up to 4 layers spread over the depth, first and last included (the paper shows 4 layers)."""
    if n_layers <= 4:
        return list(range(n_layers))
    return sorted({round(i * (n_layers - 1) / 3) for i in range(4)})


def text_tokens(tokenizer, text: str, length: int) -> list[int]:
    """The first ``length`` tokens of ``text`` (bos included when the tokenizer adds one); only a prefix of the
    text is tokenized (no BPE token is longer than 64 characters, so 64 * length characters are enough)."""
    ids = tokenizer(text[:64 * length + 64])["input_ids"][:length]
    if len(ids) < length:
        raise ValueError(f"--length {length}: the text gives only {len(ids)} tokens; pass a smaller --length or a "
                         f"longer --text-file")
    return ids


def read_text(path: str | None) -> tuple[str, str]:
    """(text, its description): the file, or the embedded Gutenberg corpus."""
    if path is None:
        from eval.niah.run import read_haystack

        return read_haystack(None), "embedded:gutenberg_sample"
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--text-file {path}: not found")
    return p.read_text(encoding="utf-8"), str(p)


def analyze(model, input_ids: torch.Tensor, out_dir, *, layers=None, heads=None, what=WHAT, block=(64, 64),
            threshold="auto", eps: float = acp.DEFAULT_EPS, meta: dict | None = None, progress: bool = True) -> dict:
    """Run the analysis of ``model`` (a ``DecoderLM`` in eval mode) on ``input_ids`` (1, T), write the files to
    ``out_dir`` and plot them. Returns ``{"json": path, "npz": path, "acp": path | None, "gates_png": ...,
    "acp_png": ...}``."""
    from eval.gates.plot import plot_acp, plot_gates
    from forgetting_transformer.training.progress import progress as counted

    meta = dict(meta or {})
    name = meta.setdefault("name", getattr(model.cfg, "name", "model"))
    mods = analysis.attention_modules(model)
    n_layers, n_heads = len(mods), mods[0].n_heads
    layers = default_layers(n_layers) if layers is None else list(layers)
    heads = list(range(min(4, n_heads))) if heads is None else list(heads)
    analysis.check_indices("--layers", layers, n_layers, "layers")
    analysis.check_indices("--heads", heads, n_heads, "heads per layer")
    gated = analysis.has_forget_gate(model)
    for w in ("F", "acp"):
        if w in what and not gated:
            raise analysis.no_gate_error(name, "the forget-gate matrix F" if w == "F" else "ACP")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be (1, T); got {tuple(input_ids.shape)}")
    T = input_ids.shape[1]
    want_maps = "F" in what or "A" in what
    # ACP statistics cover every layer; the F / A matrices only the chosen ones.
    hooked = list(range(n_layers)) if "acp" in what else layers
    captured = analysis.capture(model, input_ids, hooked)

    maps, log_fs, acp_layers = {}, {}, []  # maps[key][layer], log_fs[layer]: stacked in the order of `layers`
    for layer in counted(hooked, "gate analysis", "layer", enabled=progress):
        x, out = captured.pop(layer)
        q, k, v, log_f = analysis.project(mods[layer], x)
        mats = {}
        if want_maps and layer in layers:
            mats = analysis.head_matrices(q, k, log_f, heads, gates="F" in what, attention="A" in what)
            for key, m in mats.items():
                maps.setdefault(key, {})[layer] = m.float().cpu().numpy()
            if log_f is not None:
                log_fs[layer] = log_f[0].cpu().numpy()
        analysis.check_layer(mods[layer], layer, x, out, q, k, v, log_f, heads, mats.get("A"))
        if "acp" in what:
            acp_layers.append({"layer": layer, **analysis.acp_layer_stats(mods[layer], q, k, log_f, block=block,
                                                                          threshold=threshold, eps=eps)})

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": out_dir / "gates.json", "npz": None, "acp": None, "gates_png": None, "acp_png": None}
    record = {**meta, "tokens": T, "input_ids": input_ids[0].tolist(), "layers": layers, "heads": heads,
              "n_layers": n_layers, "n_heads": n_heads, "what": list(what)}
    files["json"].write_text(json.dumps(record, indent=1))
    if want_maps:
        arrays = {k: np.stack([m[layer] for layer in layers]) for k, m in maps.items()}
        if log_fs:  # (layers, T, H): F of any head can be rebuilt from it
            arrays["log_fgate"] = np.stack([log_fs[layer] for layer in layers])
        files["npz"] = out_dir / "gates.npz"
        np.savez_compressed(files["npz"], layers=np.array(layers), heads=np.array(heads), **arrays)
        files["gates_png"] = plot_gates(out_dir, out_dir / "gates.png")
    if "acp" in what:
        pruned = sum(sum(r["tiles_pruned"]) for r in acp_layers)
        total = sum(sum(r["tiles_total"]) for r in acp_layers)
        elem = float(np.mean([f for r in acp_layers for f in r["element_fraction"]]))
        acp_rec = {"name": name, "tokens": T, "block": list(block), "threshold": threshold, "eps": eps,
                   "qk_norm_bound": mods[0].q_norm is not None, "tile_fraction": pruned / total,
                   "element_fraction": elem, "layers": acp_layers}
        files["acp"] = out_dir / "acp.json"
        files["acp"].write_text(json.dumps(acp_rec, indent=1))
        files["acp_png"] = plot_acp(files["acp"], out_dir / "acp.png")
        print(f"{name}: ACP prunes {100 * pruned / total:.1f}% of the forward tiles ({block[0]}x{block[1]}) and "
              f"{100 * elem:.1f}% of the causal (i, j) over {n_layers} layers x {n_heads} heads, {T} tokens")
    return files


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="run directory (train.py) or Hugging Face dir (export_hf.py)")
    p.add_argument("--out", required=True, help="output directory for the arrays, JSON files and plots")
    p.add_argument("--text-file", default=None, help="UTF-8 text (default: the embedded Gutenberg corpus)")
    p.add_argument("--length", type=positive_int, default=512, help="tokens of the text to analyse (default 512)")
    p.add_argument("--layers", default=None, help="comma-separated layer indices for F / A (default: up to 4 "
                   "spread over the depth)")
    p.add_argument("--heads", default=None, help="comma-separated head indices for F / A (default 0,1,2,3)")
    p.add_argument("--what", default=",".join(WHAT), help="subset of F,A,acp (default all)")
    p.add_argument("--block", default="64x64", help="ACP tile size BLOCK_MxBLOCK_N (default 64x64)")
    p.add_argument("--threshold", default="auto", help="ACP threshold delta: 'auto' or a negative number")
    p.add_argument("--eps", type=float, default=acp.DEFAULT_EPS, help="ACP's bound on the pruned attention "
                   "weight per row, for 'auto' (default e^-10)")
    p.add_argument("--step", type=positive_int, default=None, help="checkpoint step of a run dir (default: latest)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json or HF tokenizer dir (default: the model's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    if a.length < 2:
        p.error(f"--length {a.length}: must be >= 2")
    layers = parse_ints("--layers", a.layers) if a.layers else None
    heads = parse_ints("--heads", a.heads) if a.heads else None
    what, block, threshold = parse_what(a.what), parse_block(a.block), parse_threshold(a.threshold)

    from eval.common import load_model_and_tokenizer

    hf, tok, info = load_model_and_tokenizer(a.run, step=a.step, tokenizer=a.tokenizer, device=a.device)
    model = hf.model.float().eval()  # fp32: the maps and thresholds are computed from the model's own numbers
    text, source = read_text(a.text_file)
    ids = torch.tensor([text_tokens(tok, text, a.length)], device=a.device)
    meta = {"name": f"{info['name']} ({Path(a.run).resolve().name})", "source": info["source"], "text": source,
            "token_strings": tok.convert_ids_to_tokens(ids[0].tolist())}
    files = analyze(model, ids, a.out, layers=layers, heads=heads, what=what, block=block, threshold=threshold,
                    eps=a.eps, meta=meta)
    for k, f in files.items():
        if f is not None:
            print(f"{k}: {f}")


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
