"""The quality-vs-memory frontier of KV-cache eviction: loss and greedy agreement against the KV cache kept.

    python -m eval.eviction.frontier --model hf/fox-pro-760m --text-file book.txt --lengths 16384 \\
        --fractions 0.01,0.02,0.05,0.1,0.2,0.5 --policies acp,streaming,h2o,snapkv --out results/frontier

The text is cut into --windows consecutive windows of (longest prompt + --continuation + 1) tokens. For each
window and prompt length P, the window's first P tokens are prefilled once into a full cache, which also scores the
positions (``inference.policies.prefill_prefix``). Each policy then evicts from the prompt: the targeted ones
(streaming, h2o, snapkv) at every kept fraction and every --kv-mib budget, ACP at every --acp-eps and
--acp-threshold. Through what is kept, the next --continuation tokens of the text are scored (teacher forcing),
and --new-tokens greedy tokens are compared with those of the full cache, step by step on the full cache's
tokens. Writes <out>/<model>.json (one record per window, length and point) and <out>/<model>.png (loss against
KV MiB kept, means over the windows). See docs/eviction.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from matplotlib.ticker import NullFormatter

from eval.cli import parse_list, positive_int
from eval.eviction.windows import mean_over_windows
from eval.plotting import plt, save_figure
from forgetting_transformer.inference.policies import (POLICIES, Acp, continuation_loss, greedy_tokens, keep_all,
                                                       prefill_prefix)
from forgetting_transformer.training.progress import Progress, heartbeat

MIB = 1 << 20


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="a training run directory (config.yaml) or a Hugging Face directory (config.json, e.g. "
                        "one written by scripts/convert_official.py)")
    p.add_argument("--text-file", required=True, type=Path,
                   help="a UTF-8 text, tokenized with the model's tokenizer (bos first); it must hold the longest "
                        "prompt + --continuation + 1 tokens")
    p.add_argument("--out", required=True, type=Path, help="directory for <model>.json and <model>.png")
    p.add_argument("--lengths", default="16384",
                   help="prompt lengths in tokens, comma-separated: the text's first P tokens (default 16384)")
    p.add_argument("--policies", default="acp,streaming,h2o,snapkv",
                   help=f"comma-separated, among {', '.join(POLICIES)} (default: all)")
    p.add_argument("--fractions", default="0.01,0.02,0.05,0.1,0.2,0.5",
                   help="kept fractions of the prompt for streaming, h2o and snapkv, each in (0, 1]; every "
                        "(layer, kv head) keeps max(1, floor(fraction * P + 1/2)) positions (default "
                        "0.01,0.02,0.05,0.1,0.2,0.5)")
    p.add_argument("--kv-mib", default=None,
                   help="KV budgets in MiB (keys, values and gates of the kept prompt positions, whole cache) for "
                        "streaming, h2o and snapkv, comma-separated, in addition to --fractions (default: none)")
    p.add_argument("--acp-eps", default=None,
                   help="ACP bounds, comma-separated, each in (0, 1): at most eps of any attention row's mass is "
                        "dropped (default: the model config's acp_eps; needs QK-norm)")
    p.add_argument("--acp-threshold", default=None,
                   help="explicit ACP thresholds delta < 0, comma-separated: keys with c_P - c_j < delta are "
                        "dropped (for models without QK-norm; default: none)")
    p.add_argument("--sink", type=int, default=4, help="streaming: the first positions always kept (default 4)")
    p.add_argument("--h2o-recent", type=float, default=0.5,
                   help="h2o: share of the budget given to the most recent positions, in [0, 1] (default 0.5)")
    p.add_argument("--snapkv-window", type=positive_int, default=32,
                   help="snapkv: the last queries whose attention ranks the earlier positions, kept themselves "
                        "(default 32)")
    p.add_argument("--snapkv-kernel", type=positive_int, default=7,
                   help="snapkv: odd width of the max-pool over the window's scores (default 7)")
    p.add_argument("--continuation", type=positive_int, default=1024,
                   help="tokens after each prompt scored through the evicted cache (default 1024)")
    p.add_argument("--new-tokens", type=positive_int, default=64,
                   help="greedy tokens compared with the full cache's after each prompt (default 64)")
    p.add_argument("--windows", type=positive_int, default=1,
                   help="consecutive windows of the text, each scored on its own (default 1); the JSON keeps every "
                        "window's points, so a difference has an interval across windows")
    p.add_argument("--chunk", type=positive_int, default=512,
                   help="continuation tokens per forward through the cache (default 512)")
    p.add_argument("--block-size", type=positive_int, default=64, help="cache block size (default 64)")
    p.add_argument("--step", type=positive_int, default=None,
                   help="checkpoint step of a run directory (default: the latest)")
    p.add_argument("--tokenizer", default=None,
                   help="a tokenizer.json or Hugging Face tokenizer directory instead of the model's own")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="default: cuda when available, else cpu")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="weights and cache (default auto: bfloat16 on CUDA, float32 elsewhere)")
    return p


def check_args(a: argparse.Namespace) -> dict:
    """The list flags parsed and every flag value checked, before the model loads."""
    names = [n.strip() for n in a.policies.split(",")]
    for n in names:
        if n not in POLICIES:
            raise ValueError(f"--policies: unknown policy {n!r} (choose from {', '.join(POLICIES)})")
    if not a.text_file.is_file():
        raise FileNotFoundError(f"--text-file: {a.text_file} not found")
    if a.sink < 0:
        raise ValueError(f"--sink: must be >= 0; got {a.sink}")
    if not 0 <= a.h2o_recent <= 1:
        raise ValueError(f"--h2o-recent: {a.h2o_recent} is outside [0, 1]")
    if a.snapkv_kernel % 2 == 0:
        raise ValueError(f"--snapkv-kernel: must be odd; got {a.snapkv_kernel}")
    return {
        "policies": list(dict.fromkeys(names)),
        "lengths": parse_list(a.lengths, "--lengths", int, lambda v: v >= 1, "[1, inf)"),
        "fractions": parse_list(a.fractions, "--fractions", float, lambda v: 0 < v <= 1, "(0, 1]"),
        "kv_mib": [] if a.kv_mib is None else parse_list(a.kv_mib, "--kv-mib", float, lambda v: v > 0, "(0, inf)"),
        "eps": None if a.acp_eps is None else parse_list(a.acp_eps, "--acp-eps", float, lambda v: 0 < v < 1,
                                                          "(0, 1)"),
        "thresholds": [] if a.acp_threshold is None else parse_list(a.acp_threshold, "--acp-threshold", float,
                                                                    lambda v: v < 0, "(-inf, 0)"),
    }


def build_policies(a: argparse.Namespace, lists: dict, cfg, name: str) -> list:
    """One policy object per point of the sweep."""
    policies = []
    for n in lists["policies"]:
        if n == "acp":
            policies += acp_policies(lists, cfg, name)
            continue
        extra = {"streaming": dict(sink=a.sink), "h2o": dict(recent_share=a.h2o_recent),
                 "snapkv": dict(window=a.snapkv_window, kernel=a.snapkv_kernel)}[n]
        policies += [POLICIES[n](fraction=f, **extra) for f in lists["fractions"]]
        policies += [POLICIES[n](kv_bytes=round(m * MIB), **extra) for m in lists["kv_mib"]]
    return policies


def acp_policies(lists: dict, cfg, name: str) -> list:
    if cfg.fgate == "none":
        raise ValueError(f"--policies acp: {name} has no forget gate (a Transformer); leave acp out")
    eps = lists["eps"]
    if eps is None:  # the model's own bound, unless explicit thresholds replace it
        eps = [] if lists["thresholds"] else [cfg.acp_eps]
    if eps and not cfg.qk_norm:
        raise ValueError(f"--acp-eps: {name} has no QK-norm, which ACP's bound at eps needs: pass --acp-threshold "
                         "(one or more deltas < 0) instead")
    return [Acp(eps=e) for e in eps] + [Acp(threshold=t) for t in lists["thresholds"]]


def sweep_length(model, ids: torch.Tensor, P: int, policies: list, a, bar: Progress, window: int = 0):
    """The full cache and every policy's point at prompt length P; ``ids`` (1, >= P + continuation + 1), the
    text's ``window``-th window."""
    C, N = a.continuation, a.new_tokens
    prompt, cont, labels = ids[:, :P], ids[:, P:P + C], ids[:, P + 1:P + C + 1]
    stats = [p.statistic for p in policies if p.statistic is not None]
    start = time.monotonic()
    prefix = prefill_prefix(model, prompt, statistics=stats, max_len=P + max(C, N), block_size=a.block_size)
    print(f"  window {window}, prompt {P}: prefilled and scored in {time.monotonic() - start:.1f} s", flush=True)
    for policy in policies:  # a --kv-mib budget below one position per row, named before any scoring
        if getattr(policy, "kv_bytes", None) is not None:
            try:
                policy.count(prefix)
            except ValueError as e:
                raise ValueError(f"--kv-mib {policy.kv_bytes / MIB:g}: {e}") from None
    everything = keep_all(prefix)
    loss_full = float(continuation_loss(prefix, everything, cont, labels, chunk=a.chunk).double().mean())
    greedy_full = greedy_tokens(prefix, everything, N)  # (1, N)
    full = {"length": P, "text_window": window, "loss": loss_full,
            "kv_mib": everything.kv_bytes(prefix) / MIB,
            "greedy_tokens": greedy_full[0].tolist()}
    points = []
    for policy in policies:
        bar.working_on(f"window {window}, prompt {P}, {policy.name}")
        selection = policy.select(prefix)
        loss = float(continuation_loss(prefix, selection, cont, labels, chunk=a.chunk).double().mean())
        same = (greedy_tokens(prefix, selection, N, forced=greedy_full) == greedy_full)[0]  # (N,)
        points.append({"length": P, "text_window": window, **policy.describe(),
                       "kept_fraction": selection.kept_fraction,
                       "kv_mib": selection.kv_bytes(prefix) / MIB, "loss": loss, "loss_diff": loss - loss_full,
                       "greedy_agreement": float(same.double().mean()),
                       "greedy_identical_prefix": N if bool(same.all()) else int((~same).int().argmax())})
        bar.update(1)
    return full, points


def plot(result: dict, out_png: Path) -> Path:
    """Loss on the continuation against KV MiB kept, one panel per prompt length, one curve per policy (ACP's
    points by eps / threshold), the full cache as a star and a dashed line; means over the text's windows."""
    fulls, points = mean_over_windows(result)
    fig, axes = plt.subplots(1, len(fulls), figsize=(5.5 * len(fulls), 4.2), squeeze=False)
    for ax, full in zip(axes[0], fulls):
        mine = [p for p in points if p["length"] == full["length"]]
        for name in dict.fromkeys(p["policy"] for p in mine):
            pts = sorted((p for p in mine if p["policy"] == name), key=lambda p: p["kv_mib"])
            ax.plot([p["kv_mib"] for p in pts], [p["loss"] for p in pts], marker="o", ms=4, label=name)
        ax.axhline(full["loss"], color="gray", ls="--", lw=1)
        ax.plot([full["kv_mib"]], [full["loss"]], marker="*", ms=10, color="k", ls="", label="full cache")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels of a narrow log range overlap
        ax.set_xlabel("KV cache kept for the prompt (MiB)")
        ax.set_ylabel(f"loss on the next {result['continuation']} tokens")
        windows = f", mean of {full['windows']} windows" if full["windows"] > 1 else ""
        ax.set_title(f"{result['model']}, prompt {full['length']} tokens{windows}", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out_png, dpi=130)


def load(a: argparse.Namespace):
    """(model, tokenizer, info, dtype name) on --device in --dtype."""
    from eval.common import load_model_and_tokenizer

    model, tok, info = load_model_and_tokenizer(a.model, step=a.step, tokenizer=a.tokenizer, device=a.device)
    dtype = a.dtype if a.dtype != "auto" else ("bfloat16" if torch.device(a.device).type == "cuda" else "float32")
    return model.to(getattr(torch, dtype)), tok, info, dtype


def main(argv=None) -> dict:
    a = make_parser().parse_args(argv)
    lists = check_args(a)
    model, tok, info, dtype = load(a)
    cfg = model.config
    policies = build_policies(a, lists, cfg, info["name"])
    ids = tok(a.text_file.read_text(encoding="utf-8"))["input_ids"]
    need = max(lists["lengths"]) + a.continuation + 1
    if len(ids) < need * a.windows:
        raise ValueError(f"--text-file: {a.text_file} holds {len(ids)} tokens; --windows ({a.windows}) x (the "
                         f"longest of --lengths ({max(lists['lengths'])}) + --continuation ({a.continuation}) + 1) "
                         f"need {need * a.windows}")
    ids = torch.tensor(ids[:need * a.windows], device=a.device).view(a.windows, need)  # (windows, need)
    print(f"{info['name']} ({info['source']}, {dtype}): {len(policies)} points x {len(lists['lengths'])} "
          f"prompt lengths x {a.windows} windows", flush=True)
    result = {"model": info["name"], "source": info["source"], "text_file": str(a.text_file), "dtype": dtype,
              "device": torch.cuda.get_device_name(a.device) if "cuda" in a.device else "cpu",
              "continuation": a.continuation, "new_tokens": a.new_tokens, "chunk": a.chunk,
              "block_size": a.block_size, "windows": a.windows, "window_tokens": need, "full": [], "points": []}
    stem = Path(a.model).resolve().name
    with Progress(len(policies) * len(lists["lengths"]) * a.windows, f"eviction frontier {stem}", "point") as bar, \
            heartbeat(bar):
        for w in range(a.windows):
            for P in lists["lengths"]:
                full, points = sweep_length(model, ids[w:w + 1], P, policies, a, bar, window=w)
                result["full"].append(full)
                result["points"] += points
                print(f"  window {w}, prompt {P}: full cache {full['kv_mib']:.4g} MiB, loss {full['loss']:.4f}",
                      flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    png = plot(result, a.out / f"{stem}.png")
    print(f"wrote {a.out / f'{stem}.json'} and {png}")
    return result


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
