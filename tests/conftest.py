import os
import sys
from pathlib import Path

# Triton kernels run under the interpreter on CPU-only machines; this must be set before triton is imported.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover - torch is a hard requirement; let the tests fail with the real error
    pass

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

MARKOV_VOCAB, MARKOV_DOC_LEN = 64, 256


def markov_rows(n_rows: int, seed: int) -> np.ndarray:
    """Rows from a sparse first-order Markov chain (3 fixed successors per token): learnable, so a tiny model's
    loss visibly drops within a few steps."""
    rng = np.random.default_rng(seed)
    nxt = np.random.default_rng(0).integers(1, MARKOV_VOCAB, size=(MARKOV_VOCAB, 3))
    rows = np.empty((n_rows, MARKOV_DOC_LEN), dtype=np.uint16)
    for r in range(n_rows):
        t = rng.integers(1, MARKOV_VOCAB)
        for i in range(MARKOV_DOC_LEN):
            rows[r, i] = t
            t = nxt[t, rng.integers(0, 3)]
    return rows


@pytest.fixture(scope="session")
def markov_data_dir(tmp_path_factory):
    """A LongCrawl64-format data dir (train.zarr 16 rows, heldout.zarr 4 rows of 256 tokens, vocab 64)."""
    import zarr

    d = tmp_path_factory.mktemp("markov_data")
    for name, n, seed in (("train.zarr", 16, 1), ("heldout.zarr", 4, 2)):
        arr = zarr.create_array(str(d / name), shape=(n, MARKOV_DOC_LEN), chunks=(1, MARKOV_DOC_LEN), dtype="uint16")
        arr[:] = markov_rows(n, seed)
    return d


def _train_on_prepared_data(out, data_dir, meta: dict, *overrides: str):
    """Runs train.py (4-sequence batches, one held-out batch, no per-token loss) on a data dir written by
    ``prepare_corpus`` (``meta``: its returned metadata, whose vocab_size, bos_id and text_escape, default none,
    the run takes) with the given overrides; returns ``out``."""
    import subprocess

    cmd = [sys.executable, str(ROOT / "train.py"), f"output_dir={out}", "data=longcrawl64", f"data.data_dir={data_dir}",
           f"data.vocab_size={meta['vocab_size']}", f"data.bos_id={meta['bos_id']}",
           f"data.text_escape={meta.get('text_escape', 'none')}", "train.batch_size=4",
           "train.micro_batch_size=4", "eval.heldout_batches=1", "eval.per_token_loss=false", *overrides]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def train_on_prepared_data():
    """``fn(out, data_dir, meta, *overrides)``: train.py on a ``prepare_corpus`` data dir (see above)."""
    return _train_on_prepared_data


@pytest.fixture(scope="session")
def tiny_text_run(tmp_path_factory):
    """A run directory written by train.py: a tiny FoX (Pro) trained 4 steps on 3 books of the embedded corpus
    (512-token BPE, rows of 1,024 tokens), with the tokenizer.json in its data dir. For evaluation tests: the
    model is real but untrained-quality. Returns the run dir; ``run/config.yaml`` names the data dir."""
    from forgetting_transformer.data.prepare import EMBEDDED_CORPUS, prepare_corpus

    tmp = tmp_path_factory.mktemp("tiny_text_run")
    meta = prepare_corpus([str(EMBEDDED_CORPUS)], tmp / "data", vocab_size=512, doc_len=1024, heldout_docs=1,
                          max_docs=3, progress=False)
    return _train_on_prepared_data(tmp / "run", tmp / "data", meta, "data.seq_len=256", "model.n_layers=2",
                                   "model.d_model=64", "model.head_dim=32", "train.max_steps=4")


@pytest.fixture
def one_thread():
    """One intra-op thread (``pytest.mark.usefixtures("one_thread")``): for tiny models, where on a loaded machine
    two threads of one op wait on each other for the cores other processes hold."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _verified_launches(request):
    """GPU tests run with ``launch_cache.verify()``: every kernel launch that skips triton's binding is checked
    against the kernel triton itself picks for the same arguments."""
    if request.node.get_closest_marker("gpu") is None or not torch.cuda.is_available():
        yield
        return
    from forgetting_transformer.ops import launch_cache

    with launch_cache.verify():
        yield


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run the I-th of N disjoint parts of the selected tests (items I, I+N, ... in collection "
                          "order, so parametrizations of one test spread over the parts); for GPU suites longer "
                          "than one sitting, e.g. benchmarks/attention/gpu_tests.sh with SHARD=1/3")


def _shard(value: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard {value!r}: expected I/N with integers, e.g. 1/3") from None
    if not 1 <= i <= n:
        raise pytest.UsageError(f"--shard {value!r}: I must be in 1..N")
    return i, n


@pytest.hookimpl(trylast=True)  # after -m / -k deselection, so the parts split what would run
def pytest_collection_modifyitems(config, items):
    value = config.getoption("--shard")
    if value is None:
        return
    i, n = _shard(value)
    keep = [item for k, item in enumerate(items) if k % n == i - 1]
    config.hook.pytest_deselected(items=[item for k, item in enumerate(items) if k % n != i - 1])
    items[:] = keep
