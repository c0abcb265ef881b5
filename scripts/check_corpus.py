#!/usr/bin/env python
"""Check a LongCrawl64-format data directory (train.zarr, heldout.zarr) for damaged data.

For each split it reports rows, doc_len, dtype and chunking; chunk files that are missing (a
listing of the array directory, no chunk read); chunks that do not decode (corrupt, truncated,
or a dtype that does not fit the chunk bytes); rows that are entirely token id 0; the token-id
range against meta.json's vocab_size (or --vocab-size); meta.json's row count, doc_len and
dtype; and the document lengths in documents.jsonl when there is one. The array is read in
blocks of about 4M tokens, never whole, with a progress line on stderr every 10 s.

Exit code 1 when a problem is found (or the directory cannot be checked), 0 otherwise.

Examples (from the repo root):
    python scripts/check_corpus.py data/gutenberg_sample
    python scripts/check_corpus.py /data/longcrawl64 --vocab-size 50257 --sample 20000
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from forgetting_transformer.data.integrity import ChunkLayout, DataIntegrityError, read_block
from forgetting_transformer.data.longcrawl64 import load_meta, open_token_array
from forgetting_transformer.data.progress import ProgressLine, progress_every

BLOCK_TOKENS = 1 << 22  # tokens per read: 8 MB of uint16
SHOW = 5  # how many chunk keys / row indices a line lists


@dataclass
class Scan:
    """What reading (part of) one array found."""

    rows_read: int = 0
    zero_rows: list[int] = field(default_factory=list)
    n_zero_rows: int = 0
    bad_chunks: list[tuple[str, DataIntegrityError]] = field(default_factory=list)
    n_bad_chunks: int = 0
    tok_min: int | None = None
    tok_max: int | None = None
    n_out_of_range: int = 0
    first_out_of_range: tuple[int, int, int] | None = None  # row, position, value


# --------------------------------------------------------------------------- reading


def _read_unit(arr, layout: ChunkLayout, r0: int, r1: int, scan: Scan) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``[r0, r1)`` and a mask of the rows whose every chunk was read; a chunk that is
    missing (already counted by the listing) or does not decode leaves its rows unchecked."""
    doc_len = layout.shape[1]
    try:
        return read_block(arr, layout, r0, r1, 0, doc_len).reshape(r1 - r0, doc_len), \
            np.ones(r1 - r0, dtype=bool)
    except DataIntegrityError:
        pass
    block = np.zeros((r1 - r0, doc_len), dtype=layout.dtype)
    ok = np.ones(r1 - r0, dtype=bool)
    for c in layout.coords_for(r0, r1, 0, doc_len):  # chunk by chunk, to name each bad one
        cr0, cr1, c0, c1 = layout.region(c)
        a, b = max(cr0, r0), min(cr1, r1)
        try:
            block[a - r0:b - r0, c0:c1] = read_block(arr, layout, a, b, c0, c1).reshape(b - a, c1 - c0)
        except DataIntegrityError as e:
            ok[a - r0:b - r0] = False
            if e.kind != "missing_chunks":
                scan.n_bad_chunks += 1
                if len(scan.bad_chunks) < SHOW:
                    scan.bad_chunks.append((layout.describe(c), e))
    return block, ok


def _tally(block: np.ndarray, ok: np.ndarray, r0: int, vocab_size: int | None, scan: Scan) -> None:
    block = block[ok]
    rows = np.flatnonzero(ok) + r0
    scan.rows_read += len(rows)
    if not len(rows):
        return
    zero = rows[~block.any(axis=1)]
    scan.n_zero_rows += len(zero)
    scan.zero_rows.extend(int(r) for r in zero[:SHOW - len(scan.zero_rows)])
    lo, hi = int(block.min()), int(block.max())
    scan.tok_min = lo if scan.tok_min is None else min(scan.tok_min, lo)
    scan.tok_max = hi if scan.tok_max is None else max(scan.tok_max, hi)
    if lo < 0 or (vocab_size is not None and hi >= vocab_size):
        bad = (block < 0) | (block >= (vocab_size if vocab_size is not None else np.inf))
        scan.n_out_of_range += int(bad.sum())
        if scan.first_out_of_range is None:
            i, j = np.argwhere(bad)[0]
            scan.first_out_of_range = (int(rows[i]), int(j), int(block[i, j]))


def scan_array(arr, layout: ChunkLayout, name: str, rows: np.ndarray | None,
               vocab_size: int | None, progress_every: float) -> Scan:
    """Read every row (``rows=None``, in blocks of whole chunk bands) or the given rows."""
    n, doc_len = layout.shape
    if rows is None:
        cr = layout.chunk_shape[0]
        step = max(cr, (BLOCK_TOKENS // doc_len) // cr * cr)
        units = [(r, min(r + step, n)) for r in range(0, n, step)]
    else:
        units = [(int(r), int(r) + 1) for r in rows]
    scan = Scan()
    with ProgressLine(f"  reading {name}", "rows", sum(b - a for a, b in units), every=progress_every) as bar:
        for r0, r1 in units:
            block, ok = _read_unit(arr, layout, r0, r1, scan)
            _tally(block, ok, r0, vocab_size, scan)
            bar.update(r1 - r0)
    return scan


# --------------------------------------------------------------------------- reporting


def _documents(data_dir: Path) -> tuple[dict[str, list[dict]], list[str]]:
    path = data_dir / "documents.jsonl"
    docs: dict[str, list[dict]] = {}
    if not path.is_file():
        return docs, []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
                docs.setdefault(rec["split"], []).append(rec)
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                return docs, [f"{path}:{lineno}: not a document record ({type(e).__name__}: {e})"]
    return docs, []


def _document_lines(docs: list[dict], n_rows: int, split: str) -> tuple[list[str], list[str]]:
    tokens = np.array([int(d.get("tokens", 0)) for d in docs])
    kept = [d for d in docs if int(d.get("rows", 0)) > 0]
    doc_rows = sum(int(d["rows"]) for d in kept)
    line = (f"documents.jsonl: {len(docs)} documents, {len(kept)} kept ({doc_rows:,} rows), "
            f"{len(docs) - len(kept)} dropped")
    if len(tokens):
        line += (f"; tokens per document min {int(tokens.min()):,} / median "
                 f"{int(np.median(tokens)):,} / max {int(tokens.max()):,}")
    problems = []
    if doc_rows != n_rows:
        problems.append(f"documents.jsonl lists {doc_rows:,} {split} rows but {split}.zarr has {n_rows:,}")
    return [line], problems


def _meta_problems(meta: dict, split: str, layout: ChunkLayout) -> list[str]:
    n, doc_len = layout.shape
    out = []
    for key, have in ((f"num_{split}_rows", n), ("doc_len", doc_len)):
        if key in meta and int(meta[key]) != have:
            out.append(f"meta.json says {key}={meta[key]} but {split}.zarr has {have}")
    if "dtype" in meta and str(meta["dtype"]) != layout.dtype.name:
        out.append(f"meta.json says dtype={meta['dtype']} but {split}.zarr's {layout.meta_file} "
                   f"says {layout.dtype.name}: the stored dtype does not match the data as written")
    return out


def _scan_problems(scan: Scan, vocab_size: int | None) -> tuple[list[str], list[str]]:
    lines, problems = [], []
    if scan.n_bad_chunks:
        shown = ", ".join(d for d, _ in scan.bad_chunks)
        problems.append(f"{scan.n_bad_chunks:,} chunk(s) do not decode: {shown}"
                        + (", ..." if scan.n_bad_chunks > len(scan.bad_chunks) else "")
                        + f"\n      first: {scan.bad_chunks[0][1]}")
    if scan.n_zero_rows:
        problems.append(f"{scan.n_zero_rows:,} all-zero rows (entirely token id 0): "
                        + ", ".join(map(str, scan.zero_rows))
                        + (", ..." if scan.n_zero_rows > len(scan.zero_rows) else ""))
    elif scan.rows_read:
        lines.append("all-zero rows: 0")
    if scan.tok_min is not None:
        if vocab_size is None:
            within = " (not checked: no vocab_size in meta.json and no --vocab-size)"
        else:
            within = f" ({'outside' if scan.n_out_of_range else 'within'} [0, vocab_size={vocab_size}))"
        lines.append(f"token ids: {scan.tok_min}..{scan.tok_max}{within}")
    if scan.n_out_of_range:
        r, j, v = scan.first_out_of_range
        problems.append(f"{scan.n_out_of_range:,} token ids outside [0, vocab_size={vocab_size}); "
                        f"first: row {r}, position {j} holds {v}")
    return lines, problems


def check_split(data_dir: Path, split: str, meta: dict, docs: dict, args) -> list[str]:
    """Print the report for one split; return its problems."""
    path = data_dir / f"{split}.zarr"
    try:
        arr = open_token_array(path, verify=False)
    except (FileNotFoundError, ValueError) as e:
        print(f"{split}.zarr:\n  PROBLEM: {e}")
        return [str(e)]
    layout = ChunkLayout(arr, path)
    n, doc_len = layout.shape
    print(f"{split}.zarr: {n:,} rows x doc_len {doc_len:,}, {layout.dtype}, zarr v{layout.zarr_format}, "
          f"chunks {layout.chunk_shape} -> {layout.nchunks:,} chunk files")
    lines, problems = [], _meta_problems(meta, split, layout)
    if layout.nchunks >= 1_000_000:  # ~20 s of stat() calls for a nested layout: say so
        print(f"  {split}.zarr: looking for {layout.nchunks:,} chunk files ...", file=sys.stderr, flush=True)
    n_missing, first = layout.find_missing(SHOW)
    if n_missing:
        problems.append(f"{n_missing:,} of {layout.nchunks:,} chunk files missing: "
                        + ", ".join(layout.describe(c) for c in first)
                        + (", ..." if n_missing > len(first) else ""))
    else:
        lines.append(f"chunk files: all {layout.nchunks:,} present")
    rows = None
    if args.sample is not None and args.sample < n:
        rows = np.unique(np.linspace(0, n - 1, args.sample).round().astype(np.int64))
    vocab_size = meta.get("vocab_size", args.vocab_size)
    scan = scan_array(arr, layout, f"{split}.zarr", rows, vocab_size, args.progress_every)
    what = "all" if rows is None else f"a sample of {len(rows):,} spread over the split"
    wanted = n if rows is None else len(rows)
    unread = f"; {wanted - scan.rows_read:,} in missing or bad chunks" if scan.rows_read < wanted else ""
    lines.append(f"rows read: {scan.rows_read:,} of {n:,} ({what}{unread})")
    more_lines, more_problems = _scan_problems(scan, vocab_size)
    lines += more_lines
    problems += more_problems
    if split in docs:
        doc_lines, doc_problems = _document_lines(docs[split], n, split)
        lines += doc_lines
        problems += doc_problems
    for line in lines:
        print(f"  {line}")
    for p in problems:
        print(f"  PROBLEM: {p}")
    print(f"  -> {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_dir", metavar="DATA_DIR", help="directory holding train.zarr and/or heldout.zarr")
    p.add_argument("--sample", type=int, default=None, metavar="N",
                   help="read only N rows per split, evenly spread (default: every row); the "
                        "missing-chunk check always covers every chunk")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="check token ids against this when meta.json has no vocab_size "
                        "(LongCrawl64: 50257)")
    p.add_argument("--progress-every", type=float, default=None, metavar="SECONDS",
                   help="seconds between progress lines on stderr (default: FOX_PROGRESS_SECONDS, else 10)")
    a = p.parse_args(argv)
    if a.sample is not None and a.sample < 1:
        p.error(f"--sample must be >= 1, got {a.sample}")
    if a.progress_every is None:
        try:
            a.progress_every = progress_every()
        except ValueError as e:
            p.error(str(e))
    elif a.progress_every < 0:
        p.error(f"--progress-every must be >= 0, got {a.progress_every}")

    data_dir = Path(a.data_dir)
    try:
        if not data_dir.is_dir():
            raise FileNotFoundError(f"data dir not found: {data_dir}")
        splits = [s for s in ("train", "heldout") if (data_dir / f"{s}.zarr").exists()]
        if not splits:
            raise FileNotFoundError(f"{data_dir} holds neither train.zarr nor heldout.zarr")
        meta = load_meta(data_dir) or {}
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    docs, problems = _documents(data_dir)
    keys = ", ".join(f"{k}={meta[k]}" for k in ("vocab_size", "bos_id", "doc_len", "dtype", "text_escape") if k in meta)
    print(f"data dir: {data_dir}  (meta.json: {keys or 'none'})")
    if a.vocab_size is not None and "vocab_size" in meta and int(meta["vocab_size"]) != a.vocab_size:
        problems.append(f"--vocab-size={a.vocab_size} but meta.json says vocab_size={meta['vocab_size']}")
    for prob in problems:
        print(f"  PROBLEM: {prob}")
    for split in ("train", "heldout"):
        if split not in splits:  # e.g. only heldout.zarr downloaded for evaluation: not damage
            print(f"{split}.zarr: absent, not checked")
            continue
        problems += check_split(data_dir, split, meta, docs, a)
    if problems:
        print(f"{len(problems)} problem(s) in {data_dir}")
        return 1
    print(f"no problems found in {data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
