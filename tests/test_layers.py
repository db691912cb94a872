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
    assert "Contracts: 3 kept, 0 broken." in proc.stdout


def test_no_module_imports_itself_round_a_cycle():
    """No import cycle anywhere in the package, imports inside functions included (grimp sees those too)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
    env["PYTHONPATH"] = str(ROOT / "python")
    script = (
        "import grimp\n"
        "g = grimp.build_graph('fastload', cache_dir=None)\n"
        "mods = sorted(g.modules)\n"
        "pairs = [(a, b) for a in mods for b in mods if a < b and g.chain_exists(a, b) and g.chain_exists(b, a)]\n"
        "print(len(mods), pairs)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    count, pairs = proc.stdout.split(" ", 1)
    assert int(count) > 50 and pairs.strip() == "[]", proc.stdout


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
    ("loading/_dataset.py", "from . import _compose", "fastload.loading._dataset -> fastload.loading._compose"),
    ("loading/_native_backend.py", "from . import _torch_backend",
     "fastload.loading._native_backend -> fastload.loading._torch_backend"),
])
def test_a_planted_upward_import_breaks_a_contract(tmp_path, module, planted, message):
    shutil.copytree(ROOT / "python" / "fastload", tmp_path / "fastload",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    target = tmp_path / "fastload" / module
    target.write_text(target.read_text() + f"\n{planted}  # planted by tests/test_layers.py\n")
    proc = lint(tmp_path)
    assert proc.returncode != 0 and "BROKEN" in proc.stdout
    assert message in proc.stdout, proc.stdout
