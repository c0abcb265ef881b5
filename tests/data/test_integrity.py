"""Damaged data: the reader and scripts/check_corpus.py must refuse it, naming the array and the
chunk/rows, never train on zeros. Tiny data dirs are damaged the way real ones get damaged:
chunk files deleted or truncated, zarr.json's data_type edited, rows zero-filled."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from forgetting_transformer.data.integrity import ChunkLayout, DataIntegrityError
from forgetting_transformer.data.longcrawl64 import LongCrawl64Dataset, open_token_array, read_rows

ROOT = Path(__file__).resolve().parents[2]
VOCAB, BOS, DOC_LEN = 5000, 0, 16


def rows_data(n, doc_len=DOC_LEN):
    """Row r holds r*100 + 1 + arange(doc_len): never zero."""
    return (np.arange(n)[:, None] * 100 + 1 + np.arange(doc_len)[None, :]).astype(np.uint16)


def make_array(path, data, chunks=None, zarr_format=3, **kw):
    # write_empty_chunks: keep all-zero chunks as files (zarr 3 leaves them out by default)
    arr = zarr.create_array(store=str(path), shape=data.shape, dtype=data.dtype,
                            chunks=chunks or (1, data.shape[1]), zarr_format=zarr_format,
                            config={"write_empty_chunks": True}, **kw)
    arr[...] = data
    return Path(path)


def make_data_dir(d, n_train=8, n_heldout=4, train=None):
    """train.zarr/heldout.zarr (zarr v3, chunks (1, 16) like prepare.py) + meta.json + documents.jsonl."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    make_array(d / "train.zarr", rows_data(n_train) if train is None else train)
    make_array(d / "heldout.zarr", rows_data(n_heldout))
    meta = {"vocab_size": VOCAB, "bos_id": BOS, "doc_len": DOC_LEN, "dtype": "uint16",
            "num_train_rows": n_train, "num_heldout_rows": n_heldout}
    (d / "meta.json").write_text(json.dumps(meta))
    docs = [{"split": "train", "source": "a.txt", "tokens": n_train * DOC_LEN + 5, "first_row": 0,
             "rows": n_train, "dropped": None},
            {"split": "heldout", "source": "b.txt", "tokens": n_heldout * DOC_LEN, "first_row": 0,
             "rows": n_heldout, "dropped": None}]
    (d / "documents.jsonl").write_text("".join(json.dumps(x) + "\n" for x in docs))
    return d


def ds(path, seq_len=8, batch_size=2, **kw):
    return LongCrawl64Dataset(path, seq_len, batch_size, vocab_size=VOCAB, bos_id=BOS, **kw)


def set_data_type(arr_path, dtype):
    """Edit the array metadata's dtype in place (zarr.json data_type / .zarray dtype)."""
    if (arr_path / "zarr.json").exists():
        meta = json.loads((arr_path / "zarr.json").read_text())
        meta["data_type"] = dtype
        (arr_path / "zarr.json").write_text(json.dumps(meta))
    else:
        meta = json.loads((arr_path / ".zarray").read_text())
        meta["dtype"] = {"uint8": "|u1"}[dtype]
        (arr_path / ".zarray").write_text(json.dumps(meta))


def check_corpus(*args, env=None):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "check_corpus.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=env)


# --------------------------------------------------------------------------- missing chunks


LAYOUTS = [  # (create kwargs, chunk file holding row 3, its description, another one)
    (dict(), "c/3/0", "c/3/0 (row 3)", "c/5/0"),
    (dict(zarr_format=2), "3.0", "3.0 (row 3)", "5.0"),
    (dict(zarr_format=2, chunk_key_encoding={"name": "v2", "separator": "/"}), "3/0", "3/0 (row 3)", "5/0"),
    (dict(chunks=(2, 8)), "c/1/1", "c/1/1 (rows 2-3, cols 8-15)", "c/2/0"),
    (dict(chunks=(1, 8), shards=(2, 16)), "c/1/0", "c/1/0 (rows 2-3)", "c/2/0"),  # shard files
]


@pytest.mark.parametrize("kw, key, desc, other", LAYOUTS)
def test_missing_chunks_refused_at_open(tmp_path, kw, key, desc, other):
    p = make_array(tmp_path / "train.zarr", rows_data(8), **kw)
    nchunks = ChunkLayout(zarr.open_array(str(p), mode="r"), p).nchunks
    ds(p)  # intact: fine
    os.remove(p / key)
    os.remove(p / other)
    pattern = rf"train\.zarr: 2 of {nchunks} chunk files are missing: {re.escape(desc)}, {other} "
    with pytest.raises(DataIntegrityError, match=pattern) as e:
        ds(p)
    assert e.value.kind == "missing_chunks" and e.value.chunks == [key, other]
    with pytest.raises(DataIntegrityError, match=pattern):
        read_rows(p, [0], 8, bos_id=BOS, vocab_size=VOCAB)
    with pytest.raises(DataIntegrityError, match=r"fill_value=0.*check_corpus\.py"):
        open_token_array(p)
    open_token_array(p, verify=False)  # for tools that report damage themselves


def test_missing_count_shows_first_few_and_ignores_stray_files(tmp_path):
    p = make_array(tmp_path / "train.zarr", rows_data(40), zarr_format=2)
    for r in range(10, 30):
        os.remove(p / f"{r}.0")
    for stray in ("99.0", "010.0", "notes.txt", "10.0.bak"):  # none of them is chunk 10 or in the grid
        (p / stray).write_bytes(b"x")
    with pytest.raises(DataIntegrityError,
                       match=r"20 of 40 chunk files are missing: 10\.0 \(row 10\), 11\.0 \(row 11\), "
                             r"12\.0 \(row 12\), 13\.0 \(row 13\), 14\.0 \(row 14\), \.\.\. \(15 more\)"):
        ds(p)


def test_chunk_deleted_after_open_caught_at_read(tmp_path):
    p = make_array(tmp_path / "train.zarr", rows_data(4))
    d = ds(p, seq_len=8, batch_size=2, shuffle=False)  # batch t reads row t
    x, y = d.next_batch()
    assert y[0].tolist() == (1 + np.arange(8)).tolist()
    os.remove(p / "c/1/0")
    with pytest.raises(DataIntegrityError,
                       match=r"train\.zarr: 1 of 4 chunk files needed by this read are missing: c/1/0 \(row 1\)"):
        d.next_batch()
    with pytest.raises(DataIntegrityError, match=r"c/1/0 \(row 1\)"):
        d.next_batch()  # the failed batch did not advance the position: no silent skip past it
    with pytest.raises(DataIntegrityError, match=r"1 of 4 chunk files are missing: c/1/0 \(row 1\)"):
        read_rows(p, [2], 8, bos_id=BOS, vocab_size=VOCAB)  # opens the array again: refused at open


# --------------------------------------------------------------------------- corrupt chunks


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
@pytest.mark.parametrize("zarr_format, key", [(3, "c/2/0"), (2, "2.0")])
def test_corrupt_chunk_named_with_data_dir(tmp_path, damage, zarr_format, key):
    d = tmp_path / "data"
    p = make_array(d / "train.zarr", rows_data(4), zarr_format=zarr_format)
    raw = (p / key).read_bytes()
    (p / key).write_bytes(raw[: len(raw) // 2] if damage == "truncate" else raw[:4] + bytes(range(40)))
    d_ = ds(p, seq_len=16, batch_size=1, shuffle=False)
    d_.next_batch()
    d_.next_batch()
    pattern = (rf"train\.zarr: chunk {key} \(row 2\) of data dir {d} could not be decoded "
               rf"\(RuntimeError: Zstd decompression error.*the chunk file {p / key} is corrupt or truncated")
    with pytest.raises(DataIntegrityError, match=pattern) as e:
        d_.next_batch()
    assert e.value.kind == "undecodable_chunk" and e.value.rows == [2]
    assert isinstance(e.value.__cause__, RuntimeError)  # chained from numcodecs' error
    with pytest.raises(DataIntegrityError, match=pattern):
        read_rows(p, [0, 2], 16, bos_id=BOS, vocab_size=VOCAB)


def test_corrupt_chunk_found_among_several_in_one_read(tmp_path):
    p = make_array(tmp_path / "train.zarr", rows_data(2, 32), chunks=(1, 8))
    raw = (p / "c/1/2").read_bytes()
    (p / "c/1/2").write_bytes(raw[:-3])
    with pytest.raises(DataIntegrityError, match=r"chunk c/1/2 \(row 1, cols 16-23\)"):
        read_rows(p, [1], 32, bos_id=BOS, vocab_size=VOCAB)


# --------------------------------------------------------------------------- dtype


def test_dtype_edit_refused_at_open_against_meta_json(tmp_path):
    d = make_data_dir(tmp_path / "data")
    set_data_type(d / "train.zarr", "uint8")
    with pytest.raises(DataIntegrityError,
                       match=r"train\.zarr: the array's dtype is uint8 \(.*zarr\.json\) but .*meta\.json "
                             r"says dtype=uint16: the stored dtype does not match"):
        ds(d / "train.zarr")


@pytest.mark.parametrize("zarr_format, meta_file", [(3, "zarr.json"), (2, ".zarray")])
def test_dtype_edit_without_meta_json_named_at_read(tmp_path, zarr_format, meta_file):
    p = make_array(tmp_path / "heldout.zarr", rows_data(4), zarr_format=zarr_format)
    set_data_type(p, "uint8")
    with pytest.raises(DataIntegrityError,
                       match=rf"heldout\.zarr: chunk \S+ \(row 0\) of data dir {tmp_path}: the stored dtype "
                             rf"uint8 \({p / meta_file}\) does not match the chunk data: the chunk decodes "
                             rf"to 32 bytes for 16 elements, 2 bytes per element") as e:
        read_rows(p, [0], 16, bos_id=BOS, vocab_size=VOCAB)
    assert e.value.kind == "dtype_mismatch" and isinstance(e.value.__cause__, ValueError)
    with pytest.raises(DataIntegrityError, match="does not match the chunk data"):
        ds(p).next_batch()


# --------------------------------------------------------------------------- all-zero rows


def test_zero_rows_refused(tmp_path):
    data = rows_data(6)
    data[[2, 4]] = 0
    data[1, :8] = 0  # a run of token 0 inside a row: not a zero row
    p = make_array(tmp_path / "train.zarr", data)
    d = ds(p, seq_len=8, batch_size=1, shuffle=False)
    d.next_batch()
    d.next_batch()  # row 0
    x, y = d.next_batch()  # row 1's first half: all zero, the row is not
    assert y[0].tolist() == [0] * 8
    d.next_batch()
    with pytest.raises(DataIntegrityError,
                       match=r"train\.zarr: 1 of the 1 rows this read touches are entirely token id 0 "
                             r"\(16 zeros.*row\(s\) 2\. To train on the other rows pass skip_zero_rows=True") as e:
        d.next_batch()
    assert e.value.kind == "zero_rows" and e.value.rows == [2]
    with pytest.raises(DataIntegrityError, match=r"2 of the 3 rows .* row\(s\) 2, 4\. Evaluate on other rows"):
        read_rows(p, [4, 0, 2], 8, bos_id=BOS, vocab_size=VOCAB)
    x, y = read_rows(p, [1], 8, bos_id=BOS, vocab_size=VOCAB)  # a zero prefix of a text row: fine
    assert y.tolist() == [[0] * 8]


def test_zero_rows_zarr_left_out_are_missing_chunks(tmp_path):
    # zarr 3 does not store a chunk that equals fill_value: a zero-filled row written with the
    # defaults is a missing chunk file, refused at open
    arr = zarr.create_array(str(tmp_path / "train.zarr"), shape=(4, 16), chunks=(1, 16), dtype="uint16")
    data = rows_data(4)
    data[3] = 0
    arr[...] = data
    with pytest.raises(DataIntegrityError, match=r"1 of 4 chunk files are missing: c/3/0 \(row 3\)"):
        ds(tmp_path / "train.zarr")


def seqs(y):
    return [tuple(r) for r in y.tolist()]


class RowRecorder:
    """Stands in for the zarr array and records the row of every read."""

    def __init__(self, arr):
        self.arr, self.rows = arr, []

    def __getitem__(self, key):
        self.rows.append(key[0])
        return self.arr[key]


def test_skip_zero_rows_skips_and_counts(tmp_path):
    data = rows_data(6)
    data[[1, 4]] = 0
    p = make_array(tmp_path / "train.zarr", data)
    strict, skip = ds(p, 8, 2, seed=3), ds(p, 8, 2, seed=3, skip_zero_rows=True)  # 12 sequences
    # the skipping order is the default order without the zero rows' sequences
    perm = np.random.default_rng([3, 0]).permutation(12)
    expect = [tuple(rows_data(6)[s // 2, (s % 2) * 8:(s % 2) * 8 + 8]) for s in perm if s // 2 not in (1, 4)]
    got = []
    for _ in range(4):
        x, y = skip.next_batch()
        assert x.shape == y.shape == (2, 8)
        assert (y != 0).any(dim=1).all() and (x[:, 1:] != 0).any(dim=1).all()
        got += seqs(y)
    assert got == expect
    # every zero-row sequence the stream passed over so far was counted
    passed = perm[:skip.state_dict()["position_in_epoch"]] // 2
    assert np.isin(passed, [1, 4]).sum() >= 1
    assert skip.zero_sequences_skipped == np.isin(passed, [1, 4]).sum()
    assert skip.zero_rows_found == len(set(passed) & {1, 4})
    assert skip.state_dict()["zero_sequences_skipped"] == skip.zero_sequences_skipped
    for _ in range(4):  # epoch 0 holds 8 usable sequences: these 4 batches come from epoch 1
        assert (skip.next_batch()[1] != 0).any(dim=1).all()
    sd = skip.state_dict()
    passed1 = np.random.default_rng([3, 1]).permutation(12)[:sd["position_in_epoch"]] // 2
    assert sd["epoch"] == 1 and skip.zero_sequences_skipped == 4 + np.isin(passed1, [1, 4]).sum()
    assert skip.zero_rows_found == 2
    skip._arr = RowRecorder(skip._arr)  # rows known to be zero are not read again
    for _ in range(6):
        skip.next_batch()
    assert skip._arr.rows and not set(skip._arr.rows) & {1, 4}
    with pytest.raises(DataIntegrityError, match=r"row\(s\) [14]\."):
        for _ in range(strict.steps_per_epoch):
            strict.next_batch()


def test_skip_zero_rows_same_batches_without_zero_rows_and_resumes(tmp_path):
    p = make_array(tmp_path / "train.zarr", rows_data(4))
    a, b = ds(p, 8, 3, seed=1), ds(p, 8, 3, seed=1, skip_zero_rows=True)
    for _ in range(5):  # crosses an epoch boundary (2 steps per epoch)
        assert torch.equal(a.next_batch()[1], b.next_batch()[1])

    data = rows_data(8)
    data[[0, 5, 6]] = 0
    q = make_array(tmp_path / "zeros.zarr", data)
    ref = ds(q, 8, 3, seed=2, skip_zero_rows=True)
    batches = [ref.next_batch()[1] for _ in range(9)]
    for k in (2, 5):
        first = ds(q, 8, 3, seed=2, skip_zero_rows=True)
        for _ in range(k):
            first.next_batch()
        sd = json.loads(json.dumps(first.state_dict()))
        again = ds(q, 8, 3, seed=2, skip_zero_rows=True)
        again.load_state_dict(sd)
        for j in range(k, 9):
            assert torch.equal(again.next_batch()[1], batches[j]), (k, j)
    with pytest.raises(ValueError, match="written with skip_zero_rows=True"):
        ds(q, 8, 3, seed=2).load_state_dict(sd)
    other = ds(q, 8, 1, seed=2, rank=1, world_size=3, skip_zero_rows=True)
    with pytest.raises(ValueError, match="rank 1 was given rank 0's state"):
        other.load_state_dict(ds(q, 8, 1, seed=2, rank=0, world_size=3, skip_zero_rows=True).state_dict())


def test_skip_zero_rows_all_zero_array_raises(tmp_path):
    p = make_array(tmp_path / "train.zarr", np.zeros((3, 16), np.uint16))
    d = ds(p, 8, 2, skip_zero_rows=True)
    with pytest.raises(DataIntegrityError, match=r"every one lies in an all-zero row \(3 such rows found\)"):
        d.next_batch()


# --------------------------------------------------------------------------- check_corpus.py


def test_check_corpus_clean_prepared_dir(tmp_path):
    from forgetting_transformer.data.prepare import EMBEDDED_CORPUS, prepare_corpus

    meta = prepare_corpus([str(EMBEDDED_CORPUS)], tmp_path / "d", vocab_size=300, doc_len=1024,
                          heldout_docs=1, max_docs=3, progress=False)
    res = check_corpus(tmp_path / "d")
    assert res.returncode == 0, res.stdout + res.stderr
    out, n = res.stdout, meta["num_train_rows"]
    assert f"train.zarr: {n} rows x doc_len 1,024, uint16, zarr v3, chunks (1, 1024) -> {n} chunk files" in out
    assert f"chunk files: all {n} present" in out and f"rows read: {n} of {n} (all)" in out
    assert "all-zero rows: 0" in out and "(within [0, vocab_size=300))" in out
    assert f"documents.jsonl: 2 documents, 2 kept ({n} rows), 0 dropped" in out
    assert out.rstrip().endswith(f"no problems found in {tmp_path / 'd'}")


def test_check_corpus_reports_damage(tmp_path):
    data = rows_data(40)
    data[[30, 31, 33]] = 0
    data[21, 5] = VOCAB + 7
    d = make_data_dir(tmp_path / "d", n_train=40, train=data)
    os.remove(d / "train.zarr/c/3/0")
    raw = (d / "train.zarr/c/8/0").read_bytes()
    (d / "train.zarr/c/8/0").write_bytes(raw[: len(raw) // 2])
    set_data_type(d / "heldout.zarr", "uint8")
    res = check_corpus(d, "--sample", 20, "--progress-every", 0)
    assert res.returncode == 1, res.stdout + res.stderr
    out = res.stdout
    assert "PROBLEM: 1 of 40 chunk files missing: c/3/0 (row 3)" in out
    # --sample 20 of 40 rows: 0, 2, 4, 6, 8, ..., 21, ..., 29, 31, 33, ... (not 3 or 30)
    assert "PROBLEM: 1 chunk(s) do not decode: c/8/0 (row 8)" in out
    assert "Zstd decompression error" in out
    assert "PROBLEM: 2 all-zero rows (entirely token id 0): 31, 33" in out  # the sampled ones
    assert "PROBLEM: 1 token ids outside [0, vocab_size=5000); first: row 21, position 5 holds 5007" in out
    assert ("PROBLEM: meta.json says dtype=uint16 but heldout.zarr's zarr.json says uint8" in out)
    assert "PROBLEM: 4 chunk(s) do not decode: c/0/0 (row 0)" in out and "2 bytes per element" in out
    assert out.rstrip().endswith(f"6 problem(s) in {d}")
    assert "  reading train.zarr: 10/20 rows (50%) | " in res.stderr  # a progress line per row read
    assert "Traceback" not in res.stderr


def test_check_corpus_usage_errors(tmp_path):
    res = check_corpus(tmp_path / "nope")
    assert res.returncode == 1 and res.stderr.strip() == f"error: data dir not found: {tmp_path / 'nope'}"
    res = check_corpus(tmp_path)
    assert res.returncode == 1 and "error: " in res.stderr and "neither train.zarr nor heldout.zarr" in res.stderr
    assert "Traceback" not in res.stderr


def test_check_corpus_progress_interval(tmp_path):
    """A line per block read at FOX_PROGRESS_SECONDS=0 (the default interval when --progress-every is not
    given), none for a quick check at the default 10 s; a bad interval is a usage error, not a traceback."""
    d = make_data_dir(tmp_path / "d", n_train=40)
    env = {k: v for k, v in os.environ.items() if k != "FOX_PROGRESS_SECONDS"}
    res = check_corpus(d, env=env)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    res = check_corpus(d, env={**env, "FOX_PROGRESS_SECONDS": "0"})
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [line.split(" | ")[0] for line in res.stderr.splitlines()]
    assert lines == ["  reading train.zarr: 40/40 rows (100%)", "  reading heldout.zarr: 4/4 rows (100%)"]
    res = check_corpus(d, "--progress-every", 60, env={**env, "FOX_PROGRESS_SECONDS": "0"})
    assert res.returncode == 0 and res.stderr == ""  # the flag wins over the environment
    res = check_corpus(d, env={**env, "FOX_PROGRESS_SECONDS": "soon"})
    assert res.returncode == 2 and "FOX_PROGRESS_SECONDS='soon': expected a number of seconds" in res.stderr
    res = check_corpus(d, "--progress-every", -1)
    assert res.returncode == 2 and "--progress-every must be >= 0, got -1.0" in res.stderr
    assert "Traceback" not in res.stderr
