"""Needle-in-a-haystack (NIAH): can the model retrieve one sentence hidden at a given depth of a long text?

    python -m eval.niah.run RUN_OR_HF_DIR [...] --out results/niah [--mode standard|easy]
        [--lengths 1k,2k,4k,8k,16k,32k] [--depths 0,10,...,100] [--haystack DIR_OR_FILE]
        [--max-new-tokens 32] [--judge MODULE:FUNC] [--device cuda] [--batch-size 8] [--max-batch-tokens N]
        [--dtype auto|float32|bfloat16] [--prefill-chunk N] [--acp-eviction]

Protocol (FoX, Lin et al. 2025, after gkamradt/LLMTest_NeedleInAHaystack and THUDM LongAlign). For each context
length L and depth d (percent) one prompt of exactly L tokens (bos included) is built, token by token:

    [bos] + haystack[:p] + NEEDLE + haystack[p:n] + QUERY

* ``n = L - |bos| - |NEEDLE| - |QUERY|``: the haystack is cut to n tokens (it is repeated when shorter).
* ``p = int(n * d / 100)`` backed off to just after the previous sentence end (a token whose text ends in '.'),
  as the reference implementations do; ``p = n`` for d = 100, ``p = 0`` when no sentence end precedes it.
* ``NEEDLE`` (between newlines, as in the FoX configs):
    standard: "\\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\\n"
    easy (Qin et al. 2024): "\\nWhat is the best thing to do in San Francisco? Answer: The best thing to do in
          San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\\n"
* ``QUERY`` (``PROMPT_SUFFIX``; the user turn of FoX's ``eval/niah`` with no chat template, ending in the answer
  prefix so a base model just continues it):
    "\\n\\nThere is an important piece of information hidden inside the above document. Now that you've read the
     document, I will quiz you about it. Answer the following question: What is the best thing to do in San
     Francisco? Answer: The best thing to do in San Francisco is"

The prompt is fed as token ids, so its length is exact; decoding it and re-tokenizing gives the same length up to
a few merges at the segment boundaries. Generation is greedy (``max_new_tokens``, default 32, stops at eos). All
prompts are built first and decoded in left-padded batches of similar lengths (``--batch-size``; see
docs/niah.md), which gives the predictions of decoding each prompt alone.

Score (deterministic, 1-10): recall r of the key words of the needle's answer phrase ("eat a sandwich and sit in
Dolores Park on a sunny day" without the stop words a/and/in/on: eat, sandwich, sit, dolores, park, sunny, day)
among the generated words (lower-cased, punctuation dropped): ``score = 1 + 9 r``, so the whole phrase → 10,
none of it → 1. ``--judge MODULE:FUNC`` replaces it: ``FUNC(prediction=..., question=..., needle=...)`` must
return a number in [1, 10] (e.g. an LLM judge as in FoX's ``eval/niah/eval.py``); the recall score is kept too.
The scale is printed with every mean score and recorded in the JSON (``scale``): 1 is its floor, not a perfect
score.

Output: ``<out>/<model dir>_<mode>.json`` per model (one entry per (length, depth)) and ``<out>/niah_<mode>.png``
(re-plot with ``python -m eval.niah.plot``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
from pathlib import Path

import torch

from eval.cli import add_generation_args, positive_int
from eval.common import GenerationOptions, generate_texts, load_model_and_tokenizer, prepare_for_generation

NEEDLE_ANSWER = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
QUESTION = "What is the best thing to do in San Francisco?"
ANSWER_PREFIX = "Answer: The best thing to do in San Francisco is"
NEEDLES = {
    "standard": f"\n{NEEDLE_ANSWER}\n",
    "easy": f"\n{QUESTION} Answer: {NEEDLE_ANSWER}\n",
}
RETRIEVAL_QUESTION = f"{QUESTION} {ANSWER_PREFIX}"
PROMPT_SUFFIX = ("\n\nThere is an important piece of information hidden inside the above document. Now that you've "
                 f"read the document, I will quiz you about it. Answer the following question: {RETRIEVAL_QUESTION}")
KEY_PHRASE = "eat a sandwich and sit in Dolores Park on a sunny day"
STOP_WORDS = frozenset({"a", "and", "in", "on"})
KEY_WORDS = tuple(w for w in re.findall(r"[a-z0-9]+", KEY_PHRASE.lower()) if w not in STOP_WORDS)
RECALL_SCALE = f"1–10 (1: none of the answer's {len(KEY_WORDS)} key words, 10: all of them)"
DEFAULT_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
DEFAULT_DEPTHS = tuple(range(0, 101, 10))


# --------------------------------------------------------------------------- scoring


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def recall(prediction: str) -> float:
    """Fraction of ``KEY_WORDS`` that occur in ``prediction`` (case and punctuation ignored)."""
    found = set(words(prediction))
    return sum(w in found for w in KEY_WORDS) / len(KEY_WORDS)


def score_answer(prediction: str) -> float:
    """1 + 9 × recall: 10 when the whole key phrase is there, 1 when none of its key words is."""
    return 1.0 + 9.0 * recall(prediction)


def score_scale(judge: str | None) -> str:
    """What the scores mean, printed and recorded beside them: the recall scale, or the judge's."""
    return f"1–10 (scored by the judge {judge}; 1: worst, 10: best)" if judge else RECALL_SCALE


def load_judge(spec: str | None):
    """``"package.module:function"`` → the function (None → None)."""
    if not spec:
        return None
    mod, sep, func = spec.partition(":")
    if not sep or not mod or not func:
        raise ValueError(f"--judge {spec!r}: expected MODULE:FUNC")
    fn = getattr(importlib.import_module(mod), func, None)
    if not callable(fn):
        raise ValueError(f"--judge {spec!r}: {mod} has no callable {func}")
    return fn


def judge_score(judge, prediction: str, mode: str) -> float:
    s = float(judge(prediction=prediction, question=RETRIEVAL_QUESTION, needle=NEEDLES[mode].strip()))
    if not 1.0 <= s <= 10.0:
        raise ValueError(f"judge returned {s}: scores must lie in [1, 10]")
    return s


# --------------------------------------------------------------------------- haystack and prompts


def read_haystack(source: str | Path | None = None) -> str:
    """The haystack text. None: the embedded Gutenberg corpus (boilerplate stripped, books joined by blank lines).
    A directory: its ``*.txt`` files (not recursive) concatenated in sorted name order, as the reference reads the
    Paul Graham essays (``glob('*.txt')``, sorted here for reproducibility). A file: ``.txt`` as is; ``.jsonl``
    (``.xz``/``.gz``) documents joined by blank lines."""
    from forgetting_transformer.data.prepare import EMBEDDED_CORPUS, iter_documents, strip_gutenberg_boilerplate

    if source is None:
        return "\n\n".join(strip_gutenberg_boilerplate(t) for _, t in iter_documents([str(EMBEDDED_CORPUS)]))
    p = Path(source)
    if p.is_dir():
        files = sorted(p.glob("*.txt"))
        if not files:
            raise ValueError(f"haystack directory {p} holds no .txt files")
        return "".join(f.read_text(encoding="utf-8") for f in files)
    if p.is_file():
        if p.suffix == ".txt":
            return p.read_text(encoding="utf-8")
        return "\n\n".join(t for _, t in iter_documents([str(p)]))
    raise FileNotFoundError(f"haystack {p} not found")


class PromptBuilder:
    """Builds NIAH prompts as token ids for one tokenizer, haystack and mode (see the module docstring)."""

    def __init__(self, tokenizer, haystack_text: str, mode: str = "standard"):
        if mode not in NEEDLES:
            raise ValueError(f"mode {mode!r}: expected one of {sorted(NEEDLES)}")
        if not haystack_text.strip():
            raise ValueError("empty haystack")
        self.tok, self.mode = tokenizer, mode
        with_special = tokenizer(".", add_special_tokens=True)["input_ids"]
        plain = self.encode(".")
        self.prefix = with_special[:len(with_special) - len(plain)]  # bos (if the tokenizer prepends one)
        self.needle = self.encode(NEEDLES[mode])
        self.suffix = self.encode(PROMPT_SUFFIX)
        self.text = haystack_text
        self.haystack: list[int] = []  # tokens of a prefix of the text, extended on demand (see haystack_tokens)
        self._chars = 0
        vocab = range(len(tokenizer))
        self.sentence_ends = {i for i in vocab if tokenizer.decode([i]).rstrip().endswith(".")}

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    @property
    def overhead(self) -> int:
        return len(self.prefix) + len(self.needle) + len(self.suffix)

    def haystack_tokens(self, n: int) -> list[int]:
        """The first n haystack tokens (the text repeated when it is too short). Only as much text as needed is
        tokenized; a cut inside the text may split its last word, so a margin of tokens past n is required."""
        margin = 16
        while len(self.haystack) < n + margin and self._chars < len(self.text):
            self._chars = min(len(self.text), max(2 * self._chars, 8 * (n + margin), 4096))
            self.haystack = self.encode(self.text[:self._chars])
        if self._chars < len(self.text):
            return self.haystack[:n]
        reps = -(-n // len(self.haystack))
        return (self.haystack * reps)[:n]

    def build(self, length: int, depth: float) -> dict:
        """→ ``{"input_ids", "needle_start", "haystack_tokens"}`` with ``len(input_ids) == length``."""
        if not 0 <= depth <= 100:
            raise ValueError(f"depth {depth}: must lie in [0, 100]")
        n = length - self.overhead
        if n < 1:
            raise ValueError(f"length {length} is too short: the needle and question alone take {self.overhead} "
                             f"tokens")
        hay = self.haystack_tokens(n)
        pos = n if depth >= 100 else int(n * depth / 100)
        while pos > 0 and pos < n and hay[pos - 1] not in self.sentence_ends:
            pos -= 1  # back off to a sentence boundary, as the reference does
        ids = self.prefix + hay[:pos] + self.needle + hay[pos:] + self.suffix
        return {"input_ids": ids, "needle_start": len(self.prefix) + pos, "haystack_tokens": n}


# --------------------------------------------------------------------------- evaluation


def parse_lengths(s: str) -> list[int]:
    """"1k,2k,4096" → [1024, 2048, 4096] (k = 1024)."""
    out = []
    for part in s.split(","):
        part = part.strip().lower()
        out.append(int(float(part[:-1]) * 1024) if part.endswith("k") else int(part))
    return out


def parse_depths(s: str) -> list[float]:
    vals = [float(x) for x in s.split(",") if x.strip()]
    return [int(v) if v.is_integer() else v for v in vals]


def evaluate_model(path, out_dir, *, mode: str = "standard", lengths=DEFAULT_LENGTHS, depths=DEFAULT_DEPTHS,
                   haystack: str | None = None, max_new_tokens: int = 32, judge: str | None = None,
                   device: str = "cpu", step: int | None = None, tokenizer: str | None = None,
                   name: str | None = None, progress: bool = True,
                   generation: GenerationOptions | None = None) -> Path:
    """Score every (length, depth) cell of one model and write its JSON file. All prompts are built first, then
    decoded greedily in batches of similar lengths (``eval.common.generate_texts``; ``generation``: batch size,
    dtype, ...), which gives what decoding each prompt alone gives."""
    generation = generation or GenerationOptions()
    judge_fn = load_judge(judge)
    model, tok, info = load_model_and_tokenizer(path, step=step, tokenizer=tokenizer, device=device)
    model = prepare_for_generation(model, generation, device)
    builder = PromptBuilder(tok, read_haystack(haystack), mode)
    name = name or f"{info['name']} ({Path(path).resolve().name})"
    cells = [(L, d) for L in lengths for d in depths]
    prompts = [builder.build(L, d) for L, d in cells]
    preds = generate_texts(model, tok, [p["input_ids"] for p in prompts], max_new_tokens, generation,
                           desc=f"NIAH {mode} {Path(path).name}", unit="cell", progress=progress)
    results = []
    for (L, d), p, pred in zip(cells, prompts, preds):
        pred = pred.strip()
        r = recall(pred)
        entry = {"length": L, "depth": d, "prompt_tokens": len(p["input_ids"]), "needle_start": p["needle_start"],
                 "needle_depth": (p["needle_start"] - len(builder.prefix)) / p["haystack_tokens"],
                 "recall": r, "recall_score": 1.0 + 9.0 * r, "prediction": pred}
        entry["score"] = judge_score(judge_fn, pred, mode) if judge_fn else entry["recall_score"]
        results.append(entry)
    mean = sum(e["score"] for e in results) / len(results)
    out = Path(out_dir) / f"{Path(path).resolve().name}_{mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "name": name, "mode": mode, "source": info["source"], "train_len": info["train_len"],
        "haystack": str(haystack) if haystack else "embedded:gutenberg_sample", "needle": NEEDLES[mode],
        "prompt_suffix": PROMPT_SUFFIX, "key_words": list(KEY_WORDS), "max_new_tokens": max_new_tokens,
        "dtype": generation.dtype_name(device), "judge": judge, "scale": score_scale(judge), "mean_score": mean,
        "results": results}, indent=1))
    print(f"{name} [{mode}]: mean score {mean:.2f} on the scale {score_scale(judge)} over {len(results)} cells "
          f"→ {out}")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="run directories (train.py) or Hugging Face dirs (export_hf.py)")
    p.add_argument("--out", required=True, help="output directory for JSON files and the heatmap")
    p.add_argument("--mode", choices=sorted(NEEDLES), default="standard")
    p.add_argument("--lengths", type=parse_lengths, default=list(DEFAULT_LENGTHS),
                   help="prompt lengths in tokens, comma-separated, 'k' = 1024 (default 1k,2k,4k,8k,16k,32k)")
    p.add_argument("--depths", type=parse_depths, default=list(DEFAULT_DEPTHS),
                   help="needle depths in percent (default 0,10,...,100)")
    p.add_argument("--haystack", default=None,
                   help="directory of .txt files (sorted order; e.g. the Paul Graham essays) or a .txt/.jsonl file "
                        "(default: the embedded Gutenberg corpus)")
    p.add_argument("--max-new-tokens", type=positive_int, default=32)
    p.add_argument("--judge", default=None, help="MODULE:FUNC scoring each answer in [1, 10] (default: recall)")
    p.add_argument("--step", type=positive_int, default=None, help="checkpoint step of a run dir (default: latest)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json or HF tokenizer dir (default: the model's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_generation_args(p)
    a = p.parse_args(argv)
    generation = GenerationOptions.from_args(a)
    files = [evaluate_model(m, a.out, mode=a.mode, lengths=a.lengths, depths=a.depths, haystack=a.haystack,
                            max_new_tokens=a.max_new_tokens, judge=a.judge, device=a.device, step=a.step,
                            tokenizer=a.tokenizer, generation=generation) for m in a.models]
    from eval.niah.plot import plot_niah

    print(plot_niah(files, Path(a.out) / f"niah_{a.mode}.png"))


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
