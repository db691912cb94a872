"""``make demo`` (``python -m fastload.demo``) runs its happy path without a warning or a note of trouble."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # tier: the demo in a subprocess


def test_demo_runs_clean(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fastload.demo", "--output-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "same batches from both: True" in out, out
    assert "scenes stitched back from shuffled tiles bit for bit: True" in out, out
    assert "georeferenced: True" in out, out
    for trouble in ("warning", "Warning", "got no val image", "error", "Traceback"):
        assert trouble not in out, out
    assert "val: " in out and "animals 0" not in out, out  # every class has validation samples
