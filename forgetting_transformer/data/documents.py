"""Reading a corpus: input files and directories (.txt, JSON lines, compressed), an optional Hugging Face dataset,
Project Gutenberg boilerplate stripping, and the deterministic train/held-out split of the documents."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .progress import ProgressLine, rate_text

__all__ = ["EMBEDDED_CORPUS", "Corpus", "strip_gutenberg_boilerplate", "iter_documents", "read_corpus",
           "split_documents"]

EMBEDDED_CORPUS: Path = Path(__file__).resolve().parent / "assets" / "gutenberg_sample.jsonl.xz"
_JSONL_SUFFIXES = (".jsonl", ".jsonl.xz", ".jsonl.gz")
_TEXT_SUFFIXES = (".txt",)

_START_RE = re.compile(r"^\*\*\*\s*START OF", re.MULTILINE)
_END_RE = re.compile(r"^\*\*\*\s*END OF", re.MULTILINE)


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


def expand_inputs(inputs: Iterable[os.PathLike | str]) -> list[Path]:
    """The input files, in order: a directory stands for its .txt/.jsonl(.xz/.gz) files in sorted path order."""
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


def _iter_jsonl(path: Path, text_key: str) -> Iterator[tuple[str, str]]:
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


def _iter_hf_dataset(name: str, split: str, text_key: str) -> Iterator[tuple[str, str]]:
    try:
        import datasets  # noqa: F401  (optional dependency)
    except ImportError as e:
        raise ImportError(
            "hf_dataset needs the Hugging Face `datasets` package: pip install datasets"
        ) from e
    ds = datasets.load_dataset(name, split=split, streaming=True)
    for i, ex in enumerate(ds):
        if text_key not in ex:
            raise ValueError(
                f"{name} ({split}) example {i}: no {text_key!r} field "
                f"(found {sorted(ex)}); set text_key"
            )
        yield f"hf:{name}/{split}:{i}", ex[text_key]


def iter_documents(inputs, *, text_key: str = "text", hf_dataset: str | None = None,
                   hf_split: str = "train") -> Iterator[tuple[str, str]]:
    """Yield ``(source, text)`` for every document, in input order. ``source`` is
    ``file`` for .txt, ``file:line`` for JSON lines, ``hf:name/split:i`` for datasets."""
    for path in expand_inputs(inputs or []):
        if _suffix_kind(path) == "txt":
            with _open_text(path) as f:
                yield str(path), f.read()
        else:
            yield from _iter_jsonl(path, text_key)
    if hf_dataset:
        yield from _iter_hf_dataset(hf_dataset, hf_split, text_key)


@dataclass
class Corpus:
    """The documents in input order: ``sources[i]`` names where ``texts[i]`` came from; the first ``n_inputs``
    come from ``inputs``, the rest from ``heldout_inputs``."""

    sources: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    n_inputs: int = 0


def read_corpus(inputs, heldout_inputs=None, *, text_key: str = "text", hf_dataset: str | None = None,
                hf_split: str = "train", max_docs: int | None = None, strip_gutenberg: bool = True,
                progress: bool = True) -> Corpus:
    """Every document of ``inputs`` (the first ``max_docs``), then every one of ``heldout_inputs``, with the
    Gutenberg boilerplate stripped when asked; a progress line while reading takes long."""
    corpus = Corpus()
    chars = 0
    bar = ProgressLine("reading documents", "docs", enabled=progress, detail=lambda: f"{rate_text(chars)} chars")

    def add(src: str, text: str) -> None:
        nonlocal chars
        corpus.sources.append(src)
        corpus.texts.append(strip_gutenberg_boilerplate(text) if strip_gutenberg else text)
        chars += len(corpus.texts[-1])
        bar.update()

    with bar:
        for src, text in iter_documents(inputs, text_key=text_key, hf_dataset=hf_dataset, hf_split=hf_split):
            if max_docs is not None and len(corpus.texts) >= max_docs:
                break
            add(src, text)
        corpus.n_inputs = len(corpus.texts)
        if heldout_inputs:
            for src, text in iter_documents(heldout_inputs, text_key=text_key):
                add(src, text)
    return corpus


def split_documents(corpus: Corpus, *, heldout_docs: int, seed: int, inputs=None,
                    heldout_inputs=None) -> dict[str, list[int]]:
    """Document indices of each split: the held-out files' documents, or a seeded shuffle of document order
    whose last ``heldout_docs`` are held out."""
    n_docs, n_inputs = len(corpus.texts), corpus.n_inputs
    if heldout_inputs:
        if n_inputs == 0 or n_docs == n_inputs:
            key, paths = ("inputs", inputs) if n_inputs == 0 else ("heldout_inputs", heldout_inputs)
            raise ValueError(f"{key} hold no documents: {[str(p) for p in paths or []]}")
        return {"train": list(range(n_inputs)), "heldout": list(range(n_inputs, n_docs))}
    if n_docs < heldout_docs + 1:
        raise ValueError(
            f"found {n_docs} documents but need at least heldout_docs+1={heldout_docs + 1} "
            f"(heldout_docs for heldout plus one for train)"
        )
    order = np.random.default_rng(seed).permutation(n_docs)
    return {"train": [int(i) for i in order[: n_docs - heldout_docs]],
            "heldout": [int(i) for i in order[n_docs - heldout_docs:]]}
