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
