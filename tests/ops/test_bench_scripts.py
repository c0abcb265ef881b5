"""The benchmark scripts' timing-round flags (the scripts themselves need a GPU: docs/benchmarks.md, session 15)."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.mark.parametrize("script,flag", [("bench_attention.py", "--acp-rounds"), ("gluon_ab.py", "--rounds")])
def test_rounds_below_one_are_an_error_naming_the_flag(script, flag):
    """Medians over zero rounds would fail deep inside statistics; the flag is refused up front, by name."""
    args = [sys.executable, str(SCRIPTS / script), flag, "0"] + (["--old", "unused.py"] if script == "gluon_ab.py" else [])
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"argument {flag}: rounds must be >= 1; got 0" in r.stderr, r.stderr


def test_gluon_ab_heads_choices():
    """``gluon_ab.py --heads`` names the ACP case's head mixes; anything else is refused by name."""
    r = subprocess.run([sys.executable, str(SCRIPTS / "gluon_ab.py"), "--old", "unused.py", "--heads", "half"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "argument --heads: invalid choice: 'half'" in r.stderr, r.stderr
    for mix in ("all_global", "all_local", "mixed"):
        assert f"'{mix}'" in r.stderr
