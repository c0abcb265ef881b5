"""Tests for the LongCrawl64 reader (tiny synthetic zarr arrays)."""

import json

import numpy as np
import pytest
import torch
import zarr

from forgetting_transformer.data.longcrawl64 import LongCrawl64Dataset, load_meta, read_rows

VOCAB = 60000
BOS = 59999


def make_zarr(path, num_rows, doc_len, dtype=np.uint16, data=None, zarr_format=3, chunks=None):
    """Row r holds r*1000 + arange(doc_len)."""
    if data is None:
        data = (np.arange(num_rows)[:, None] * 1000 + np.arange(doc_len)[None, :]).astype(dtype)
    arr = zarr.create_array(store=str(path), shape=data.shape, dtype=data.dtype,
                            chunks=chunks or (1, data.shape[1]), zarr_format=zarr_format)
    arr[...] = data
    return path


def row(r, doc_len):
    return r * 1000 + np.arange(doc_len)


def expected_seq(s, seq_len, doc_len):
    """Independent expectation for global sequence index s."""
    cpr = doc_len // seq_len
    r, c = divmod(s, cpr)
    full = row(r, doc_len)
    rolled = np.concatenate([[BOS], full[:-1]])
    start = c * seq_len
    return rolled[start:start + seq_len], full[start:start + seq_len]


def ds(path, seq_len, batch_size, **kw):
    kw.setdefault("vocab_size", VOCAB)
    kw.setdefault("bos_id", BOS)
    return LongCrawl64Dataset(path, seq_len, batch_size, **kw)


# --------------------------------------------------------------------------- content


def test_exact_content_unshuffled(tmp_path):
    p = make_zarr(tmp_path / "train.zarr", num_rows=3, doc_len=16)
    d = ds(p, seq_len=4, batch_size=2, shuffle=False)
    assert d.num_sequences == 12 and d.steps_per_epoch == 6
    x, y = d.next_batch()
    assert x.dtype == torch.int64 and y.dtype == torch.int64 and x.shape == (2, 4)
    # first chunk of row 0: BOS then row[0:3]; second chunk starts mid-row: row[3:7]
    assert x.tolist() == [[BOS, 0, 1, 2], [3, 4, 5, 6]]
    assert y.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    x, y = d.next_batch()
    assert x.tolist() == [[7, 8, 9, 10], [11, 12, 13, 14]]
    assert y.tolist() == [[8, 9, 10, 11], [12, 13, 14, 15]]
    x, y = d.next_batch()  # row 1
    assert x.tolist() == [[BOS, 1000, 1001, 1002], [1003, 1004, 1005, 1006]]
    assert y.tolist() == [[1000, 1001, 1002, 1003], [1004, 1005, 1006, 1007]]


def test_shuffled_order_follows_seeded_permutation(tmp_path):
    doc_len, seq_len, B = 32, 8, 3
    p = make_zarr(tmp_path / "train.zarr", num_rows=5, doc_len=doc_len)
    d = ds(p, seq_len, B, seed=7)
    n = 5 * 4
    assert d.num_sequences == n and d.steps_per_epoch == n // B == 6
    for epoch in range(3):
        perm = np.random.default_rng([7, epoch]).permutation(n)
        for t in range(d.steps_per_epoch):
            x, y = d.next_batch()
            for i, s in enumerate(perm[t * B:(t + 1) * B]):
                ex, ey = expected_seq(int(s), seq_len, doc_len)
                assert x[i].tolist() == ex.tolist()
                assert y[i].tolist() == ey.tolist()
    assert d.state_dict()["epoch"] == 2


def test_determinism_and_epochs_differ(tmp_path):
    p = make_zarr(tmp_path / "train.zarr", num_rows=8, doc_len=32)
    a, b, c = ds(p, 8, 4, seed=1), ds(p, 8, 4, seed=1), ds(p, 8, 4, seed=2)
    ep_a = [a.next_batch()[1] for _ in range(a.steps_per_epoch)]
    ep_b = [b.next_batch()[1] for _ in range(b.steps_per_epoch)]
    ep_c = [c.next_batch()[1] for _ in range(c.steps_per_epoch)]
    assert all(torch.equal(u, v) for u, v in zip(ep_a, ep_b))
    assert not all(torch.equal(u, v) for u, v in zip(ep_a, ep_c))
    ep_a2 = [a.next_batch()[1] for _ in range(a.steps_per_epoch)]
    first_tokens = lambda ep: torch.cat(ep)[:, 0].tolist()  # noqa: E731
    assert first_tokens(ep_a) != first_tokens(ep_a2)
    # every epoch (no remainder here) covers every sequence exactly once
    assert sorted(first_tokens(ep_a)) == sorted(first_tokens(ep_a2))
    assert len(set(first_tokens(ep_a))) == a.num_sequences


def test_remainder_dropped_each_epoch(tmp_path):
    p = make_zarr(tmp_path / "train.zarr", num_rows=3, doc_len=16)  # 12 sequences
    d = ds(p, 4, 5, shuffle=False)
    assert d.steps_per_epoch == 2
    ys = [d.next_batch()[1][:, 0].tolist() for _ in range(3)]
    # epoch 0: sequences 0..9; epoch 1 restarts at sequence 0 (10, 11 dropped)
    assert ys[0] == [0, 4, 8, 12, 1000]
    assert ys[1] == [1004, 1008, 1012, 2000, 2004]
    assert ys[2] == ys[0]
    assert d.state_dict()["epoch"] == 1 and d.state_dict()["step_in_epoch"] == 1


def test_iter_is_infinite_and_matches_next_batch(tmp_path):
    p = make_zarr(tmp_path / "train.zarr", num_rows=2, doc_len=8)
    a, b = ds(p, 4, 2, seed=3), ds(p, 4, 2, seed=3)
    it = iter(a)
    for _ in range(7):  # 3.5 epochs
        xa, ya = next(it)
        xb, yb = b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_rank_sharding(tmp_path):
    p = make_zarr(tmp_path / "train.zarr", num_rows=6, doc_len=32)
    r0 = ds(p, 8, 3, rank=0, world_size=2, seed=5)
    r1 = ds(p, 8, 3, rank=1, world_size=2, seed=5)
    single = ds(p, 8, 6, seed=5)  # same global batch size, one rank
    assert r0.steps_per_epoch == r1.steps_per_epoch == single.steps_per_epoch == 4
    seen = set()
    for _ in range(r0.steps_per_epoch):
        y0, y1, yg = r0.next_batch()[1], r1.next_batch()[1], single.next_batch()[1]
        k0 = {tuple(v) for v in y0.tolist()}
        k1 = {tuple(v) for v in y1.tolist()}
        assert not k0 & k1
        assert torch.equal(torch.cat([y0, y1]), yg)
        seen |= k0 | k1
    assert len(seen) == 24


def test_state_dict_round_trip_across_epoch_boundary(tmp_path):
    p = make_zarr(tmp_path / "train.zarr", num_rows=4, doc_len=16)
    ref = ds(p, 4, 3, seed=11)  # 16 sequences -> 5 steps/epoch
    assert ref.steps_per_epoch == 5
    ref_batches = [ref.next_batch() for _ in range(12)]
    for k in (0, 3, 5, 7):
        a = ds(p, 4, 3, seed=11)
        for _ in range(k):
            a.next_batch()
        sd = a.state_dict()
        sd = json.loads(json.dumps(sd))  # survives serialization
        b = ds(p, 4, 3, seed=11)
        b.load_state_dict(sd)
        for j in range(k, 12):
            x, y = b.next_batch()
            assert torch.equal(x, ref_batches[j][0]) and torch.equal(y, ref_batches[j][1]), (k, j)
    assert sd["seq_len"] == 4 and sd["world_size"] == 1 and sd["seed"] == 11


def test_load_state_dict_rejects_mismatch(tmp_path):
    p = make_zarr(tmp_path / "train.zarr", num_rows=4, doc_len=16)
    sd = ds(p, 4, 2, seed=1).state_dict()
    with pytest.raises(ValueError, match="seq_len=4"):
        ds(p, 8, 2, seed=1).load_state_dict(sd)
    with pytest.raises(ValueError, match="seed=1"):
        ds(p, 4, 2, seed=2).load_state_dict(sd)
    with pytest.raises(ValueError, match="world_size=1"):
        ds(p, 4, 1, world_size=2, seed=1).load_state_dict(sd)
    with pytest.raises(ValueError, match="batch_size=2"):
        ds(p, 4, 4, seed=1).load_state_dict(sd)
    with pytest.raises(KeyError, match="epoch"):
        ds(p, 4, 2, seed=1).load_state_dict({"seed": 1})
    # another rank may load rank 0's state
    r1 = ds(p, 4, 1, rank=1, world_size=2, seed=1)
    r1.load_state_dict(ds(p, 4, 1, rank=0, world_size=2, seed=1).state_dict())


def test_reads_row_slices_not_whole_rows(tmp_path):
    p = make_zarr(tmp_path / "train.zarr", num_rows=4, doc_len=64)
    d = ds(p, 8, 4, seed=0)

    class Recorder:
        def __init__(self, arr):
            self.arr, self.keys = arr, []

        def __getitem__(self, key):
            self.keys.append(key)
            return self.arr[key]

    d._arr = Recorder(d._arr)
    x, y = d.next_batch()
    total = sum(k[1].stop - k[1].start for k in d._arr.keys)
    assert total <= 4 * (8 + 1)  # at most seq_len+1 tokens per sequence
    rows = [k[0] for k in d._arr.keys]
    assert rows == sorted(rows)  # grouped by row
    # order restored: matches the permutation
    perm = np.random.default_rng([0, 0]).permutation(32)[:4]
    for i, s in enumerate(perm):
        assert y[i].tolist() == expected_seq(int(s), 8, 64)[1].tolist()


def test_zarr_v2_and_int32(tmp_path):
    p = make_zarr(tmp_path / "train.zarr", num_rows=2, doc_len=8, dtype=np.int32, zarr_format=2)
    x, y = ds(p, 8, 2, shuffle=False).next_batch()
    assert y.tolist() == [list(range(8)), list(range(1000, 1008))]
    assert x[:, 0].tolist() == [BOS, BOS]


# --------------------------------------------------------------------------- read_rows


def test_read_rows(tmp_path):
    p = make_zarr(tmp_path / "heldout.zarr", num_rows=4, doc_len=32)
    x, y = read_rows(p, [3, 0, 3], 20, bos_id=BOS, vocab_size=VOCAB)
    assert x.shape == y.shape == (3, 20) and x.dtype == torch.int64
    for i, r in enumerate([3, 0, 3]):
        assert y[i].tolist() == row(r, 32)[:20].tolist()
        assert x[i].tolist() == [BOS] + row(r, 32)[:19].tolist()
    x, y = read_rows(p, np.array([1]), 32, bos_id=BOS, vocab_size=VOCAB)  # full row
    assert y[0].tolist() == row(1, 32).tolist()
    with pytest.raises(ValueError, match="doc_len=32"):
        read_rows(p, [0], 33, bos_id=BOS, vocab_size=VOCAB)
    with pytest.raises(IndexError, match="row 4"):
        read_rows(p, [0, 4], 8, bos_id=BOS, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="token id 3000"):
        read_rows(p, [3], 8, bos_id=0, vocab_size=3000)


# --------------------------------------------------------------------------- validation


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.zarr.*prepare_corpus"):
        ds(tmp_path / "nope.zarr", 4, 1)


def test_data_dir_instead_of_array(tmp_path):
    make_zarr(tmp_path / "train.zarr", num_rows=2, doc_len=8)
    with pytest.raises(ValueError, match=r"train\.zarr"):
        ds(tmp_path, 4, 1)


def test_not_2d(tmp_path):
    arr = zarr.create_array(store=str(tmp_path / "a.zarr"), shape=(2, 4, 4), dtype=np.uint16)
    arr[...] = 1
    with pytest.raises(ValueError, match=r"2-D.*3-D shape \(2, 4, 4\)"):
        ds(tmp_path / "a.zarr", 4, 1)


def test_non_integer_dtype(tmp_path):
    p = make_zarr(tmp_path / "a.zarr", 2, 8, data=np.zeros((2, 8), np.float32))
    with pytest.raises(ValueError, match="integer dtype.*float32"):
        ds(p, 4, 1)


def test_seq_len_must_divide_doc_len(tmp_path):
    p = make_zarr(tmp_path / "a.zarr", 2, 16)
    with pytest.raises(ValueError, match="doc_len=16 is not a multiple of seq_len=6"):
        ds(p, 6, 1)


@pytest.mark.parametrize("kw, match", [
    (dict(seq_len=0, batch_size=1), "seq_len must be a positive integer, got 0"),
    (dict(seq_len=4, batch_size=0), "batch_size must be a positive integer, got 0"),
    (dict(seq_len=4, batch_size=1, rank=2, world_size=2), "rank=2"),
    (dict(seq_len=4, batch_size=1, rank=-1, world_size=2), "rank=-1"),
    (dict(seq_len=4, batch_size=1, world_size=0), "world_size must be an integer >= 1, got 0"),
])
def test_bad_arguments(tmp_path, kw, match):
    p = make_zarr(tmp_path / "a.zarr", 2, 16)
    seq_len, batch_size = kw.pop("seq_len"), kw.pop("batch_size")
    with pytest.raises(ValueError, match=match):
        ds(p, seq_len, batch_size, **kw)


def test_too_few_sequences(tmp_path):
    p = make_zarr(tmp_path / "a.zarr", 2, 16)  # 8 sequences of 4
    ds(p, 4, 4, world_size=2)  # exactly one global batch is fine
    with pytest.raises(ValueError, match=r"only 8 sequences.*2\*5=10"):
        ds(p, 4, 2, world_size=5)


def test_bos_must_be_below_vocab(tmp_path):
    p = make_zarr(tmp_path / "a.zarr", 2, 16)
    with pytest.raises(ValueError, match="bos_id=60000 must satisfy 0 <= bos_id < vocab_size=60000"):
        ds(p, 4, 1, vocab_size=60000, bos_id=60000)


def test_meta_mismatch(tmp_path):
    p = make_zarr(tmp_path / "train.zarr", 2, 16)
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": VOCAB, "bos_id": BOS}))
    assert load_meta(tmp_path) == {"vocab_size": VOCAB, "bos_id": BOS}
    assert load_meta(tmp_path / "nothing_here") is None
    ds(p, 4, 1)  # matching: fine
    with pytest.raises(ValueError, match=r"meta\.json says vocab_size=60000.*vocab_size=61000"):
        ds(p, 4, 1, vocab_size=61000)
    with pytest.raises(ValueError, match=r"meta\.json says bos_id=59999.*bos_id=0"):
        ds(p, 4, 1, bos_id=0)
    with pytest.raises(ValueError, match=r"meta\.json says vocab_size"):
        read_rows(p, [0], 4, bos_id=BOS, vocab_size=61000)
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"meta\.json: not valid JSON"):
        ds(p, 4, 1)


def test_out_of_range_token_detected_in_every_batch(tmp_path):
    data = np.tile(np.arange(16, dtype=np.uint16), (4, 1))
    data[2, 9] = 5000
    p = make_zarr(tmp_path / "a.zarr", 4, 16, data=data)
    d = LongCrawl64Dataset(p, 4, 2, vocab_size=4000, bos_id=0, shuffle=False)
    d.next_batch()  # row 0
    d.next_batch()  # row 0
    d.next_batch()  # row 1
    d.next_batch()  # row 1
    with pytest.raises(ValueError, match=r"row 2, position 9 holds token id 5000.*vocab_size=4000"):
        for _ in range(2):  # row 2 chunks 0,1 (then 2 contains position 9 as input/label)
            d.next_batch()


def test_negative_token_detected(tmp_path):
    data = np.ones((2, 8), dtype=np.int32)  # not zeros: an all-zero row is refused as damaged data
    data[1, 3] = -7
    p = make_zarr(tmp_path / "a.zarr", 2, 8, data=data)
    d = LongCrawl64Dataset(p, 8, 1, vocab_size=100, bos_id=1, shuffle=False)
    d.next_batch()
    with pytest.raises(ValueError, match="row 1, position 3 holds token id -7"):
        d.next_batch()


def test_permutation_helper_matches_numpy():
    from forgetting_transformer.data.longcrawl64 import _epoch_permutation

    for n in (1, 7, 1000):
        for seed, ep in ((0, 0), (3, 5)):
            got = _epoch_permutation(n, seed, ep, True)
            assert np.array_equal(got, np.random.default_rng([seed, ep]).permutation(n))
    assert np.array_equal(_epoch_permutation(5, 0, 0, False), np.arange(5))
