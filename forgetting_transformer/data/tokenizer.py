"""The tokenizer of a data directory: a byte-level BPE trained on the train documents, or one loaded (GPT-2, a
tokenizer.json), the text escape applied to every document before it is tokenized, and the fingerprint that says
whether two tokenizers map text to the same ids."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from .progress import ProgressLine, heartbeat, size_text

__all__ = ["EOT", "TEXT_ESCAPES", "text_escape_name", "json_escape", "json_unescape", "escape_text", "unescape_text",
           "train_bpe", "load_tokenizer", "tokenizer_fingerprint"]

EOT = "<|endoftext|>"
# How a document's text is escaped before BPE (data.text_escape, meta.json's text_escape): "none" keeps it as it
# is; "json" is LongCrawl64's convention, json.dumps(text)[1:-1], so GPT-2 ids of LongCrawl64 are ids of escaped text.
TEXT_ESCAPES = ("none", "json")
_SURROGATE = re.compile("[\ud800-\udfff]")


def text_escape_name(value, where: str = "text_escape") -> str:
    """``value`` (a string or the config's ``TextEscape`` member) as one of ``TEXT_ESCAPES``; anything else is a
    ``ValueError`` naming ``where`` (the key or file it came from)."""
    name = getattr(value, "value", value)
    if name not in TEXT_ESCAPES:
        raise ValueError(f"{where}={value!r}: expected one of {', '.join(TEXT_ESCAPES)}")
    return name


def json_escape(text: str) -> str:
    r"""LongCrawl64's escape: the body of the JSON string literal of ``text`` (``json.dumps(text)[1:-1]``, ASCII
    only). A newline becomes the two characters ``\n``, a tab ``\t``, a quote ``\"``, a backslash ``\\``, other
    control characters and every non-ASCII character ``\uXXXX`` (UTF-16 code units, so an emoji takes two)::

        json_escape('say "hi"\n')  -> r'say \"hi\"\n'      (12 characters)
        json_escape("é漢")          -> r'\u00e9\u6f22'
    """
    return json.dumps(text)[1:-1]


def json_unescape(text: str) -> str:
    r"""The inverse of :func:`json_escape`, as the official FoX tokenizer decodes: ``json.loads('"' + text + '"')``,
    or, when that fails (an escape cut off at the end of a generation, a bare quote or control character the
    model produced), the best effort ``text.encode().decode("unicode_escape", "ignore")``, which drops the broken
    escapes. Half of a surrogate pair (an emoji cut after its first ``\uXXXX``) becomes U+FFFD, so the result can
    always be written as UTF-8::

        json_unescape(r'say \"hi\"\n')  -> 'say "hi"\n'
        json_unescape(r'abc\u00')       -> 'abc'           (cut-off escape: the fallback)
        json_unescape(r'ok \ud83d')     -> 'ok \ufffd'
    """
    try:
        out = json.loads(f'"{text}"')
    except json.JSONDecodeError:
        out = text.encode().decode("unicode_escape", "ignore")
    if _SURROGATE.search(out):  # pairs the fallback left apart are joined, lone halves replaced
        out = out.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return out


def escape_text(text: str, mode: str) -> str:
    """``text`` as the tokenizer of a ``text_escape=mode`` model or data dir sees it (``"none"``: unchanged)."""
    return json_escape(text) if text_escape_name(mode) == "json" else text


def unescape_text(text: str, mode: str) -> str:
    """A decoded token string back to text (``"none"``: unchanged); see :func:`json_unescape`."""
    return json_unescape(text) if text_escape_name(mode) == "json" else text


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


def tokenizer_fingerprint(path, text_escape: str = "none") -> str:
    """A short hash of what a tokenizer maps text to: its vocabulary (token → id, sorted), its BPE merges and the
    text escape applied before it (``text_escape``; ``"none"`` adds nothing, so plain fingerprints stay those of
    the vocabulary and merges alone), read from the tokenizer.json at ``path`` so that one re-saved by another
    tool (a Hugging Face export) hashes the same. Two data dirs, or a model and a data dir, agree on token ids
    exactly when their fingerprints agree."""
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    vocab = sorted((model.get("vocab") or {}).items(), key=lambda kv: kv[1])
    added = sorted((t["id"], t["content"]) for t in spec.get("added_tokens") or [])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    identity = {"type": model.get("type"), "vocab": vocab, "added": added, "merges": merges}
    if text_escape_name(text_escape) != "none":
        identity["text_escape"] = text_escape
    blob = json.dumps(identity, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
