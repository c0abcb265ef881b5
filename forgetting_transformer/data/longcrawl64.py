"""Reader for LongCrawl64-format token stores.

Format
------
A data directory ``data_dir`` holds ``train.zarr`` and ``heldout.zarr``. Each is a
2-D zarr array ``(num_docs, doc_len)`` of integer token ids (the real LongCrawl64:
``doc_len = 65536``, GPT-2 ids of JSON-escaped text, vocab 50257, BOS 50256, usually ``uint16``;
zarr v2 or v3 format). ``data_dir/meta.json`` is optional; our converter
(:mod:`forgetting_transformer.data.prepare`) writes it with at least
``vocab_size``, ``bos_id``, ``doc_len``, ``tokenizer`` and ``text_escape``.

Training sequences
------------------
Every row is cut into ``doc_len // seq_len`` consecutive chunks. Sequence ``s`` is
chunk ``s % chunks_per_row`` of row ``s // chunks_per_row``. For a chunk starting at
``start``::

    labels = row[start : start + seq_len]
    inputs = rolled[start : start + seq_len],  rolled = [bos_id, row[0], ..., row[doc_len - 2]]

so a chunk that starts mid-row gets ``inputs[0] = row[start - 1]``.

Order: epoch ``e`` visits sequences in the order
``np.random.default_rng([seed, e]).permutation(num_sequences)`` (``arange`` when
``shuffle=False``). Step ``t`` of an epoch is the global batch
``perm[t*G:(t+1)*G]`` with ``G = batch_size * world_size``; rank ``r`` takes the
contiguous slice ``[r*batch_size:(r+1)*batch_size]`` of it. The last
``num_sequences % G`` sequences of each epoch's permutation are dropped (a
different set every epoch when shuffling), so ``steps_per_epoch =
num_sequences // G``.

Damaged data
------------
Nothing is read silently wrong (see docs/data.md, "Damaged data"). At open time
(:func:`open_token_array`) the stored chunk files are counted against the chunk grid (zarr
reads an absent chunk as ``fill_value``, i.e. zeros) and meta.json's ``dtype`` is compared with
the array's. At read time every chunk a read touches must still exist, a chunk that does not
decode raises an error naming it (and a dtype that does not fit the chunk bytes is called
that), token ids must lie in ``[0, vocab_size)``, and a row that is entirely token id 0 is
refused, or with ``LongCrawl64Dataset(..., skip_zero_rows=True)`` skipped and counted. All
these raise :class:`DataIntegrityError` (a ``ValueError``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .integrity import ChunkLayout, DataIntegrityError, missing_chunks_error, read_block
from .tokenizer import text_escape_name

__all__ = ["LongCrawl64Dataset", "read_rows", "load_meta", "data_text_escape", "open_token_array", "ChunkLayout",
           "DataIntegrityError", "read_block"]

_PREPARE_HINT = (
    "Point data.data_dir at a directory holding train.zarr/heldout.zarr (a LongCrawl64 "
    "download, see docs/data.md), or build one with "
    "`python scripts/prepare_corpus.py INPUT ... --out DIR`."
)


# --------------------------------------------------------------------------- helpers


def load_meta(data_dir) -> dict | None:
    """Return the parsed ``data_dir/meta.json``, or ``None`` when there is none."""
    path = Path(data_dir) / "meta.json"
    if not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(meta).__name__}")
    return meta


def data_text_escape(data_dir) -> str | None:
    """The text escape the tokens of ``data_dir`` were written with: meta.json's ``text_escape`` (``"none"`` for a
    meta.json written before the key existed, when the converter did not escape), or None without a meta.json
    (a LongCrawl64 download: the data config says what it holds)."""
    meta = load_meta(data_dir)
    if meta is None:
        return None
    return text_escape_name(meta.get("text_escape", "none"), f"{Path(data_dir) / 'meta.json'}: text_escape")


def _check_vocab(path: Path, vocab_size: int, bos_id: int, text_escape: str | None = None) -> None:
    """Validate vocab_size/bos_id against each other and, with text_escape, against meta.json beside ``path``."""
    if not isinstance(vocab_size, (int, np.integer)) or vocab_size <= 0:
        raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
    meta_path = path.parent / "meta.json"
    meta = load_meta(path.parent) or {}
    for key, value in (("vocab_size", vocab_size), ("bos_id", bos_id)):
        if key in meta and int(meta[key]) != int(value):
            raise ValueError(
                f"{meta_path} says {key}={meta[key]} but the reader for {path} was given "
                f"{key}={value}; set the model/data config to {key}={meta[key]} "
                f"(the values the tokens were written with)."
            )
    if not isinstance(bos_id, (int, np.integer)) or not (0 <= bos_id < vocab_size):
        raise ValueError(
            f"bos_id={bos_id!r} must satisfy 0 <= bos_id < vocab_size={vocab_size}"
        )
    recorded = data_text_escape(path.parent)
    if text_escape is not None and recorded is not None and recorded != text_escape_name(text_escape):
        raise ValueError(
            f"{meta_path} says text_escape={recorded} but the reader for {path} was given "
            f"text_escape={text_escape_name(text_escape)}; set data.text_escape={recorded} (the escape the "
            f"tokens were written with) or rebuild the data with scripts/prepare_corpus.py --text-escape "
            f"{text_escape_name(text_escape)}")


# --------------------------------------------------------------------------- integrity


def _check_meta_dtype(path: Path, layout: ChunkLayout) -> None:
    meta = load_meta(path.parent) or {}
    if "dtype" not in meta:
        return
    try:
        meta_dtype = np.dtype(meta["dtype"])
    except TypeError as e:
        raise ValueError(f"{path.parent / 'meta.json'}: dtype={meta['dtype']!r} is not a numpy dtype") from e
    if meta_dtype != layout.dtype:
        raise DataIntegrityError(
            f"{path}: the array's dtype is {layout.dtype} ({path / layout.meta_file}) but "
            f"{path.parent / 'meta.json'} says dtype={meta['dtype']}: the stored dtype does not "
            f"match what the data were written as. Restore {layout.meta_file} (or rebuild the "
            f"data dir) so that both agree.",
            kind="dtype_mismatch")


def _zero_rows_error(path: Path, zero_rows: Sequence[int], doc_len: int, n_read: int,
                     hint: str) -> DataIntegrityError:
    rows = sorted({int(r) for r in zero_rows})
    shown = ", ".join(str(r) for r in rows[:8]) + (", ..." if len(rows) > 8 else "")
    return DataIntegrityError(
        f"{path}: {len(rows)} of the {n_read} rows this read touches are entirely token id 0 "
        f"({doc_len} zeros, never real text; e.g. a mirror that zero-filled rows): row(s) "
        f"{shown}. {hint} `python scripts/check_corpus.py {path.parent}` counts them all.",
        kind="zero_rows", rows=rows[:8])


def open_token_array(path, *, verify: bool = True):
    """Open a 2-D integer zarr array read-only, with clear errors.

    With ``verify`` (the default) two cheap integrity checks run first: every chunk file of the
    chunk grid must be stored (:meth:`ChunkLayout.find_missing`: one directory listing or one
    ``stat`` per chunk, no chunk is read) and meta.json's ``dtype``, when the data dir has one,
    must equal the array's. Both raise :class:`DataIntegrityError`. ``verify=False`` is for
    tools that report damage themselves (scripts/check_corpus.py)."""
    import zarr

    path = Path(path)
    if not path.exists():
        hint = ""
        if path.suffix != ".zarr" and (path / "train.zarr").exists():
            hint = f" (it contains train.zarr: pass {path / 'train.zarr'})"
        raise FileNotFoundError(f"token array not found: {path}{hint}. {_PREPARE_HINT}")
    if path.is_dir() and path.suffix != ".zarr" and (path / "train.zarr").exists():
        raise ValueError(
            f"{path} is a data directory, not a zarr array; pass {path / 'train.zarr'} "
            f"or {path / 'heldout.zarr'}"
        )
    try:
        arr = zarr.open_array(str(path), mode="r")
    except Exception as e:  # zarr raises several types for "not an array"
        raise ValueError(
            f"{path}: could not open as a zarr array ({type(e).__name__}: {e}). {_PREPARE_HINT}"
        ) from e
    if arr.ndim != 2:
        raise ValueError(
            f"{path}: expected a 2-D array (num_docs, doc_len), found {arr.ndim}-D shape {arr.shape}"
        )
    dtype = np.dtype(arr.dtype)
    if not np.issubdtype(dtype, np.integer) or dtype == np.bool_:
        raise ValueError(
            f"{path}: expected an integer dtype of token ids (e.g. uint16), found dtype {dtype}"
        )
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{path}: array is empty, shape {arr.shape}")
    if verify:
        layout = ChunkLayout(arr, path)
        _check_meta_dtype(path, layout)
        count, first = layout.find_missing()
        if count:
            raise missing_chunks_error(layout, count, first, "are missing")
    return arr


def _check_tokens(path: Path, row: int, col0: int, tokens: np.ndarray, vocab_size: int) -> None:
    if tokens.size == 0:
        return
    bad = (tokens >= vocab_size) | (tokens < 0) if np.issubdtype(tokens.dtype, np.signedinteger) \
        else tokens >= vocab_size
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"{path}: row {row}, position {col0 + i} holds token id {int(tokens[i])}, "
            f"outside [0, vocab_size={vocab_size}); {int(bad.sum())} bad ids in this read. "
            f"Is vocab_size right for this data?"
        )


def _read_segments(arr, layout: ChunkLayout, rows: np.ndarray, starts: np.ndarray, length: int,
                   vocab_size: int, bos_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read ``labels[i] = arr[rows[i], starts[i]:starts[i]+length]`` and the matching
    BOS-rolled inputs. Reads are grouped by row (sorted), overlapping/adjacent ranges of a row
    are merged into one slice read, and the original order is restored. Also returns
    ``zero[i]``: row ``rows[i]`` is entirely token id 0 (the caller refuses or skips it)."""
    n = len(rows)
    doc_len = layout.shape[1]
    labels = np.empty((n, length), dtype=np.int64)
    inputs = np.empty((n, length), dtype=np.int64)
    zero = np.zeros(n, dtype=bool)
    order = np.lexsort((starts, rows))  # sort by row, then start
    i = 0
    while i < n:
        r = int(rows[order[i]])
        lo = max(int(starts[order[i]]) - 1, 0)
        hi = int(starts[order[i]]) + length
        j = i + 1
        while j < n and int(rows[order[j]]) == r and int(starts[order[j]]) - 1 <= hi:
            hi = max(hi, int(starts[order[j]]) + length)
            j += 1
        seg = read_block(arr, layout, r, r + 1, lo, hi)
        _check_tokens(layout.path, r, lo, seg, vocab_size)
        # a run of token 0 inside a row may be text; a whole row of it never is, so an all-zero
        # slice costs one read of the rest of the row (rare in real data)
        if not seg.any() and (hi - lo == doc_len
                              or not read_block(arr, layout, r, r + 1, 0, doc_len).any()):
            zero[order[i:j]] = True
        seg = seg.astype(np.int64, copy=False)
        for k in order[i:j]:
            s = int(starts[k])
            labels[k] = seg[s - lo: s - lo + length]
            if s == 0:
                inputs[k, 0] = bos_id
                inputs[k, 1:] = seg[0: length - 1]
            else:
                inputs[k] = seg[s - 1 - lo: s - 1 - lo + length]
        i = j
    return inputs, labels, zero


def _epoch_permutation(n: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Bit-identical to ``np.random.default_rng([seed, epoch]).permutation(n)`` (shuffle of
    an arange runs the same Fisher-Yates draws whatever the dtype), stored as int32 when it
    fits to halve the memory for very large ``n``."""
    dtype = np.int32 if n < 2**31 else np.int64
    perm = np.arange(n, dtype=dtype)
    if shuffle:
        np.random.default_rng([seed, epoch]).shuffle(perm)
    return perm


# --------------------------------------------------------------------------- dataset


class LongCrawl64Dataset:
    """Deterministic, resumable, rank-sharded iterator over ``seq_len`` chunks of a
    LongCrawl64-format zarr array.

    Iterating (``iter(ds)`` / ``ds.next_batch()``) advances the dataset's own read position,
    which :meth:`state_dict` / :meth:`load_state_dict` save and restore exactly. Every
    iterator created from the same dataset shares that position.

    A row that is entirely token id 0 raises :class:`DataIntegrityError`. With
    ``skip_zero_rows=True`` its sequences are skipped instead: each rank fills its batch from
    its own stream (its slices of the global batches, in order), so every batch still holds
    ``batch_size`` sequences, none from a zero row. ``zero_sequences_skipped`` counts them and
    ``zero_rows_found`` the distinct rows. Without zero rows the batches are the same as in the
    default mode; with them the ranks' positions drift apart, so each rank must resume from its
    own :meth:`state_dict`.

    ``vocab_size`` and ``bos_id`` must agree with meta.json when there is one, and so must ``text_escape``
    (``"none"`` or ``"json"``, the ``data.text_escape`` the caller expects) when given; a data dir without
    meta.json (a LongCrawl64 download) is taken at the caller's word.
    """

    def __init__(self, path, seq_len: int, batch_size: int, *, rank: int = 0, world_size: int = 1,
                 vocab_size: int = 50257, bos_id: int = 50256, shuffle: bool = True, seed: int = 0,
                 skip_zero_rows: bool = False, text_escape: str | None = None):
        self.path = Path(path)
        for name, v in (("seq_len", seq_len), ("batch_size", batch_size)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not isinstance(world_size, (int, np.integer)) or world_size < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
        if not isinstance(rank, (int, np.integer)) or not (0 <= rank < world_size):
            raise ValueError(f"rank must satisfy 0 <= rank < world_size={world_size}, got rank={rank!r}")
        self.seq_len = int(seq_len)
        self.batch_size = int(batch_size)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.vocab_size = int(vocab_size)
        self.bos_id = int(bos_id)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.skip_zero_rows = bool(skip_zero_rows)

        self._arr = open_token_array(self.path)
        self._layout = ChunkLayout(self._arr, self.path)
        _check_vocab(self.path, vocab_size, bos_id, text_escape)
        self.num_rows, self.doc_len = (int(x) for x in self._arr.shape)
        if self.doc_len % self.seq_len != 0:
            raise ValueError(
                f"{self.path}: doc_len={self.doc_len} is not a multiple of seq_len={self.seq_len}; "
                f"choose a seq_len that divides {self.doc_len}"
            )
        self.chunks_per_row = self.doc_len // self.seq_len
        self.num_sequences = self.num_rows * self.chunks_per_row
        self.global_batch_size = self.batch_size * self.world_size
        if self.num_sequences < self.global_batch_size:
            raise ValueError(
                f"{self.path}: only {self.num_sequences} sequences of seq_len={self.seq_len} "
                f"({self.num_rows} rows x {self.chunks_per_row}), fewer than one global batch of "
                f"batch_size*world_size={self.batch_size}*{self.world_size}={self.global_batch_size}"
            )
        self.steps_per_epoch = self.num_sequences // self.global_batch_size

        self.epoch = 0
        self.step_in_epoch = 0
        self._perm: np.ndarray | None = None
        self._perm_epoch = -1
        # skip_zero_rows: position in this rank's stream of the epoch, skip count, and which rows
        # are known to be zero (one byte per row, allocated on the first zero row)
        self._pos = 0
        self.zero_sequences_skipped = 0
        self._zero_row_mask: np.ndarray | None = None

    # ------------------------------------------------------------------ iteration
    def _permutation(self, epoch: int) -> np.ndarray:
        if self._perm_epoch != epoch:
            self._perm = _epoch_permutation(self.num_sequences, self.seed, epoch, self.shuffle)
            self._perm_epoch = epoch
        return self._perm

    def sequence_indices(self, epoch: int, step: int) -> np.ndarray:
        """Global sequence indices this rank reads at (epoch, step)."""
        perm = self._permutation(epoch)
        g0 = step * self.global_batch_size + self.rank * self.batch_size
        return perm[g0: g0 + self.batch_size].astype(np.int64)

    def read_sequences(self, seq_idx: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels) int64 tensors of shape (len(seq_idx), seq_len) for sequence indices."""
        seq_idx = np.asarray(seq_idx, dtype=np.int64)
        if seq_idx.size and (seq_idx.min() < 0 or seq_idx.max() >= self.num_sequences):
            raise IndexError(f"sequence index out of range [0, {self.num_sequences})")
        rows = seq_idx // self.chunks_per_row
        starts = (seq_idx % self.chunks_per_row) * self.seq_len
        inputs, labels, zero = _read_segments(self._arr, self._layout, rows, starts, self.seq_len,
                                              self.vocab_size, self.bos_id)
        if zero.any():
            raise _zero_rows_error(
                self.path, rows[zero], self.doc_len, len(np.unique(rows)),
                "To train on the other rows pass skip_zero_rows=True (train.py: data.skip_zero_rows=true; "
                "their sequences are then skipped and counted).")
        return torch.from_numpy(inputs), torch.from_numpy(labels)

    @property
    def zero_rows_found(self) -> int:
        """Distinct all-zero rows met so far (``skip_zero_rows=True``)."""
        return 0 if self._zero_row_mask is None else int(self._zero_row_mask.sum())

    def _stream_indices(self, epoch: int, pos: int, n: int) -> np.ndarray:
        """Sequences at positions ``pos .. pos+n-1`` of this rank's stream of ``epoch``: the
        concatenation of its slices ``perm[t*G + r*B : t*G + (r+1)*B]`` over the steps ``t``."""
        q = np.arange(pos, pos + n)
        t, j = np.divmod(q, self.batch_size)
        perm = self._permutation(epoch)
        return perm[t * self.global_batch_size + self.rank * self.batch_size + j].astype(np.int64)

    def _read_skipping(self, seq_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(inputs, labels, keep) for ``seq_idx``; sequences of known zero rows are not read."""
        rows = seq_idx // self.chunks_per_row
        keep = np.ones(len(seq_idx), dtype=bool)
        if self._zero_row_mask is not None:
            keep &= ~self._zero_row_mask[rows]
        inputs, labels, zero = _read_segments(
            self._arr, self._layout, rows[keep], (seq_idx[keep] % self.chunks_per_row) * self.seq_len,
            self.seq_len, self.vocab_size, self.bos_id)
        if zero.any():
            if self._zero_row_mask is None:
                self._zero_row_mask = np.zeros(self.num_rows, dtype=bool)
            self._zero_row_mask[rows[keep][zero]] = True
        keep[np.flatnonzero(keep)[zero]] = False
        return inputs[~zero], labels[~zero], keep

    def _next_batch_skipping(self) -> tuple[torch.Tensor, torch.Tensor]:
        stream_len = self.steps_per_epoch * self.batch_size
        xs, ys, have, run = [], [], 0, 0
        while have < self.batch_size:
            if self._pos >= stream_len:
                self.epoch, self._pos = self.epoch + 1, 0
            n = min(self.batch_size - have, stream_len - self._pos)
            x, y, keep = self._read_skipping(self._stream_indices(self.epoch, self._pos, n))
            self._pos += n
            skipped = int((~keep).sum())
            self.zero_sequences_skipped += skipped
            xs.append(x)
            ys.append(y)
            have += len(x)
            run = 0 if len(x) else run + skipped
            if run >= stream_len:  # a whole epoch of this rank's stream without one usable sequence
                raise DataIntegrityError(
                    f"{self.path}: rank {self.rank} read {run} sequences in a row, a whole epoch of "
                    f"its stream, and every one lies in an all-zero row ({self.zero_rows_found} "
                    f"such rows found); there is nothing to train on. Check the data dir with "
                    f"`python scripts/check_corpus.py {self.path.parent}`.",
                    kind="zero_rows")
        self.step_in_epoch = self._pos // self.batch_size
        return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.skip_zero_rows:
            return self._next_batch_skipping()
        if self.step_in_epoch >= self.steps_per_epoch:
            self.epoch += 1
            self.step_in_epoch = 0
        idx = self.sequence_indices(self.epoch, self.step_in_epoch)
        batch = self.read_sequences(idx)
        self.step_in_epoch += 1
        return batch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def __len__(self) -> int:
        return self.steps_per_epoch

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Position of the *next* batch to be read, plus the settings that define the order.
        With ``skip_zero_rows`` the position is ``position_in_epoch`` in this rank's stream."""
        sd = {
            "epoch": int(self.epoch),
            "step_in_epoch": int(self.step_in_epoch),
            "seed": self.seed,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "shuffle": self.shuffle,
            "num_sequences": self.num_sequences,
            "rank": self.rank,
            "path": str(self.path),
        }
        if self.skip_zero_rows:  # only then: a default-mode state keeps the keys of older checkpoints
            sd.update(skip_zero_rows=True, position_in_epoch=int(self._pos),
                      zero_sequences_skipped=int(self.zero_sequences_skipped))
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore the read position. ``rank`` and ``path`` are informational (a rank may load
        another rank's state, except with ``skip_zero_rows``, where positions are per rank); the
        settings that define the order must match."""
        for key in ("epoch", "step_in_epoch"):
            if key not in sd:
                raise KeyError(f"data state_dict lacks {key!r}; found keys {sorted(sd)}")
        for key in ("seq_len", "world_size", "seed", "batch_size", "shuffle", "num_sequences"):
            if key in sd and sd[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume data order for {self.path}: checkpoint has {key}={sd[key]!r} "
                    f"but this dataset has {key}={getattr(self, key)!r}"
                )
        epoch, step = int(sd["epoch"]), int(sd["step_in_epoch"])
        if epoch < 0 or not (0 <= step <= self.steps_per_epoch):
            raise ValueError(
                f"invalid data state: epoch={epoch}, step_in_epoch={step} "
                f"(steps_per_epoch={self.steps_per_epoch})"
            )
        if "position_in_epoch" in sd:  # written with skip_zero_rows=True
            self._load_skipping_position(sd)
        else:  # a default-mode state is also a valid skipping position (same order so far)
            self._pos = step * self.batch_size
        self.epoch, self.step_in_epoch = epoch, step

    def _load_skipping_position(self, sd: dict[str, Any]) -> None:
        if not self.skip_zero_rows:
            raise ValueError(
                f"cannot resume data order for {self.path}: the checkpoint was written with "
                f"skip_zero_rows=True (it skipped {sd.get('zero_sequences_skipped')} sequences of "
                f"all-zero rows); resume with skip_zero_rows=True")
        if self.world_size > 1 and int(sd.get("rank", self.rank)) != self.rank:
            raise ValueError(
                f"cannot resume data order for {self.path}: with skip_zero_rows=True each rank "
                f"has its own position, but rank {self.rank} was given rank {sd.get('rank')}'s "
                f"state; save and load the data state per rank")
        pos = int(sd["position_in_epoch"])
        if not (0 <= pos <= self.steps_per_epoch * self.batch_size):
            raise ValueError(f"invalid data state: position_in_epoch={pos} (stream length "
                             f"{self.steps_per_epoch * self.batch_size})")
        self._pos = pos
        self.zero_sequences_skipped = int(sd.get("zero_sequences_skipped", 0))

    def __repr__(self) -> str:
        skip = ", skip_zero_rows=True" if self.skip_zero_rows else ""
        return (f"LongCrawl64Dataset({str(self.path)!r}, rows={self.num_rows}, doc_len={self.doc_len}, "
                f"seq_len={self.seq_len}, batch_size={self.batch_size}, rank={self.rank}/"
                f"{self.world_size}, steps_per_epoch={self.steps_per_epoch}{skip})")


# --------------------------------------------------------------------------- evaluation


def read_rows(path, rows, length: int, *, bos_id: int = 50256, vocab_size: int = 50257,
              text_escape: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``length`` tokens of each given row, for evaluation.

    Returns ``(inputs, labels)`` int64 tensors of shape ``(len(rows), length)`` with
    ``labels = row[:length]`` and ``inputs = [bos_id, row[0], ..., row[length-2]]``.
    ``length`` may exceed the training ``seq_len`` but not ``doc_len``. A requested row that is
    entirely token id 0 raises :class:`DataIntegrityError` (there is no skipping here). ``text_escape`` is
    checked against meta.json as in :class:`LongCrawl64Dataset`.
    """
    path = Path(path)
    arr = open_token_array(path)
    _check_vocab(path, vocab_size, bos_id, text_escape)
    num_rows, doc_len = (int(x) for x in arr.shape)
    if not isinstance(length, (int, np.integer)) or not (0 < length <= doc_len):
        raise ValueError(f"{path}: length must satisfy 0 < length <= doc_len={doc_len}, got {length!r}")
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if rows.size == 0:
        raise ValueError("read_rows: no rows requested")
    if rows.min() < 0 or rows.max() >= num_rows:
        bad = rows[(rows < 0) | (rows >= num_rows)][0]
        raise IndexError(f"{path}: row {int(bad)} out of range; the array has {num_rows} rows")
    inputs, labels, zero = _read_segments(arr, ChunkLayout(arr, path), rows, np.zeros_like(rows),
                                          int(length), int(vocab_size), int(bos_id))
    if zero.any():  # evaluation reads the rows it was asked for: never silently fewer
        raise _zero_rows_error(path, rows[zero], doc_len, len(np.unique(rows)),
                               "Evaluate on other rows, or repair the data.")
    return torch.from_numpy(inputs), torch.from_numpy(labels)
