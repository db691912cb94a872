"""The import contracts of pyproject.toml ([tool.importlinter]) hold, and would catch a stage importing upward.

``make lint`` runs lint-imports too; here it also runs on copies of the package with one
forbidden import planted, so a contract that checks nothing (a typo in a layer name, a tool
reading the installed copy instead of this tree) fails the suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint(python_dir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
    env["PYTHONPATH"] = str(python_dir)
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo", "--config", str(ROOT / "pyproject.toml")],
                          cwd=python_dir, env=env, capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_every_contract():
    proc = lint(ROOT / "python")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 2 kept, 0 broken." in proc.stdout


@pytest.mark.parametrize(("module", "planted", "message"), [
    ("format/_record.py", "from ..tools import _info", "fastload.format is not allowed to import fastload.tools"),
    ("format/_manifest.py", "from ..loading import _plan",
     "fastload.format is not allowed to import fastload.loading"),
    ("loading/_state.py", "from ..conversion import _tiling",
     "fastload.loading is not allowed to import fastload.conversion"),
    ("conversion/_tiling.py", "from ..loading import _plan",
     "fastload.conversion is not allowed to import fastload.loading"),
    ("sampling/_order.py", "from ..format import _dtypes",
     "fastload.sampling is not allowed to import fastload.format"),
    ("loading/_epoch.py", "from . import _loader", "fastload.loading._epoch -> fastload.loading._loader"),
])
def test_a_planted_upward_import_breaks_a_contract(tmp_path, module, planted, message):
    shutil.copytree(ROOT / "python" / "fastload", tmp_path / "fastload",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    target = tmp_path / "fastload" / module
    target.write_text(target.read_text() + f"\n{planted}  # planted by tests/test_layers.py\n")
    proc = lint(tmp_path)
    assert proc.returncode != 0 and "BROKEN" in proc.stdout
    assert message in proc.stdout, proc.stdout
