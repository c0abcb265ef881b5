"""``--shard I/N`` (tests/conftest.py): N disjoint parts that together are exactly the selected tests."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ["tests/ops/test_tiles.py", "tests/ops/test_reference.py", "-k", "not gradcheck"]


def collected(*extra):
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *TARGET,
                          *extra], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return res, [ln for ln in res.stdout.splitlines() if "::" in ln]


def test_the_parts_are_disjoint_and_cover_the_selection_in_order():
    _, everything = collected()
    parts = [collected("--shard", f"{i}/3")[1] for i in (1, 2, 3)]
    assert len(everything) >= 6 and all(parts)
    assert sorted(sum(parts, [])) == sorted(everything) and len(set(sum(parts, []))) == len(everything)
    assert parts[0] == everything[0::3] and parts[2] == everything[2::3]  # round robin over the -k selection


def test_a_bad_shard_is_a_usage_error_naming_the_option():
    for bad in ("0/3", "4/3", "a/b", "2"):
        res, _ = collected("--shard", bad)
        assert res.returncode == 4 and f"--shard '{bad}'" in res.stderr, (bad, res.stderr[-500:])
