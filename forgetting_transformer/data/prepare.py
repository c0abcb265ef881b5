"""Turn raw text into a LongCrawl64-format data directory.

Output layout (``out_dir``)::

    train.zarr       (num_train_rows, doc_len)   uint16 if vocab_size <= 65535 else uint32
    heldout.zarr     (num_heldout_rows, doc_len)
    tokenizer.json   the tokenizer the ids come from
    meta.json        vocab_size, bos_id, doc_len, tokenizer, text_escape, row/token/drop counts, settings
    documents.jsonl  one line per input document: split, source, tokens, first_row, rows, dropped

Each document is tokenized on its own (after the ``text_escape`` of ``tokenizer.py``: ``json`` tokenizes the
JSON-escaped text, as LongCrawl64 was) and cut into consecutive rows of ``doc_len`` tokens;
the final partial row is dropped and documents shorter than ``min_doc_tokens`` are dropped.
Both are counted in ``meta.json`` and the printed summary. No BOS token is stored: the reader
puts ``bos_id`` in front of every row.

This module runs the build (:func:`prepare_corpus`), makes it idempotent and atomic
(:func:`ensure_prepared`, :func:`ensure_data`) and measures the result (:func:`unigram_entropy`). The jobs
it runs live beside it: reading and splitting documents (``documents.py``), the tokenizer (``tokenizer.py``),
the rows and arrays (``writer.py``), each reporting progress through ``progress.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .documents import (EMBEDDED_CORPUS, expand_inputs, iter_documents, read_corpus, split_documents,
                        strip_gutenberg_boilerplate)
from .tokenizer import EOT, escape_text, load_tokenizer, text_escape_name, tokenizer_fingerprint, train_bpe
from .writer import format_summary, write_splits

__all__ = [
    "EMBEDDED_CORPUS",
    "tokenizer_fingerprint",
    "prepare_corpus",
    "ensure_prepared",
    "ensure_data",
    "unigram_entropy",
    "strip_gutenberg_boilerplate",
    "iter_documents",
    "format_summary",
]

FORMAT_VERSION = 1
CREATED_BY = "forgetting_transformer.data.prepare"  # in meta.json: marks a directory ensure_prepared may replace
_EMBEDDED_TAG = "embedded:gutenberg_sample.jsonl.xz"
_OUR_FILES = {"train.zarr", "heldout.zarr", "tokenizer.json", "meta.json", "documents.jsonl"}


# --------------------------------------------------------------------------- settings


def _input_record(p) -> str:
    p = Path(p)
    try:
        if p.resolve() == EMBEDDED_CORPUS:
            return _EMBEDDED_TAG
    except OSError:
        pass
    return str(p.resolve())


def _fingerprint(inputs) -> list:
    """Cheap change detector for the input files (size + mtime), so edited inputs rebuild."""
    out = []
    for f in expand_inputs(inputs or []):
        if f.resolve() == EMBEDDED_CORPUS:
            out.append([_EMBEDDED_TAG, f.stat().st_size])
        else:
            st = f.stat()
            out.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
    return out


def _tokenizer_record(tokenizer: str) -> str:
    """A loaded tokenizer by its file's content, so the same tokenizer.json at another path builds the same data
    (a missing file keeps its path: the build reports it)."""
    if tokenizer in ("train-bpe", "gpt2"):
        return tokenizer
    p = Path(tokenizer).resolve()
    f = p / "tokenizer.json" if p.is_dir() else p
    return f"sha256:{hashlib.sha256(f.read_bytes()).hexdigest()}" if f.is_file() else str(p)


def _settings(inputs, *, tokenizer, vocab_size, doc_len, min_doc_tokens, heldout_docs, text_key,
              strip_gutenberg, max_docs, hf_dataset, hf_split, seed, heldout_inputs=None,
              text_escape="none") -> dict[str, Any]:
    settings = {
        "format_version": FORMAT_VERSION,
        "inputs": [_input_record(p) for p in (inputs or [])],
        "input_files": _fingerprint(inputs),
        "tokenizer": _tokenizer_record(tokenizer),
        "vocab_size": int(vocab_size),
        "doc_len": int(doc_len),
        "min_doc_tokens": int(doc_len if min_doc_tokens is None else min_doc_tokens),
        "heldout_docs": int(heldout_docs),
        "text_key": text_key,
        "strip_gutenberg": bool(strip_gutenberg),
        "max_docs": None if max_docs is None else int(max_docs),
        "hf_dataset": hf_dataset,
        "hf_split": hf_split if hf_dataset else None,
        "seed": int(seed),
    }
    if heldout_inputs:  # these files are the held-out split (heldout_docs unused); all of inputs is train
        settings["heldout_inputs"] = [_input_record(p) for p in heldout_inputs]
        settings["heldout_files"] = _fingerprint(heldout_inputs)
    if text_escape_name(text_escape) != "none":  # only then: builds from before the option keep their settings
        settings["text_escape"] = text_escape_name(text_escape)
    return settings


def _validate_args(inputs, tokenizer, vocab_size, doc_len, min_doc_tokens, heldout_docs, max_docs,
                   hf_dataset, heldout_inputs=None):
    if not inputs and not hf_dataset:
        raise ValueError("no inputs given (pass text/jsonl files or directories, or hf_dataset)")
    if isinstance(inputs, (str, os.PathLike)):
        raise TypeError("inputs must be a list of paths, not a single path")
    if isinstance(heldout_inputs, (str, os.PathLike)):
        raise TypeError("heldout_inputs must be a list of paths, not a single path")
    if doc_len is None or int(doc_len) < 2:
        raise ValueError(f"doc_len must be >= 2, got {doc_len!r}")
    if min_doc_tokens is not None and int(min_doc_tokens) < 1:
        raise ValueError(f"min_doc_tokens must be >= 1, got {min_doc_tokens!r}")
    if int(heldout_docs) < 1:
        raise ValueError(f"heldout_docs must be >= 1, got {heldout_docs!r}")
    if max_docs is not None and int(max_docs) < 1:
        raise ValueError(f"max_docs must be >= 1, got {max_docs!r}")
    if tokenizer == "train-bpe" and int(vocab_size) < 258:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for a byte-level BPE "
            f"(256 byte symbols + {EOT} need >= 258)"
        )


# --------------------------------------------------------------------------- main entry


def prepare_corpus(inputs, out_dir, *, tokenizer: str = "train-bpe", vocab_size: int = 4096,
                   doc_len: int = 2048, min_doc_tokens: int | None = None, heldout_docs: int = 2,
                   text_key: str = "text", strip_gutenberg: bool = True, max_docs: int | None = None,
                   hf_dataset: str | None = None, hf_split: str = "train", seed: int = 0,
                   heldout_inputs=None, text_escape: str = "none", progress: bool = True,
                   _print_summary: bool = True) -> dict:
    """Build a LongCrawl64-format directory at ``out_dir`` (which must not exist or be empty)
    and return its meta dict. Prefer :func:`ensure_prepared`, which is idempotent and atomic.

    The held-out split is ``heldout_docs`` documents drawn by a seeded shuffle, or, with
    ``heldout_inputs`` (files or directories), exactly the documents of those files (then every
    document of ``inputs`` is train: a corpus whose split is fixed, e.g. by author). ``text_escape="json"``
    escapes every document as LongCrawl64 did (``json.dumps(text)[1:-1]``) before the BPE is trained and the
    documents tokenized; meta.json records the mode. With ``progress``, each long step prints progress lines on
    stderr and the summary ends the build."""
    _validate_args(inputs, tokenizer, vocab_size, doc_len, min_doc_tokens, heldout_docs, max_docs,
                   hf_dataset, heldout_inputs)
    settings = _settings(inputs, tokenizer=tokenizer, vocab_size=vocab_size, doc_len=doc_len,
                         min_doc_tokens=min_doc_tokens, heldout_docs=heldout_docs,
                         text_key=text_key, strip_gutenberg=strip_gutenberg, max_docs=max_docs,
                         hf_dataset=hf_dataset, hf_split=hf_split, seed=seed,
                         heldout_inputs=heldout_inputs, text_escape=text_escape)
    text_escape = text_escape_name(text_escape)
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(
            f"{out_dir} exists and is not empty; use ensure_prepared() or remove it first"
        )
    t0 = time.time()
    corpus = read_corpus(inputs, heldout_inputs, text_key=text_key, hf_dataset=hf_dataset, hf_split=hf_split,
                         max_docs=max_docs, strip_gutenberg=strip_gutenberg, progress=progress)
    split_docs = split_documents(corpus, heldout_docs=heldout_docs, seed=seed, inputs=inputs,
                                 heldout_inputs=heldout_inputs)
    for i, text in enumerate(corpus.texts):  # in place: one copy of the corpus in memory
        corpus.texts[i] = escape_text(text, text_escape)

    # the tokenizer learns from the train split only
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer == "train-bpe":
        tok = train_bpe([corpus.texts[i] for i in split_docs["train"]], int(vocab_size), progress)
    else:
        tok = load_tokenizer(tokenizer)
    tok.save(str(out_dir / "tokenizer.json"))
    bos_id = tok.token_to_id(EOT)
    if bos_id is None:
        raise ValueError(f"tokenizer {tokenizer!r} has no {EOT} token (needed as bos_id)")
    real_vocab = int(tok.get_vocab_size())
    dtype = np.uint16 if real_vocab <= 65535 else np.uint32

    stats = write_splits(tok, corpus, split_docs, out_dir, doc_len=settings["doc_len"],
                         min_tokens=settings["min_doc_tokens"], vocab_size=real_vocab, dtype=dtype,
                         progress=progress)
    source_desc = [*settings["inputs"], *([f"hf:{hf_dataset}/{hf_split}"] if hf_dataset else [])]
    meta = {
        "vocab_size": real_vocab,
        "bos_id": int(bos_id),
        "doc_len": settings["doc_len"],
        "tokenizer": "tokenizer.json",
        "text_escape": text_escape,
        "tokenizer_fingerprint": tokenizer_fingerprint(out_dir / "tokenizer.json", text_escape),
        "num_train_rows": stats["train"]["rows"],
        "num_heldout_rows": stats["heldout"]["rows"],
        "source": ", ".join(source_desc),
        "dtype": np.dtype(dtype).name,
        "num_docs": len(corpus.texts),
        "stats": stats,
        "settings": settings,
        "build_seconds": round(time.time() - t0, 2),
        "created_by": CREATED_BY,
    }
    # meta.json last: its presence marks a complete build
    with open(out_dir / "meta.json", "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, ensure_ascii=False)
        f.write("\n")
    if progress and _print_summary:
        print(format_summary(meta, out_dir), file=sys.stderr)
    return meta


# --------------------------------------------------------------------------- idempotent build


@contextlib.contextmanager
def _dir_lock(out_dir: Path):
    """Exclusive inter-process lock beside out_dir (so concurrent ranks build only once)."""
    try:
        import fcntl
    except ImportError:  # non-POSIX: no locking
        yield
        return
    lock_path = out_dir.parent / f".{out_dir.name}.lock"
    with open(lock_path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _is_ours_or_empty(d: Path) -> bool:
    entries = {p.name for p in d.iterdir()}
    if not entries:
        return True
    meta = d / "meta.json"
    if meta.is_file():
        try:
            m = json.loads(meta.read_text(encoding="utf-8"))
            if m.get("created_by") == CREATED_BY:
                return True
        except (json.JSONDecodeError, OSError):
            pass
    return entries <= _OUR_FILES


def ensure_prepared(out_dir, *, inputs=None, tokenizer: str = "train-bpe", vocab_size: int = 4096,
                    doc_len: int = 2048, min_doc_tokens: int | None = None, heldout_docs: int = 2,
                    text_key: str = "text", strip_gutenberg: bool = True,
                    max_docs: int | None = None, hf_dataset: str | None = None,
                    hf_split: str = "train", seed: int = 0, heldout_inputs=None, text_escape: str = "none",
                    progress: bool = True, force: bool = False, summary: bool = True) -> Path:
    """Return ``out_dir`` once it holds a build with exactly these settings.

    If ``out_dir/meta.json`` records the same settings (and the input files' sizes/mtimes are
    unchanged) nothing is done. Otherwise the corpus is built into a temporary directory
    beside ``out_dir`` and renamed into place, so a crash never leaves a half-written
    ``out_dir``. An existing ``out_dir`` is replaced only if it is empty or was written by this
    module (never, e.g., a LongCrawl64 download). ``inputs`` defaults to the embedded corpus. With ``progress``
    and ``summary``, a build ends with its summary on stderr (``summary=False``: the caller prints it).
    """
    out_dir = Path(out_dir)
    if inputs is None and not hf_dataset:
        inputs = [EMBEDDED_CORPUS]
    kw = dict(tokenizer=tokenizer, vocab_size=vocab_size, doc_len=doc_len,
              min_doc_tokens=min_doc_tokens, heldout_docs=heldout_docs, text_key=text_key,
              strip_gutenberg=strip_gutenberg, max_docs=max_docs, hf_dataset=hf_dataset,
              hf_split=hf_split, seed=seed, heldout_inputs=heldout_inputs, text_escape=text_escape)
    _validate_args(inputs, tokenizer, vocab_size, doc_len, min_doc_tokens, heldout_docs, max_docs,
                   hf_dataset, heldout_inputs)
    wanted = _settings(inputs, **kw)

    def up_to_date() -> bool:
        if force:
            return False
        try:
            meta = json.loads((out_dir / "meta.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return False
        return (meta.get("settings") == wanted and (out_dir / "train.zarr").exists()
                and (out_dir / "heldout.zarr").exists())

    if up_to_date():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _dir_lock(out_dir):
        if up_to_date():  # another process built it while we waited
            return out_dir
        if out_dir.exists():
            if not out_dir.is_dir():
                raise FileExistsError(f"{out_dir} exists and is not a directory")
            if not _is_ours_or_empty(out_dir):
                raise FileExistsError(
                    f"{out_dir} exists and was not written by prepare_corpus (no matching "
                    f"meta.json); refusing to replace it. Choose another --out directory."
                )
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700
            meta = prepare_corpus(inputs, tmp, progress=progress, _print_summary=False, **kw)
            if out_dir.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
                os.replace(out_dir, old / "d")
                os.replace(tmp, out_dir)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if progress and summary:
        print(format_summary(meta, out_dir), file=sys.stderr)
    return out_dir


_PREPARE_KEYS = ("tokenizer", "vocab_size", "doc_len", "min_doc_tokens", "heldout_docs", "text_key",
                 "strip_gutenberg", "max_docs", "hf_dataset", "hf_split", "seed", "heldout_inputs")


def _cfg_get(cfg, key, default=None):
    if cfg is None:
        return default
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    try:
        return getattr(cfg, key, default)
    except Exception:  # omegaconf raises on missing keys in struct mode
        return default


def ensure_data(data_cfg, cache_dir=None, *, progress: bool = True) -> Path:
    """Resolve the data directory of a ``data`` config (dict, dataclass or OmegaConf node).

    With ``data_cfg.prepare`` set, the corpus it names (``inputs``; empty = the embedded
    Gutenberg sample) is built into ``data_cfg.data_dir`` via :func:`ensure_prepared`
    (idempotent, atomic, locked against concurrent ranks) with the escape ``data_cfg.text_escape``. Without
    it, ``data_dir`` must already hold ``train.zarr`` and ``heldout.zarr`` (e.g. a LongCrawl64 download).
    ``cache_dir`` is used only when ``data_dir`` is empty (then ``cache_dir/data``).
    """
    data_dir = _cfg_get(data_cfg, "data_dir")
    if not data_dir:
        if cache_dir is None:
            raise ValueError("data.data_dir is not set (and no cache_dir to default to)")
        data_dir = Path(cache_dir) / "data"
    data_dir = Path(str(data_dir)).expanduser()
    prep = _cfg_get(data_cfg, "prepare")
    if prep is not None:
        inputs = [str(p) for p in (_cfg_get(prep, "inputs") or [])]
        kw = {k: _cfg_get(prep, k) for k in _PREPARE_KEYS if _cfg_get(prep, k) is not None}
        if _cfg_get(prep, "min_doc_tokens") is None:
            kw["min_doc_tokens"] = None
        kw["heldout_inputs"] = [str(p) for p in kw.get("heldout_inputs") or []] or None
        kw["text_escape"] = text_escape_name(_cfg_get(data_cfg, "text_escape", "none"), "data.text_escape")
        return ensure_prepared(data_dir, inputs=inputs or None, progress=progress, **kw)
    missing = [n for n in ("train.zarr", "heldout.zarr") if not (data_dir / n).exists()]
    if missing:
        raise FileNotFoundError(
            f"data.data_dir={data_dir} lacks {' and '.join(missing)}. Point data.data_dir at a "
            f"LongCrawl64 download (see docs/data.md) or build one with "
            f"`python scripts/prepare_corpus.py INPUT ... --out DIR`."
        )
    return data_dir


# --------------------------------------------------------------------------- statistics


def unigram_entropy(data_dir, split: str = "train") -> float:
    """Entropy (nats/token) of the empirical unigram distribution of a split's tokens: the
    loss of the best context-free predictor, a floor any useful language model must beat."""
    from .longcrawl64 import load_meta, open_token_array

    arr = open_token_array(Path(data_dir) / f"{split}.zarr")
    meta = load_meta(data_dir) or {}
    counts = np.zeros(int(meta.get("vocab_size", 1)), dtype=np.int64)
    rows_per_read = max(1, (1 << 22) // int(arr.shape[1]))
    for r in range(0, int(arr.shape[0]), rows_per_read):
        block = np.asarray(arr[r: r + rows_per_read]).reshape(-1).astype(np.int64)
        if block.size and block.min() < 0:
            raise ValueError(f"{data_dir}/{split}.zarr: negative token id {int(block.min())}")
        c = np.bincount(block)
        if len(c) > len(counts):
            counts = np.pad(counts, (0, len(c) - len(counts)))
        counts[: len(c)] += c
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
