"""Regenerates the golden numbers in ``tests/golden/`` (the library's numerics guard; see
``tests/conftest.py``): runs every test marked ``golden`` with pytest-regressions'
``--force-regen`` (each rewritten file fails its test once, by design), then runs them again,
which must pass. Run it from the repository root after a change that is *meant* to move numbers,
and say in the commit why they moved::

    python tests/golden/regenerate.py [extra pytest arguments, e.g. -k notebook]
"""
import subprocess
import sys

if __name__ == "__main__":
  base = [sys.executable, "-m", "pytest", "-q", "-m", "golden", "-n", "2",
          "-p", "no:cacheprovider", *sys.argv[1:]]
  subprocess.run(base + ["--force-regen"], check=False)
  sys.exit(subprocess.run(base).returncode)
