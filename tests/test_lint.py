"""ruff (configured in pyproject.toml) finds nothing in the repository."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", str(ROOT)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_ruff_reports_an_unused_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--config", str(ROOT / "pyproject.toml"),
                          "--output-format", "concise", str(bad)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "F401" in res.stdout, res.stdout + res.stderr
