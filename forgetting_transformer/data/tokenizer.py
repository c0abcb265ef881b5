"""The tokenizer of a data directory: a byte-level BPE trained on the train documents, or one loaded (GPT-2, a
tokenizer.json), and the fingerprint that says whether two tokenizers map text to the same ids."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .progress import ProgressLine, heartbeat, size_text

__all__ = ["EOT", "train_bpe", "load_tokenizer", "tokenizer_fingerprint"]

EOT = "<|endoftext|>"


def _bpe_trainer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # the library's bar draws only on a terminal; ProgressLine reports instead
    )
    return tok, trainer


def train_bpe(texts: list[str], vocab_size: int, progress: bool = True, *, stream=None):
    """A byte-level BPE (the 256 byte symbols + ``<|endoftext|>``, ``vocab_size`` tokens) trained on ``texts``.

    With ``progress``: a line when training starts (documents, bytes, vocab size), a progress line at least
    every ``FOX_PROGRESS_SECONDS`` (documents handed to the trainer, then the merges, which the library computes
    without reporting: the line then says so with the elapsed time), and a line when it ends."""
    tok, trainer = _bpe_trainer(vocab_size)
    sizes = [len(t.encode("utf-8")) for t in texts]  # bytes per document, for the lines only
    total = size_text(sum(sizes))
    fed_bytes = 0

    def detail() -> str:
        if bar.n < len(texts):
            return f"{size_text(fed_bytes)} of {total}"
        return f"all {total} read; computing merges toward vocab_size={vocab_size:,}"

    # no ETA: after the documents are read, the merges take most of the time
    bar = ProgressLine("training BPE", "docs", len(texts), enabled=progress, stream=stream, detail=detail, eta=False)

    def feed():
        nonlocal fed_bytes
        for text, size in zip(texts, sizes):
            yield text
            fed_bytes += size
            bar.update()

    bar.say(f"training byte-level BPE (vocab_size={vocab_size:,}) on {len(texts):,} train documents ({total})")
    with heartbeat(bar):
        tok.train_from_iterator(feed(), trainer=trainer, length=len(texts))
    bar.close(f"trained byte-level BPE: {tok.get_vocab_size():,} tokens from {len(texts):,} documents ({total}) "
              f"in {bar.elapsed():.1f} s")
    return tok


def load_tokenizer(spec: str):
    """``gpt2`` (downloaded), a tokenizer.json file, or a directory holding one."""
    from tokenizers import Tokenizer

    if spec == "gpt2":
        return Tokenizer.from_pretrained("gpt2")
    p = Path(spec)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise FileNotFoundError(
            f"tokenizer {spec!r}: expected 'train-bpe', 'gpt2', a tokenizer.json file or a "
            f"directory containing one; {p} does not exist"
        )
    return Tokenizer.from_file(str(p))


def tokenizer_fingerprint(path) -> str:
    """A short hash of what a tokenizer maps text to: its vocabulary (token → id, sorted) and its BPE merges, read
    with ``tokenizers`` so that a tokenizer.json re-saved by another tool (a Hugging Face export) hashes the same.
    Two data dirs, or a model and a data dir, agree on token ids exactly when their fingerprints agree."""
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    vocab = sorted((model.get("vocab") or {}).items(), key=lambda kv: kv[1])
    added = sorted((t["id"], t["content"]) for t in spec.get("added_tokens") or [])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    blob = json.dumps({"type": model.get("type"), "vocab": vocab, "added": added, "merges": merges},
                      ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
