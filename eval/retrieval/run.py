"""Retrieval probes scored by log-likelihood (teacher forcing, no generation): the needle log-likelihood gain and
the passkey rank, over a grid of context lengths × needle depths.

    python -m eval.retrieval.run --run RUN_OR_HF_DIR --out DIR [--haystack FILE_OR_DIR]
        [--lengths 1k,2k,4k,8k,16k] [--depths 0,0.25,0.5,0.75,1] [--trials 20] [--seed 0]
        [--distractors 9] [--passkey-digits 5] [--batch-size 8] [--dtype auto|float32|bfloat16]
        [--step N] [--tokenizer PATH] [--device cuda]

Each prompt has exactly L tokens (bos included) and is built from token ids, as ``eval.niah.run`` builds its own
(same haystack reading, same cut, same back-off to a sentence boundary):

    [bos] + HEAD + haystack[:p] + NEEDLE + haystack[p:n] + QUERY          then the scored ANSWER tokens

* ``n = L - |bos| - |HEAD| - |NEEDLE| - |QUERY|``: the haystack cut to n tokens (repeated when shorter).
* ``p = int(n * d)`` for the depth d in [0, 1] (a fraction of the haystack, 0.5 = the middle), backed off to just
  after the previous sentence end; ``p = n`` for d = 1.
* The answer is tokenized alone and its token ids are put into the needle as they are, so the scored ids are the
  ids the needle holds.

Needle log-likelihood gain (HEAD empty; KEY a word, VALUE a 7-digit number):
    NEEDLE = "\\nThe secret number for KEY is VALUE.\\n"
    QUERY  = "\\n\\nWhat is the secret number for KEY? The secret number for KEY is",  ANSWER = " VALUE"
    The control prompt is the same prompt with the NEEDLE's tokens replaced by as many haystack tokens (those that
    follow haystack[:n]): same length, same tokens outside the needle span.
    gain = (log p(ANSWER | prompt) - log p(ANSWER | control)) / |ANSWER|   (nats per answer token)
    Per cell: the mean gain with its 95% t interval, and the fraction of trials with gain > 0 (Wilson interval).
    A model that takes nothing from the needle's value has gain 0 on average (the needle's other words can move a
    cell a little either way); one that copies the value gains about what the value cost it without the needle.

Passkey rank (after Mohtashami & Jaggi 2023's prompt, the books as the irrelevant text; KEY a number of
--passkey-digits digits):
    HEAD   = "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz
              you about the pass key.\\n\\n"
    NEEDLE = "\\nThe pass key is KEY. Remember it. KEY is the pass key.\\n"
    QUERY  = "\\n\\nWhat is the pass key? The pass key is"
    The answer " KEY" and --distractors K others (distinct numbers of as many digits and as many tokens, so that
    total log-probabilities compare sequences of one length) are ranked by total log-probability after the
    prompt; a distractor that ties the key ranks above it. Per cell: accuracy (rank 1; chance 1/(K+1)) and the mean
    reciprocal rank (chance H(K+1)/(K+1), H the harmonic number), with 95% intervals.

Trial t draws its key and value (or passkey and distractors) from the seed and t alone: every cell of the grid
asks the same questions. Scoring runs on the model's device in batches: the needle probe's rows right-padded (a
causal model's earlier positions never see the padding), the passkey prompts of a cell prefilled once and their
cache repeated for the candidates.

Output: ``<out>/<model dir>_retrieval.json`` (every cell's statistics and per-trial values, the command, the seed,
the model) and the heatmaps ``<out>/<model dir>_needle_gain.png`` and ``<out>/<model dir>_passkey.png`` (re-plot
several models with ``python -m eval.retrieval.plot``). See docs/niah.md, "Retrieval probes".
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

from eval.cli import parse_list, positive_int
from eval.common import DTYPES, load_model_and_tokenizer
from eval.niah.run import PromptBuilder, parse_lengths, read_haystack
from eval.reproduction_results import paired_interval, wilson

NEEDLE = "\nThe secret number for {key} is {value}.\n"
QUERY = "\n\nWhat is the secret number for {key}? The secret number for {key} is"
VALUE_DIGITS = 7
PASSKEY_HEAD = ("There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz "
                "you about the pass key.\n\n")
PASSKEY_NEEDLE = "\nThe pass key is {key}. Remember it. {key} is the pass key.\n"
PASSKEY_QUERY = "\n\nWhat is the pass key? The pass key is"
# Keys of the needle probe: plain words, each a few tokens in a books BPE.
KEY_WORDS = ("apple", "river", "lantern", "violin", "harbor", "meadow", "falcon", "garden", "marble", "canyon",
             "orchid", "copper", "island", "thunder", "saddle", "pepper", "glacier", "pillow", "tunnel", "walnut",
             "anchor", "basket", "candle", "dragon", "feather", "helmet", "jacket", "kettle", "ladder", "mirror",
             "pencil", "rocket")
DEFAULT_LENGTHS = "1k,2k,4k,8k,16k"
DEFAULT_DEPTHS = "0,0.25,0.5,0.75,1"
MAX_DIGITS = 18  # numbers drawn as int64


# --------------------------------------------------------------------------- prompts


class Contexts:
    """Prompts of exactly L tokens with a needle at depth d (a fraction of the haystack), for one tokenizer and
    haystack text; the bos prefix, haystack tokens and sentence ends are ``eval.niah.run.PromptBuilder``'s."""

    def __init__(self, tokenizer, haystack_text: str):
        self.niah = PromptBuilder(tokenizer, haystack_text)
        self.prefix = self.niah.prefix

    def encode(self, text: str) -> list[int]:
        return self.niah.encode(text)

    def encode_with(self, template: str, slot: str, answer: list[int], **fields) -> list[int]:
        """``template`` tokenized with each ``" {slot}"`` replaced by the ``answer`` token ids (the other fields
        formatted in first)."""
        parts = template.split(" {" + slot + "}")
        ids = self.encode(parts[0].format(**fields))
        for part in parts[1:]:
            ids += answer + self.encode(part.format(**fields))
        return ids

    def place(self, length: int, depth: float, head: list[int], needle: list[int], query: list[int]) -> dict:
        """``[bos] + head + haystack[:p] + needle + haystack[p:n] + query`` as ``"with"`` (``length`` token ids)
        and the control ``"without"`` (the needle's span filled with the haystack tokens after haystack[:n]);
        ``needle_start``/``needle_end`` delimit the span, ``needle_depth`` = p / n, ``haystack_tokens`` = n."""
        n = length - len(self.prefix) - len(head) - len(needle) - len(query)
        if n < 1:
            raise ValueError(f"--lengths: {length} is too short: bos, instructions, needle and question alone take "
                             f"{length - n} tokens, and the haystack needs at least one")
        hay = self.niah.haystack_tokens(n + len(needle))
        pos = n if depth >= 1 else int(n * depth)
        while 0 < pos < n and hay[pos - 1] not in self.niah.sentence_ends:
            pos -= 1  # back off to a sentence boundary, as NIAH does
        before, after = self.prefix + head + hay[:pos], hay[pos:n] + query
        start = len(before)
        return {"with": before + needle + after, "without": before + hay[n:n + len(needle)] + after,
                "needle_start": start, "needle_end": start + len(needle), "needle_depth": pos / n,
                "haystack_tokens": n}


def needle_draw(seed: int, trial: int) -> tuple[str, int]:
    """(key word, 7-digit value) of one trial of the needle probe."""
    rng = np.random.default_rng([seed, 0, trial])
    return KEY_WORDS[int(rng.integers(len(KEY_WORDS)))], int(rng.integers(10 ** (VALUE_DIGITS - 1), 10 ** VALUE_DIGITS))


def draw_passkeys(rng: np.random.Generator, digits: int, distractors: int, n_tokens) -> list[str]:
    """``[key, *distractors]``: distinct numbers of ``digits`` digits (no leading zero); the distractors have as
    many tokens as the key (``n_tokens(number) -> int``). ValueError when too few such numbers turn up."""
    lo, hi = 10 ** (digits - 1), 10 ** digits
    key = str(int(rng.integers(lo, hi)))
    want, out = n_tokens(key), [key]
    for _ in range(1000 + 100 * distractors):  # bounded: few numbers may share the key's token count
        if len(out) > distractors:
            break
        x = str(int(rng.integers(lo, hi)))
        if x not in out and n_tokens(x) == want:
            out.append(x)
    if len(out) <= distractors:
        raise ValueError(f"--distractors {distractors}: only {len(out) - 1} other {digits}-digit numbers tokenize "
                         f"into as many tokens ({want}) as the pass key {key}; lower --distractors or change "
                         f"--passkey-digits")
    return out


def passkey_draws(ctx: Contexts, seed: int, trials: int, digits: int, distractors: int) -> list[list[str]]:
    """The passkeys (key first) of every trial."""
    def n_tokens(x):
        return len(ctx.encode(f" {x}"))

    return [draw_passkeys(np.random.default_rng([seed, 1, t]), digits, distractors, n_tokens) for t in range(trials)]


def needle_cell(ctx: Contexts, length: int, depth: float, draws: list[tuple[str, int]]) -> list[dict]:
    """One item per trial: ``place``'s prompts plus ``answer`` (the value's token ids), ``key``, ``value``."""
    items = []
    for key, value in draws:
        answer = ctx.encode(f" {value}")
        needle = ctx.encode_with(NEEDLE, "value", answer, key=key)
        placed = ctx.place(length, depth, [], needle, ctx.encode(QUERY.format(key=key)))
        items.append({**placed, "answer": answer, "key": key, "value": value})
    return items


def passkey_cell(ctx: Contexts, length: int, depth: float, draws: list[list[str]]) -> list[dict]:
    """One item per trial: ``prompt`` (``length`` token ids), ``candidates`` (token ids, the key's first),
    ``passkeys``, and ``place``'s needle position."""
    head, query = ctx.encode(PASSKEY_HEAD), ctx.encode(PASSKEY_QUERY)
    items = []
    for keys in draws:
        candidates = [ctx.encode(f" {x}") for x in keys]
        placed = ctx.place(length, depth, head, ctx.encode_with(PASSKEY_NEEDLE, "key", candidates[0]), query)
        placed.pop("without")
        items.append({**placed, "prompt": placed.pop("with"), "candidates": candidates, "passkeys": keys})
    return items


# --------------------------------------------------------------------------- scoring


def decoder(model):
    """The ``DecoderLM`` of a ``FoXForCausalLM`` (or the ``DecoderLM`` itself)."""
    return getattr(model, "model", model)


@torch.no_grad()
def answer_logprobs(model, rows: list[list[int]], answer_lengths: list[int]) -> list[float]:
    """Total log-probability of the last ``answer_lengths[i]`` tokens of ``rows[i]`` given the tokens before them:
    one forward of the rows right-padded to the longest (causal: no real position sees the padding); the LM head
    runs only at the positions that predict answer tokens (B rows → B floats)."""
    lm = decoder(model)
    ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.int64)  # (B, T); pad id 0 is never scored
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
    ids = ids.to(lm.embed.weight.device)
    h = lm.hidden_states(ids)  # (B, T, d_model)
    out = []
    for i, (row, m) in enumerate(zip(rows, answer_lengths)):
        n = len(row)
        logp = lm.lm_head(h[i, n - m - 1:n - 1]).float().log_softmax(-1)  # (m, V)
        out.append(float(logp.gather(-1, ids[i, n - m:n, None]).sum()))
    return out


@torch.no_grad()
def candidate_logprobs(model, prompts: list[list[int]], candidates: list[list[list[int]]]) -> list[list[float]]:
    """Total log-probability of each candidate after its prompt: ``prompts`` P token lists of one length,
    ``candidates[i]`` C token lists (C the same for every prompt) → P lists of C floats. The prompts are prefilled
    once into a ``FoXCache`` (``model`` a ``FoXForCausalLM``), the cache is repeated C times, and the candidates
    are fed one token per step, right-padded to the longest (a row's padding comes after its last scored token)."""
    device = decoder(model).embed.weight.device
    C = len(candidates[0])
    out = model(input_ids=torch.tensor(prompts, device=device), use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    cache.batch_repeat_interleave(C)  # row i * C + j: prompt i, candidate j
    rows = [c for cands in candidates for c in cands]
    lengths = torch.tensor([len(r) for r in rows], device=device)  # (P*C,)
    ids = torch.zeros(len(rows), int(lengths.max()), dtype=torch.int64)  # (P*C, M)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
    ids = ids.to(device)
    logp = out.logits[:, -1].float().log_softmax(-1).repeat_interleave(C, dim=0)  # (P*C, V)
    total = torch.zeros(len(rows), dtype=torch.float64, device=device)
    for j in range(ids.shape[1]):
        if j:
            logp = model(input_ids=ids[:, j - 1:j], cache=cache).logits[:, -1].float().log_softmax(-1)
        step = logp.gather(1, ids[:, j:j + 1]).squeeze(1).double()  # (P*C,)
        total += torch.where(j < lengths, step, torch.zeros_like(step))
    return total.view(len(prompts), C).tolist()


def score_needle(model, items: list[dict], batch_size: int, bar=None) -> list[float]:
    """The gain of each item (nats per answer token), its two rows scored ``batch_size`` rows per forward;
    ``bar`` (a ``Progress``) counts the items done and names the batch that runs."""
    rows = [it[kind] + it["answer"] for it in items for kind in ("with", "without")]
    tails = [len(it["answer"]) for it in items for _ in range(2)]
    logps: list[float] = []
    for s in range(0, len(rows), batch_size):
        part, done = rows[s:s + batch_size], len(logps) // 2  # items whose two rows are scored
        if bar is not None:
            bar.working_on(f"needle gain: {len(part)} rows of up to {max(map(len, part)):,} tokens")
        logps += answer_logprobs(model, part, tails[s:s + batch_size])
        if bar is not None:
            bar.update(len(logps) // 2 - done)
    return [(a - b) / len(it["answer"]) for it, a, b in zip(items, logps[::2], logps[1::2])]


def score_passkey(model, items: list[dict], batch_size: int, bar=None) -> list[list[float]]:
    """The candidates' total log-probabilities of each item (prompts of one length), ``batch_size // (K+1)``
    prompts (at least one) per prefill, so a candidate step runs at most max(batch_size, K+1) rows."""
    per = max(1, batch_size // len(items[0]["candidates"]))
    scores: list[list[float]] = []
    for s in range(0, len(items), per):
        part = items[s:s + per]
        if bar is not None:
            bar.working_on(f"passkey: {len(part)} prompts of {len(part[0]['prompt']):,} tokens × "
                           f"{len(part[0]['candidates'])} candidates")
        scores += candidate_logprobs(model, [it["prompt"] for it in part], [it["candidates"] for it in part])
        if bar is not None:
            bar.update(len(part))
    return scores


# --------------------------------------------------------------------------- statistics


def t_interval(values: list[float]) -> list[float] | None:
    """95% t interval of the mean (None for a single value)."""
    ci = paired_interval(values)
    return None if ci is None else [ci[1], ci[2]]


def needle_stats(gains: list[float]) -> dict:
    """Mean gain (95% t interval) and fraction of gains > 0 (95% Wilson interval) over ``gains``."""
    positive = sum(g > 0 for g in gains)
    return {"trials": len(gains), "mean_gain": float(np.mean(gains)), "mean_gain_ci": t_interval(gains),
            "fraction_positive": positive / len(gains), "fraction_positive_ci": wilson(positive, len(gains))}


def rank_of(scores: list[float]) -> int:
    """1-based rank of ``scores[0]`` (the key) among all: ties count against the key, so a scorer that cannot tell
    the candidates apart ranks it last."""
    return 1 + sum(s >= scores[0] for s in scores[1:])


def passkey_stats(ranks: list[int]) -> dict:
    """Accuracy (rank 1) and mean reciprocal rank of the key's ``ranks``, with 95% intervals."""
    hits, rr = sum(r == 1 for r in ranks), [1 / r for r in ranks]
    return {"trials": len(ranks), "accuracy": hits / len(ranks), "accuracy_ci": wilson(hits, len(ranks)),
            "mrr": float(np.mean(rr)), "mrr_ci": t_interval(rr)}


def overall(stats: dict) -> dict:
    """Statistics pooled over the cells, without intervals: the cells share their trials' keys, so their trials
    are not independent draws."""
    return {k: v for k, v in stats.items() if not k.endswith("_ci")}


def passkey_chance(candidates: int) -> dict:
    """Accuracy and MRR of ranking ``candidates`` candidates at random."""
    return {"accuracy": 1 / candidates, "mrr": sum(1 / r for r in range(1, candidates + 1)) / candidates}


# --------------------------------------------------------------------------- evaluation


def mean_depth(items: list[dict]) -> float:
    """The needle's mean relative position in the haystack over a cell's trials (after the back-off)."""
    return float(np.mean([it["needle_depth"] for it in items]))


def run_cells(model, ctx: Contexts, cells: list[tuple[int, float]], needle: list, passkey: list, batch_size: int,
              bar) -> tuple[list[dict], list[dict]]:
    """Both probes' statistics per cell (grid order); ``needle``/``passkey``: the trials' draws."""
    from forgetting_transformer.ops.options import use_options

    needle_cells, passkey_cells = [], []
    # the fixed kernel configs: rows of a few tokens more or less would each autotune anew
    with use_options(autotune=False):
        for L, d in cells:
            items = needle_cell(ctx, L, d, needle)
            gains = score_needle(model, items, batch_size, bar)
            needle_cells.append({"length": L, "depth": d, "needle_depth": mean_depth(items),
                                 "answer_tokens": float(np.mean([len(it["answer"]) for it in items])),
                                 **needle_stats(gains), "gains": gains})
            items = passkey_cell(ctx, L, d, passkey)
            ranks = [rank_of(s) for s in score_passkey(model, items, batch_size, bar)]
            passkey_cells.append({"length": L, "depth": d, "needle_depth": mean_depth(items),
                                  **passkey_stats(ranks), "ranks": ranks})
    return needle_cells, passkey_cells


def model_dtype(dtype: str, device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 elsewhere (the generation-based evaluations' rule)."""
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return DTYPES[dtype]


def evaluate(run, out_dir, *, lengths: list[int], depths: list[float], trials: int = 20, seed: int = 0,
             haystack: str | None = None, distractors: int = 9, digits: int = 5, batch_size: int = 8,
             device: str = "cpu", dtype: str = "auto", step: int | None = None, tokenizer: str | None = None,
             command: str | None = None, progress: bool = True) -> Path:
    """Both probes over every (length, depth) cell of one model: writes the JSON file and the two heatmaps under
    ``out_dir`` and returns the JSON's path."""
    from forgetting_transformer.training.progress import Progress, heartbeat

    model, tok, info = load_model_and_tokenizer(run, step=step, tokenizer=tokenizer, device=device)
    model = model.to(model_dtype(dtype, device))
    ctx = Contexts(tok, read_haystack(haystack))
    needle = [needle_draw(seed, t) for t in range(trials)]
    passkey = passkey_draws(ctx, seed, trials, digits, distractors)
    # a length too short for the prompts fails here, before any scoring
    needle_cell(ctx, min(lengths), 0, needle[:1])
    passkey_cell(ctx, min(lengths), 0, passkey[:1])
    cells = [(L, d) for L in lengths for d in depths]
    stem = Path(run).resolve().name
    with Progress(2 * len(cells) * trials, f"retrieval {stem}", "trial", enabled=progress) as bar, heartbeat(bar):
        needle_cells, passkey_cells = run_cells(model, ctx, cells, needle, passkey, batch_size, bar)
    result = {
        "name": f"{info['name']} ({stem})", "model": str(run), "source": info["source"], "train_len": info["train_len"],
        "command": command, "seed": seed, "trials": trials, "lengths": lengths, "depths": depths,
        "haystack": str(haystack) if haystack else "embedded:gutenberg_sample",
        "dtype": str(model_dtype(dtype, device)).removeprefix("torch."),
        **probe_sections(needle_cells, passkey_cells, digits, distractors),
    }
    return write_outputs(result, Path(out_dir), stem)


def probe_sections(needle_cells: list[dict], passkey_cells: list[dict], digits: int, distractors: int) -> dict:
    """The JSON's ``needle_gain`` and ``passkey`` sections: each probe's prompts, chance level, pooled statistics
    and cells."""
    gains, ranks = [g for c in needle_cells for g in c["gains"]], [r for c in passkey_cells for r in c["ranks"]]
    return {
        "needle_gain": {"needle": NEEDLE, "query": QUERY, "value_digits": VALUE_DIGITS, "keys": list(KEY_WORDS),
                        "unit": "nats per answer token", "chance": {"mean_gain": 0.0, "fraction_positive": 0.5},
                        "overall": overall(needle_stats(gains)), "cells": needle_cells},
        "passkey": {"head": PASSKEY_HEAD, "needle": PASSKEY_NEEDLE, "query": PASSKEY_QUERY, "digits": digits,
                    "distractors": distractors, "chance": passkey_chance(distractors + 1),
                    "overall": overall(passkey_stats(ranks)), "cells": passkey_cells},
    }


def write_outputs(result: dict, out_dir: Path, stem: str) -> Path:
    """The JSON file, both heatmaps and one summary line on stdout."""
    from eval.retrieval.plot import plot_probe

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}_retrieval.json"
    path.write_text(json.dumps(result, indent=1))
    for probe in ("needle_gain", "passkey"):
        plot_probe([path], probe, out_dir / f"{stem}_{probe}.png")
    g, p = result["needle_gain"]["overall"], result["passkey"]["overall"]
    chance = result["passkey"]["chance"]
    print(f"{result['name']}: needle gain {g['mean_gain']:+.4f} nats per answer token (> 0 in "
          f"{g['fraction_positive']:.0%} of trials; 0 without retrieval); passkey accuracy {p['accuracy']:.3f} "
          f"(chance {chance['accuracy']:.3f}), MRR {p['mrr']:.3f} (chance {chance['mrr']:.3f}); "
          f"{len(result['lengths']) * len(result['depths'])} cells × {result['trials']} trials → {path}")
    return path


# --------------------------------------------------------------------------- command line


class Parser(argparse.ArgumentParser):
    """argparse whose errors are raised as ValueError: ``run_cli`` prints them as one line ``error: ...`` without
    argparse's usage block."""

    def error(self, message):
        raise ValueError(message)


def parse_depth(text: str) -> float:
    value = float(text)
    return int(value) if value.is_integer() else value


def make_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m eval.retrieval.run", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a training run directory (train.py) or a Hugging Face directory "
                                                "(scripts/export_hf.py)")
    p.add_argument("--out", required=True, type=Path, help="directory for the JSON file and the two heatmaps")
    p.add_argument("--haystack", default=None,
                   help="directory of .txt files (sorted order) or a .txt/.jsonl file, read as eval.niah reads it "
                        "(default: the embedded Gutenberg corpus)")
    p.add_argument("--lengths", default=DEFAULT_LENGTHS,
                   help=f"prompt lengths in tokens, comma-separated, 'k' = 1024 (default {DEFAULT_LENGTHS})")
    p.add_argument("--depths", default=DEFAULT_DEPTHS,
                   help=f"needle depths as fractions of the haystack in [0, 1], comma-separated (default "
                        f"{DEFAULT_DEPTHS})")
    p.add_argument("--trials", type=positive_int, default=20,
                   help="keys and values (passkeys) per cell, the same in every cell (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the trials' draws (default 0)")
    p.add_argument("--distractors", type=positive_int, default=9,
                   help="K wrong passkeys ranked against the right one (default 9: chance accuracy 0.1)")
    p.add_argument("--passkey-digits", type=positive_int, default=5,
                   help=f"digits of every passkey, at most {MAX_DIGITS} (default 5)")
    p.add_argument("--batch-size", type=positive_int, default=8,
                   help="rows per forward: needle-probe rows, or passkey prompts times their K+1 candidates "
                        "(default 8)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="model weights (default auto: bfloat16 on CUDA, float32 elsewhere); log-softmax in float32")
    p.add_argument("--step", type=positive_int, default=None, help="checkpoint step of a run dir (default: latest)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json or HF tokenizer dir (default: the model's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="default: cuda when available, else cpu")
    return p


def check_args(a: argparse.Namespace) -> tuple[list[int], list[float]]:
    """The grid parsed and every flag value checked, before the model loads → (lengths, depths)."""
    if not Path(a.run).is_dir():
        raise FileNotFoundError(f"--run: {a.run} is not a directory")
    if a.haystack is not None and not Path(a.haystack).exists():
        raise FileNotFoundError(f"--haystack: {a.haystack} not found")
    if a.passkey_digits > MAX_DIGITS:
        raise ValueError(f"--passkey-digits: {a.passkey_digits} is outside [1, {MAX_DIGITS}]")
    pool = 9 * 10 ** (a.passkey_digits - 1) - 1  # numbers of that many digits, the key's left out
    if a.distractors > pool:
        raise ValueError(f"--distractors: {a.distractors} is more than the {pool} other {a.passkey_digits}-digit "
                         f"numbers")
    lengths = parse_list(a.lengths, "--lengths", lambda s: parse_lengths(s)[0], lambda v: v >= 1, "[1, inf)",
                         unique=True)
    depths = parse_list(a.depths, "--depths", parse_depth, lambda v: 0 <= v <= 1,
                        "[0, 1] (fractions of the haystack: 0.5 is the middle)", unique=True)
    return lengths, depths


def main(argv=None) -> Path:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = make_parser().parse_args(argv)
    lengths, depths = check_args(a)
    return evaluate(a.run, a.out, lengths=lengths, depths=depths, trials=a.trials, seed=a.seed,
                    haystack=a.haystack, distractors=a.distractors, digits=a.passkey_digits,
                    batch_size=a.batch_size, device=a.device, dtype=a.dtype, step=a.step, tokenizer=a.tokenizer,
                    command=shlex.join(["python", "-m", "eval.retrieval.run", *argv]))


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
