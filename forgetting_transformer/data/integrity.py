"""Integrity checks for the zarr token arrays of a LongCrawl64-format data dir.

zarr reads a chunk whose file is absent as ``fill_value`` (zeros) without a word, and a chunk
that does not decode surfaces as a bare numcodecs/numpy exception that names no file. The
helpers here find absent chunk files by listing the array directory (no chunk is read), read
regions only after checking that the chunks they touch exist, and turn decode failures into a
:class:`DataIntegrityError` that names the array, the chunk key, the rows it holds and the data
dir. Used by :mod:`forgetting_transformer.data.longcrawl64` and scripts/check_corpus.py.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["DataIntegrityError", "ChunkLayout", "read_block", "missing_chunks_error"]


class DataIntegrityError(ValueError):
    """Damaged token data. ``kind`` is ``"missing_chunks"``, ``"undecodable_chunk"``,
    ``"dtype_mismatch"`` or ``"zero_rows"``; ``chunks`` holds the chunk keys and ``rows`` the
    row indices involved (the first few). A ``ValueError``, so callers that report bad input
    (e.g. the CLIs' ``error: ...``) keep working."""

    def __init__(self, message: str, *, kind: str, chunks: Sequence[str] = (),
                 rows: Sequence[int] = ()):
        super().__init__(message)
        self.kind, self.chunks, self.rows = kind, list(chunks), [int(r) for r in rows]


class ChunkLayout:
    """The stored objects of a 2-D zarr array: one file per chunk (per shard when sharded),
    keyed by its coordinates in the chunk grid. Works for zarr v2 and v3 and any chunk shape;
    reads only the array's metadata."""

    def __init__(self, arr, path):
        md = arr.metadata
        self.path = Path(path)
        self._root = os.path.abspath(path)  # stat()s must not depend on a later chdir
        self.shape = tuple(int(x) for x in arr.shape)
        # for a sharded v3 array chunk_grid is the shard grid: the unit that is stored as a file
        self.chunk_shape = tuple(int(c) for c in md.chunk_grid.chunk_shape)
        self.grid = tuple(-(-s // c) for s, c in zip(self.shape, self.chunk_shape))
        self.nchunks = self.grid[0] * self.grid[1]
        self.zarr_format = int(md.zarr_format)
        self.meta_file = "zarr.json" if self.zarr_format == 3 else ".zarray"
        self.dtype = np.dtype(arr.dtype)
        self.fill_value = arr.fill_value
        self._encode = md.encode_chunk_key
        key00 = self._encode((0, 0))
        self._sep = "/" if "/" in key00 else "."
        self._prefix = key00[: len(key00) - len(f"0{self._sep}0")]  # "c/" (v3) or "" (v2)

    def key(self, coords: tuple[int, int]) -> str:
        return self._encode((int(coords[0]), int(coords[1])))

    def region(self, coords: tuple[int, int]) -> tuple[int, int, int, int]:
        """``(row0, row1, col0, col1)``: the half-open rows and columns the chunk holds."""
        (i, j), (cr, cc) = coords, self.chunk_shape
        return (i * cr, min((i + 1) * cr, self.shape[0]), j * cc, min((j + 1) * cc, self.shape[1]))

    def describe(self, coords: tuple[int, int]) -> str:
        """``c/5/0 (row 5)``, ``0.1 (rows 0-127, cols 4096-8191)``: key plus what it holds."""
        r0, r1, c0, c1 = self.region(coords)
        rows = f"row {r0}" if r1 - r0 == 1 else f"rows {r0}-{r1 - 1}"
        cols = f", cols {c0}-{c1 - 1}" if self.grid[1] > 1 else ""
        return f"{self.key(coords)} ({rows}{cols})"

    def coords_for(self, row0: int, row1: int, col0: int, col1: int) -> list[tuple[int, int]]:
        """The chunks that the region ``[row0, row1) x [col0, col1)`` touches, in C order."""
        cr, cc = self.chunk_shape
        return [(i, j) for i in range(row0 // cr, (row1 - 1) // cr + 1)
                for j in range(col0 // cc, (col1 - 1) // cc + 1)]

    def exists(self, coords: tuple[int, int]) -> bool:
        return os.path.isfile(os.path.join(self._root, self.key(coords)))

    def find_missing(self, limit: int = 5) -> tuple[int, list[tuple[int, int]]]:
        """``(count, first)``: how many chunk files are absent and the first ``limit`` of them.

        One listing of the array directory when every chunk file lies in it (``.``-separated
        keys: the zarr v2 default), else one ``stat`` per expected chunk (nested ``c/i/j`` keys:
        listing would open a directory per row). Both are linear in the number of chunks."""
        if self._sep == ".":
            present = np.zeros(self.grid, dtype=bool)
            with os.scandir(self._root) as it:
                for entry in it:
                    c = self._parse_flat_key(entry.name)
                    if c is not None and entry.is_file():
                        present[c] = True
            missing = np.argwhere(~present)
            return len(missing), [(int(i), int(j)) for i, j in missing[:limit]]
        count, first = 0, []
        for c in itertools.product(range(self.grid[0]), range(self.grid[1])):
            if not self.exists(c):
                count += 1
                if len(first) < limit:
                    first.append(c)
        return count, first

    def _parse_flat_key(self, name: str) -> tuple[int, int] | None:
        if not name.startswith(self._prefix):
            return None
        parts = name[len(self._prefix):].split(".")
        if len(parts) != 2 or not all(p.isdigit() and (p == "0" or p[0] != "0") for p in parts):
            return None  # not a chunk key: metadata, stray files, "01.0"
        i, j = int(parts[0]), int(parts[1])
        return (i, j) if i < self.grid[0] and j < self.grid[1] else None


def missing_chunks_error(layout: ChunkLayout, count: int, first: list, when: str) -> DataIntegrityError:
    shown = ", ".join(layout.describe(c) for c in first)
    more = f", ... ({count - len(first)} more)" if count > len(first) else ""
    return DataIntegrityError(
        f"{layout.path}: {count} of {layout.nchunks} chunk files {when}: {shown}{more}. The array "
        f"metadata ({layout.meta_file}) is there but these chunks are not, and zarr would read "
        f"them as fill_value={layout.fill_value} repeated, not text (zarr also leaves out "
        f"chunks that equal fill_value). Re-download or rebuild {layout.path.parent}; "
        f"`python scripts/check_corpus.py {layout.path.parent}` lists every damaged chunk.",
        kind="missing_chunks", chunks=[layout.key(c) for c in first],
        rows=[layout.region(c)[0] for c in first])


_RESHAPE_RE = re.compile(r"cannot reshape array of size (\d+) into shape \(([\d, ]+)\)")


def _decode_error(layout: ChunkLayout, coords: tuple[int, int], exc: BaseException) -> DataIntegrityError:
    """Name the chunk that failed to decode; a size mismatch with a whole number of bytes per
    element (e.g. 512 bytes for 256 elements) is a dtype that does not fit the chunk data."""
    where = f"{layout.path}: chunk {layout.describe(coords)} of data dir {layout.path.parent}"
    chunk_file = layout.path / layout.key(coords)
    m = _RESHAPE_RE.search(str(exc))
    if m:
        nbytes = int(m.group(1)) * layout.dtype.itemsize
        want = int(np.prod([int(x) for x in m.group(2).split(",") if x.strip()]))
        if want and nbytes % want == 0 and nbytes // want != layout.dtype.itemsize:
            per = nbytes // want
            return DataIntegrityError(
                f"{where}: the stored dtype {layout.dtype} ({layout.path / layout.meta_file}) does "
                f"not match the chunk data: the chunk decodes to {nbytes} bytes for {want} "
                f"elements, {per} bytes per element, but {layout.dtype} has "
                f"{layout.dtype.itemsize} (the data look like a {per}-byte dtype, e.g. "
                f"uint{8 * per}). Was the metadata edited? ({type(exc).__name__}: {exc})",
                kind="dtype_mismatch", chunks=[layout.key(coords)],
                rows=[layout.region(coords)[0]])
    if isinstance(exc, OSError):  # unreadable file (permissions, I/O error), not bad bytes
        return DataIntegrityError(
            f"{where} could not be read ({type(exc).__name__}: {exc}); check {chunk_file}.",
            kind="undecodable_chunk", chunks=[layout.key(coords)], rows=[layout.region(coords)[0]])
    return DataIntegrityError(
        f"{where} could not be decoded ({type(exc).__name__}: {exc}); the chunk file "
        f"{chunk_file} is corrupt or truncated. Re-download or rebuild the data dir.",
        kind="undecodable_chunk", chunks=[layout.key(coords)], rows=[layout.region(coords)[0]])


def read_block(arr, layout: ChunkLayout, row0: int, row1: int, col0: int, col1: int) -> np.ndarray:
    """``arr[row0:row1, col0:col1]`` (a 1-D row slice when ``row1 == row0 + 1``), checked: every
    chunk it touches must exist now (zarr would return fill_value for an absent one), and a
    chunk that fails to decode raises :class:`DataIntegrityError` naming it, chained from
    zarr's/numcodecs' exception."""
    coords = layout.coords_for(row0, row1, col0, col1)
    missing = [c for c in coords if not layout.exists(c)]
    if missing:
        raise missing_chunks_error(layout, len(missing), missing[:5], "needed by this read are missing")
    try:
        if row1 == row0 + 1:
            return np.asarray(arr[row0, col0:col1])
        return np.asarray(arr[row0:row1, col0:col1])
    except MemoryError:
        raise
    except Exception as e:  # numcodecs/zarr raise RuntimeError, ValueError, ... for bad chunks
        bad, cause = coords[0], e
        if len(coords) > 1:  # find the chunk that fails, and its own error (error path only)
            for c in coords:
                r0, r1, c0, c1 = layout.region(c)
                try:
                    arr[r0:r1, c0:c1]
                except Exception as ce:
                    bad, cause = c, ce
                    break
        raise _decode_error(layout, bad, cause) from cause
