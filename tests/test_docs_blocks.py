"""Every ```python block of README.md and docs/*.md runs as written, in a fresh temporary directory.

A block that needs data makes it itself. A block that cannot run here (a GPU,
a cluster, the user's own images, a long training run) is marked in the
markdown, just before it, with ``<!-- not-run: reason -->``; it is reported as
skipped with that reason, never as passed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!--\s*not-run:\s*(?P<reason>.*?)\s*-->\s*\n)?```python\n(?P<code>.*?)```", re.S)
pytestmark = [
    pytest.mark.slow,  # tier: each documentation block runs in a fresh interpreter
    pytest.mark.no_asan,  # subprocesses; the sanitizer build covers the native reads elsewhere
]


def blocks() -> list:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            line = text[: m.start("code")].count("\n")
            name = f"{doc.relative_to(ROOT).as_posix()}:{line}"
            found.append(pytest.param(m.group("code"), m.group("reason"), id=name))
    return found


BLOCKS = blocks()


def test_the_docs_have_blocks_and_each_skip_says_why():
    assert len(BLOCKS) >= 7
    for param in BLOCKS:
        reason = param.values[1]
        assert reason is None or len(reason) > 10, f"{param.id}: a not-run marker must say why"


@pytest.mark.parametrize(("code", "reason"), BLOCKS)
def test_block_runs_as_written(code, reason, tmp_path):
    if reason is not None:
        pytest.skip(f"not-run: {reason}")
    (tmp_path / "block.py").write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    proc = subprocess.run([sys.executable, "block.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, f"the block failed:\n{code}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
