"""The linter's rules (pyproject.toml, [tool.ruff]) hold over the whole tree: pyflakes, the
pycodestyle errors ruff checks by default, and import order. `ruff check --fix` mends most of
what this reports."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing_in_the_tree():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"ruff check reported (fix with `ruff check --fix`):\n{done.stdout}{done.stderr}"
