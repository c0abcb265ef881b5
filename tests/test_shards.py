"""``--shard I/N`` (tests/conftest.py): N disjoint parts that together are exactly the selected tests."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import _shard, pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parents[1]
TARGET = ["tests/ops/test_tiles.py", "tests/ops/test_reference.py", "-k", "not gradcheck"]


def collected(*extra):
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *TARGET,
                          *extra], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return res, [ln for ln in res.stdout.splitlines() if "::" in ln]


def shard_of(items, spec):
    """The items the hook keeps and those it reports deselected under ``--shard spec``."""
    deselected = []
    config = SimpleNamespace(getoption=lambda name: spec,
                             hook=SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items)))
    kept = list(items)
    pytest_collection_modifyitems(config, kept)
    return kept, deselected


def test_the_parts_are_disjoint_and_cover_the_items_in_order():
    items = list(range(11))
    parts = [shard_of(items, f"{i}/3") for i in (1, 2, 3)]
    assert [kept for kept, _ in parts] == [items[0::3], items[1::3], items[2::3]]  # round robin
    for kept, deselected in parts:
        assert sorted(kept + deselected) == items and not set(kept) & set(deselected)
    assert shard_of(items, None) == (items, [])


def test_a_shard_of_a_real_selection_is_its_round_robin_part():
    _, everything = collected()
    _, part = collected("--shard", "2/3")
    assert len(everything) >= 6 and part == everything[1::3]


@pytest.mark.parametrize("bad", ["0/3", "4/3", "a/b", "2"])
def test_a_bad_shard_is_a_usage_error_naming_the_option(bad):
    with pytest.raises(pytest.UsageError, match=f"--shard '{bad}'"):
        _shard(bad)


def test_pytest_exits_with_a_usage_error_on_a_bad_shard():
    res, _ = collected("--shard", "4/3")
    assert res.returncode == 4 and "--shard '4/3'" in res.stderr, res.stderr[-500:]
