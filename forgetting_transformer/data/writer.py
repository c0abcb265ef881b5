"""Writing the LongCrawl64 layout: each document tokenized on its own and cut into rows of ``doc_len`` tokens,
the rows of a split stored as one zarr array, one ``documents.jsonl`` record per document, and the summary
printed after a build."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .documents import Corpus
from .progress import ProgressLine, rate_text

__all__ = ["write_splits", "write_array", "format_summary"]

BATCH_DOCS = 32  # documents per encode_batch call
BLOCK_TOKENS = 1 << 22  # tokens per zarr write: 8 MB of uint16


def _new_stats(n_docs: int) -> dict:
    return {"docs": n_docs, "docs_kept": 0, "docs_dropped_short": 0, "tokens_total": 0, "tokens_kept": 0,
            "tokens_dropped_short_docs": 0, "tokens_dropped_remainder": 0, "rows": 0}


def _cut_rows(ids: np.ndarray, source: str, st: dict, *, doc_len: int, min_tokens: int,
              vocab_size: int) -> tuple[dict, np.ndarray | None]:
    """Count one document into ``st``; its ``documents.jsonl`` record and its rows (nrows, doc_len), or None
    when it is dropped as too short."""
    n = len(ids)
    nrows = n // doc_len if n >= min_tokens else 0
    rec = {"source": source, "tokens": n, "first_row": st["rows"], "rows": nrows, "dropped": None}
    st["tokens_total"] += n
    if nrows == 0:
        rec["dropped"] = (f"shorter than min_doc_tokens={min_tokens}" if n < min_tokens
                          else f"shorter than doc_len={doc_len}")
        st["docs_dropped_short"] += 1
        st["tokens_dropped_short_docs"] += n
        return rec, None
    if ids.size and (ids.max() >= vocab_size or ids.min() < 0):
        raise ValueError(f"{source}: tokenizer produced ids outside [0, {vocab_size})")
    kept = nrows * doc_len
    st["docs_kept"] += 1
    st["tokens_kept"] += kept
    st["tokens_dropped_remainder"] += n - kept
    st["rows"] += nrows
    return rec, ids[:kept].reshape(nrows, doc_len)


def _tokenize_split(tok, split: str, doc_ids: list[int], corpus: Corpus, st: dict, records: list,
                    bar: ProgressLine, *, doc_len: int, min_tokens: int, vocab_size: int, dtype) -> list[np.ndarray]:
    """The split's rows as a list of (nrows, doc_len) blocks in document order, counted into ``st``; each
    document's record lands in ``records[doc]``."""
    chunks: list[np.ndarray] = []
    for b in range(0, len(doc_ids), BATCH_DOCS):
        idx = doc_ids[b: b + BATCH_DOCS]
        encs = tok.encode_batch([corpus.texts[i] for i in idx], add_special_tokens=False)
        for i, enc in zip(idx, encs):
            rec, rows = _cut_rows(np.asarray(enc.ids, dtype=np.int64), corpus.sources[i], st,
                                  doc_len=doc_len, min_tokens=min_tokens, vocab_size=vocab_size)
            records[i] = {"split": split, **rec}
            if rows is not None:
                chunks.append(rows.astype(dtype))
        bar.update(len(idx))
    return chunks


def write_array(path: Path, chunks: list[np.ndarray], doc_len: int, dtype, progress: bool = True) -> None:
    """Store the row blocks ``chunks`` (each (nrows, doc_len)) one after another as a zarr v3 array with a chunk
    per row, writing about ``BLOCK_TOKENS`` tokens at a time; a progress line while it takes long."""
    import zarr

    n_rows = sum(len(c) for c in chunks)
    arr = zarr.create_array(store=str(path), shape=(n_rows, doc_len), dtype=dtype, chunks=(1, doc_len),
                            zarr_format=3)
    rows_per_write = max(1, BLOCK_TOKENS // doc_len)
    with ProgressLine(f"writing {path.name}", "rows", n_rows, enabled=progress) as bar:
        pending: list[np.ndarray] = []
        n_pending = 0
        for i, c in enumerate(chunks):
            pending.append(c)
            n_pending += len(c)
            if n_pending >= rows_per_write or i == len(chunks) - 1:
                arr[bar.n: bar.n + n_pending] = np.concatenate(pending, axis=0)
                bar.update(n_pending)
                pending, n_pending = [], 0


def write_splits(tok, corpus: Corpus, split_docs: dict[str, list[int]], out_dir: Path, *, doc_len: int,
                 min_tokens: int, vocab_size: int, dtype, progress: bool = True) -> dict[str, dict]:
    """Tokenize each split, write ``train.zarr``, ``heldout.zarr`` and ``documents.jsonl`` into ``out_dir`` and
    return the per-split stats. A split left with no rows is an error that says what to change."""
    records: list = [None] * len(corpus.texts)
    stats: dict[str, dict] = {}

    def detail() -> str:
        return f"{rate_text(sum(st['tokens_total'] for st in stats.values()))} tokens"

    with ProgressLine("tokenizing", "docs", len(corpus.texts), enabled=progress, detail=detail) as bar:
        for split in ("train", "heldout"):
            st = stats[split] = _new_stats(len(split_docs[split]))
            chunks = _tokenize_split(tok, split, split_docs[split], corpus, st, records, bar, doc_len=doc_len,
                                     min_tokens=min_tokens, vocab_size=vocab_size, dtype=dtype)
            if st["rows"] == 0:
                raise ValueError(
                    f"the {split} split has 0 rows: its {st['docs']} documents hold "
                    f"{st['tokens_total']} tokens, none reaching doc_len={doc_len} / "
                    f"min_doc_tokens={min_tokens}; use a smaller doc_len or min_doc_tokens"
                    + (" or more heldout_docs" if split == "heldout" else "")
                )
            write_array(out_dir / f"{split}.zarr", chunks, doc_len, dtype, progress)
    with open(out_dir / "documents.jsonl", "w", encoding="utf-8") as f:
        for split in ("train", "heldout"):
            for i in split_docs[split]:
                f.write(json.dumps(records[i], ensure_ascii=False) + "\n")
    return stats


def format_summary(meta: dict, out_dir) -> str:
    """What a build holds: rows, tokens and documents kept and dropped per split, and the ``data.data_dir`` to
    use."""
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
    lines.append(f"  use: data.data_dir={Path(out_dir).resolve()}  (vocab_size={meta['vocab_size']}, "
                 f"bos_id={meta['bos_id']}, text_escape={meta.get('text_escape', 'none')})")
    return "\n".join(lines)
