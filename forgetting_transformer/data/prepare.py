"""Turn raw text into a LongCrawl64-format data directory.

Output layout (``out_dir``)::

    train.zarr       (num_train_rows, doc_len)   uint16 if vocab_size <= 65535 else uint32
    heldout.zarr     (num_heldout_rows, doc_len)
    tokenizer.json   the tokenizer the ids come from
    meta.json        vocab_size, bos_id, doc_len, tokenizer, row/token/drop counts, settings
    documents.jsonl  one line per input document: split, source, tokens, first_row, rows, dropped

Each document is tokenized on its own and cut into consecutive rows of ``doc_len`` tokens;
the final partial row is dropped and documents shorter than ``min_doc_tokens`` are dropped.
Both are counted in ``meta.json`` and the printed summary. No BOS token is stored: the reader
puts ``bos_id`` in front of every row.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import lzma
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

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

EMBEDDED_CORPUS: Path = Path(__file__).resolve().parent / "assets" / "gutenberg_sample.jsonl.xz"
EOT = "<|endoftext|>"
FORMAT_VERSION = 1
_EMBEDDED_TAG = "embedded:gutenberg_sample.jsonl.xz"
_JSONL_SUFFIXES = (".jsonl", ".jsonl.xz", ".jsonl.gz")
_TEXT_SUFFIXES = (".txt",)
_OUR_FILES = {"train.zarr", "heldout.zarr", "tokenizer.json", "meta.json", "documents.jsonl"}

_START_RE = re.compile(r"^\*\*\*\s*START OF", re.MULTILINE)
_END_RE = re.compile(r"^\*\*\*\s*END OF", re.MULTILINE)


# --------------------------------------------------------------------------- text input


def strip_gutenberg_boilerplate(text: str) -> str:
    """Keep only the text between the ``*** START OF ...`` and ``*** END OF ...`` lines when
    both exist (a START marker may wrap onto the next line; it ends at its closing ``***``).
    Surrounding whitespace is stripped. Text without both markers is returned unchanged."""
    m_start = _START_RE.search(text)
    if m_start is None:
        return text
    m_end = _END_RE.search(text, m_start.end())
    if m_end is None:
        return text
    # the START marker ends at the closing "***" (possibly on the next line), else at its line end
    close = text.find("***", m_start.end(), m_end.start())
    nl = text.find("\n", m_start.end())
    if close != -1 and close - m_start.end() < 400:
        body_start = text.find("\n", close)
        body_start = m_end.start() if body_start == -1 else body_start + 1
    else:
        body_start = m_end.start() if nl == -1 else nl + 1
    body_start = min(body_start, m_end.start())
    return text[body_start:m_end.start()].strip()


def _suffix_kind(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(_TEXT_SUFFIXES):
        return "txt"
    return None


def _expand_inputs(inputs: Iterable[os.PathLike | str]) -> list[Path]:
    files: list[Path] = []
    for p in inputs:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"input not found: {p}")
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and _suffix_kind(f))
            if not found:
                raise ValueError(
                    f"input directory {p} holds no .txt/.jsonl/.jsonl.xz/.jsonl.gz files"
                )
            files.extend(found)
        elif _suffix_kind(p) is None:
            raise ValueError(
                f"input {p}: unsupported file type; expected .txt (one document), "
                f".jsonl/.jsonl.xz/.jsonl.gz (one JSON document per line) or a directory"
            )
        else:
            files.append(p)
    return files


def _open_text(path: Path):
    name = path.name.lower()
    if name.endswith(".xz"):
        return lzma.open(path, "rt", encoding="utf-8")
    if name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def iter_documents(inputs, *, text_key: str = "text", hf_dataset: str | None = None,
                   hf_split: str = "train") -> Iterator[tuple[str, str]]:
    """Yield ``(source, text)`` for every document, in input order. ``source`` is
    ``file`` for .txt, ``file:line`` for JSON lines, ``hf:name/split:i`` for datasets."""
    for path in _expand_inputs(inputs or []):
        if _suffix_kind(path) == "txt":
            with _open_text(path) as f:
                yield str(path), f.read()
            continue
        with _open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: invalid JSON ({e})") from e
                if not isinstance(obj, dict) or text_key not in obj:
                    keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
                    raise ValueError(
                        f"{path}:{lineno}: no {text_key!r} field (found {keys}); set text_key"
                    )
                if not isinstance(obj[text_key], str):
                    raise ValueError(f"{path}:{lineno}: field {text_key!r} is not a string")
                yield f"{path}:{lineno}", obj[text_key]
    if hf_dataset:
        try:
            import datasets  # noqa: F401  (optional dependency)
        except ImportError as e:
            raise ImportError(
                "hf_dataset needs the Hugging Face `datasets` package: pip install datasets"
            ) from e
        ds = datasets.load_dataset(hf_dataset, split=hf_split, streaming=True)
        for i, ex in enumerate(ds):
            if text_key not in ex:
                raise ValueError(
                    f"{hf_dataset} ({hf_split}) example {i}: no {text_key!r} field "
                    f"(found {sorted(ex)}); set text_key"
                )
            yield f"hf:{hf_dataset}/{hf_split}:{i}", ex[text_key]


# --------------------------------------------------------------------------- tokenizer


def _train_bpe(texts: list[str], vocab_size: int, progress: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def _load_tokenizer(spec: str):
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
    import hashlib

    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    vocab = sorted((model.get("vocab") or {}).items(), key=lambda kv: kv[1])
    added = sorted((t["id"], t["content"]) for t in spec.get("added_tokens") or [])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    blob = json.dumps({"type": model.get("type"), "vocab": vocab, "added": added, "merges": merges},
                      ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


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
    for f in _expand_inputs(inputs or []):
        if f.resolve() == EMBEDDED_CORPUS:
            out.append([_EMBEDDED_TAG, f.stat().st_size])
        else:
            st = f.stat()
            out.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
    return out


def _settings(inputs, *, tokenizer, vocab_size, doc_len, min_doc_tokens, heldout_docs, text_key,
              strip_gutenberg, max_docs, hf_dataset, hf_split, seed, heldout_inputs=None) -> dict[str, Any]:
    tok = tokenizer
    if tok not in ("train-bpe", "gpt2"):
        tok = str(Path(tok).resolve())
    settings = {
        "format_version": FORMAT_VERSION,
        "inputs": [_input_record(p) for p in (inputs or [])],
        "input_files": _fingerprint(inputs),
        "tokenizer": tok,
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
                   heldout_inputs=None, progress: bool = True, _print_summary: bool = True) -> dict:
    """Build a LongCrawl64-format directory at ``out_dir`` (which must not exist or be empty)
    and return its meta dict. Prefer :func:`ensure_prepared`, which is idempotent and atomic.

    The held-out split is ``heldout_docs`` documents drawn by a seeded shuffle, or, with
    ``heldout_inputs`` (files or directories), exactly the documents of those files (then every
    document of ``inputs`` is train: a corpus whose split is fixed, e.g. by author)."""
    import zarr

    from ..training.progress import Progress

    _validate_args(inputs, tokenizer, vocab_size, doc_len, min_doc_tokens, heldout_docs, max_docs,
                   hf_dataset, heldout_inputs)
    settings = _settings(inputs, tokenizer=tokenizer, vocab_size=vocab_size, doc_len=doc_len,
                         min_doc_tokens=min_doc_tokens, heldout_docs=heldout_docs,
                         text_key=text_key, strip_gutenberg=strip_gutenberg, max_docs=max_docs,
                         hf_dataset=hf_dataset, hf_split=hf_split, seed=seed,
                         heldout_inputs=heldout_inputs)
    doc_len = settings["doc_len"]
    min_tokens = settings["min_doc_tokens"]
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(
            f"{out_dir} exists and is not empty; use ensure_prepared() or remove it first"
        )
    t0 = time.time()

    # 1. documents (input order), optional boilerplate strip and max_docs cut
    sources: list[str] = []
    texts: list[str] = []
    for src, text in iter_documents(inputs, text_key=text_key, hf_dataset=hf_dataset,
                                    hf_split=hf_split):
        if max_docs is not None and len(texts) >= max_docs:
            break
        sources.append(src)
        texts.append(strip_gutenberg_boilerplate(text) if strip_gutenberg else text)
    n_inputs = len(texts)
    if heldout_inputs:
        for src, text in iter_documents(heldout_inputs, text_key=text_key):
            sources.append(src)
            texts.append(strip_gutenberg_boilerplate(text) if strip_gutenberg else text)
    n_docs = len(texts)

    # 2. deterministic split: the held-out files' documents, or a seeded shuffle of document order
    #    whose last heldout_docs are held out
    if heldout_inputs:
        if n_inputs == 0 or n_docs == n_inputs:
            key, paths = ("inputs", inputs) if n_inputs == 0 else ("heldout_inputs", heldout_inputs)
            raise ValueError(f"{key} hold no documents: {[str(p) for p in paths]}")
        split_docs = {"train": list(range(n_inputs)), "heldout": list(range(n_inputs, n_docs))}
    else:
        if n_docs < heldout_docs + 1:
            raise ValueError(
                f"found {n_docs} documents but need at least heldout_docs+1={heldout_docs + 1} "
                f"(heldout_docs for heldout plus one for train)"
            )
        order = np.random.default_rng(seed).permutation(n_docs)
        split_docs = {"train": [int(i) for i in order[: n_docs - heldout_docs]],
                      "heldout": [int(i) for i in order[n_docs - heldout_docs:]]}

    # 3. tokenizer (trained on the train split only)
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer == "train-bpe":
        if progress:
            print(f"training byte-level BPE (vocab_size={vocab_size}) on "
                  f"{len(split_docs['train'])} train documents ...", file=sys.stderr)
        tok = _train_bpe([texts[i] for i in split_docs["train"]], int(vocab_size), progress)
    else:
        tok = _load_tokenizer(tokenizer)
    tok.save(str(out_dir / "tokenizer.json"))
    bos_id = tok.token_to_id(EOT)
    if bos_id is None:
        raise ValueError(f"tokenizer {tokenizer!r} has no {EOT} token (needed as bos_id)")
    real_vocab = int(tok.get_vocab_size())
    dtype = np.uint16 if real_vocab <= 65535 else np.uint32

    # 4. tokenize, cut rows, write zarr
    doc_records: list[dict] = [None] * n_docs  # type: ignore[list-item]
    split_stats: dict[str, dict] = {}
    batch_docs = 32
    bar = Progress(n_docs, "tokenizing", "doc", enabled=progress)
    for split in ("train", "heldout"):
        chunks: list[np.ndarray] = []
        st = {"docs": len(split_docs[split]), "docs_kept": 0, "docs_dropped_short": 0,
              "tokens_total": 0, "tokens_kept": 0, "tokens_dropped_short_docs": 0,
              "tokens_dropped_remainder": 0, "rows": 0}
        ids_list = split_docs[split]
        for b in range(0, len(ids_list), batch_docs):
            idx = ids_list[b: b + batch_docs]
            encs = tok.encode_batch([texts[i] for i in idx], add_special_tokens=False)
            for i, enc in zip(idx, encs):
                ids = np.asarray(enc.ids, dtype=np.int64)
                n = len(ids)
                nrows = n // doc_len if n >= min_tokens else 0
                rec = {"split": split, "source": sources[i], "tokens": n,
                       "first_row": st["rows"], "rows": nrows, "dropped": None}
                st["tokens_total"] += n
                if nrows == 0:
                    rec["dropped"] = (f"shorter than min_doc_tokens={min_tokens}" if n < min_tokens
                                      else f"shorter than doc_len={doc_len}")
                    st["docs_dropped_short"] += 1
                    st["tokens_dropped_short_docs"] += n
                else:
                    st["docs_kept"] += 1
                    kept = nrows * doc_len
                    st["tokens_kept"] += kept
                    st["tokens_dropped_remainder"] += n - kept
                    if ids.size and (ids.max() >= real_vocab or ids.min() < 0):
                        raise ValueError(f"{sources[i]}: tokenizer produced ids outside "
                                         f"[0, {real_vocab})")
                    chunks.append(ids[:kept].astype(dtype).reshape(nrows, doc_len))
                    st["rows"] += nrows
                doc_records[i] = rec
            bar.update(len(idx))
        if st["rows"] == 0:
            bar.close()
            raise ValueError(
                f"the {split} split has 0 rows: its {st['docs']} documents hold "
                f"{st['tokens_total']} tokens, none reaching doc_len={doc_len} / "
                f"min_doc_tokens={min_tokens}; use a smaller doc_len or min_doc_tokens"
                + (" or more heldout_docs" if split == "heldout" else "")
            )
        data = np.concatenate(chunks, axis=0)
        arr = zarr.create_array(store=str(out_dir / f"{split}.zarr"), shape=data.shape,
                                dtype=data.dtype, chunks=(1, doc_len), zarr_format=3)
        arr[...] = data
        split_stats[split] = st
    bar.close()

    with open(out_dir / "documents.jsonl", "w", encoding="utf-8") as f:
        for split in ("train", "heldout"):
            for i in split_docs[split]:
                f.write(json.dumps(doc_records[i], ensure_ascii=False) + "\n")

    source_desc = [*(settings["inputs"])]
    if hf_dataset:
        source_desc.append(f"hf:{hf_dataset}/{hf_split}")
    meta = {
        "vocab_size": real_vocab,
        "bos_id": int(bos_id),
        "doc_len": doc_len,
        "tokenizer": "tokenizer.json",
        "tokenizer_fingerprint": tokenizer_fingerprint(out_dir / "tokenizer.json"),
        "num_train_rows": split_stats["train"]["rows"],
        "num_heldout_rows": split_stats["heldout"]["rows"],
        "source": ", ".join(source_desc),
        "dtype": np.dtype(dtype).name,
        "num_docs": n_docs,
        "stats": split_stats,
        "settings": settings,
        "build_seconds": round(time.time() - t0, 2),
        "created_by": "forgetting_transformer.data.prepare",
    }
    # meta.json last: its presence marks a complete build
    with open(out_dir / "meta.json", "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, ensure_ascii=False)
        f.write("\n")
    if progress and _print_summary:
        print(format_summary(meta, out_dir), file=sys.stderr)
    return meta


def format_summary(meta: dict, out_dir) -> str:
    lines = [f"prepared {out_dir}  (vocab_size={meta['vocab_size']}, bos_id={meta['bos_id']}, "
             f"doc_len={meta['doc_len']}, dtype={meta.get('dtype')})"]
    for split in ("train", "heldout"):
        st = meta["stats"][split]
        lines.append(
            f"  {split:8s}: {st['rows']} rows = {st['tokens_kept']} tokens from {st['docs_kept']}/"
            f"{st['docs']} docs; dropped {st['docs_dropped_short']} short docs "
            f"({st['tokens_dropped_short_docs']} tokens) and {st['tokens_dropped_remainder']} "
            f"tokens of partial final rows"
        )
    lines.append(f"  use: data.data_dir={Path(out_dir).resolve()}  "
                 f"(vocab_size={meta['vocab_size']}, bos_id={meta['bos_id']})")
    return "\n".join(lines)


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
            if m.get("created_by") == "forgetting_transformer.data.prepare":
                return True
        except (json.JSONDecodeError, OSError):
            pass
    return entries <= _OUR_FILES


def ensure_prepared(out_dir, *, inputs=None, tokenizer: str = "train-bpe", vocab_size: int = 4096,
                    doc_len: int = 2048, min_doc_tokens: int | None = None, heldout_docs: int = 2,
                    text_key: str = "text", strip_gutenberg: bool = True,
                    max_docs: int | None = None, hf_dataset: str | None = None,
                    hf_split: str = "train", seed: int = 0, heldout_inputs=None,
                    progress: bool = True, force: bool = False) -> Path:
    """Return ``out_dir`` once it holds a build with exactly these settings.

    If ``out_dir/meta.json`` records the same settings (and the input files' sizes/mtimes are
    unchanged) nothing is done. Otherwise the corpus is built into a temporary directory
    beside ``out_dir`` and renamed into place, so a crash never leaves a half-written
    ``out_dir``. An existing ``out_dir`` is replaced only if it is empty or was written by this
    module (never, e.g., a LongCrawl64 download). ``inputs`` defaults to the embedded corpus.
    """
    out_dir = Path(out_dir)
    if inputs is None and not hf_dataset:
        inputs = [EMBEDDED_CORPUS]
    kw = dict(tokenizer=tokenizer, vocab_size=vocab_size, doc_len=doc_len,
              min_doc_tokens=min_doc_tokens, heldout_docs=heldout_docs, text_key=text_key,
              strip_gutenberg=strip_gutenberg, max_docs=max_docs, hf_dataset=hf_dataset,
              hf_split=hf_split, seed=seed, heldout_inputs=heldout_inputs)
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
    if progress:
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
    (idempotent, atomic, locked against concurrent ranks). Without it, ``data_dir`` must
    already hold ``train.zarr`` and ``heldout.zarr`` (e.g. a LongCrawl64 download).
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
