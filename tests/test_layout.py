"""The package's layout (DESIGN.md, "Layout"): wings by concept, each importing only the wings
below it — checked by import-linter's contract in pyproject.toml, which must also catch an
upward import."""
import os
import shutil
import subprocess
import sys

import fedjaxsparse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.dirname(fedjaxsparse.__file__)
LINT = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def _lint(cwd: str, package_parent: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=package_parent)
  return subprocess.run([LINT, "--config", os.path.join(ROOT, "pyproject.toml"), "--no-cache"],
                        cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_top_level_holds_only_the_core_modules_and_the_wings():
  names = sorted(os.listdir(PACKAGE))
  modules = [n for n in names if n.endswith(".py")]
  wings = [n for n in names if os.path.isdir(os.path.join(PACKAGE, n)) and n != "__pycache__"]
  assert modules == ["__init__.py", "core.py", "errors.py", "evaluation.py"]
  assert wings == ["algorithms", "convex", "data", "harness", "models", "ops", "pruning",
                   "runtime"]


def test_the_wings_import_only_the_wings_below_them():
  proc = _lint(ROOT, ROOT)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
  assert "1 kept, 0 broken" in proc.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
  copy = tmp_path / "fedjaxsparse"
  shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
  with open(copy / "ops" / "sparsity.py", "a") as f:
    f.write("\nfrom fedjaxsparse.harness import experiment  # an ops module reaching up\n")
  proc = _lint(str(tmp_path), str(tmp_path))
  assert proc.returncode != 0
  assert "BROKEN" in proc.stdout and "fedjaxsparse.ops.sparsity -> fedjaxsparse.harness" \
      in proc.stdout
