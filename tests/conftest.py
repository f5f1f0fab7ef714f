"""Test configuration: CPU only. Multi-device tests start their own subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (it must be set before jax starts).

The tests compile with XLA's backend optimisation level 0 (subprocesses and notebook kernels
inherit it): their tiny configurations spend most of their time compiling, and level 0
halves the suite's time. Results are checked against references and tolerances (or between
two programs compiled alike), which the level does not affect; benchmarks measure at the
default level."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_backend_optimization_level=0").strip()


import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

_HOLDER = """
import sys, time
from fedjaxsparse.locking import FolderLock
with FolderLock(sys.argv[1], purpose="test holder"):
  print("locked", flush=True)
  time.sleep(120)
"""


@pytest.fixture
def lock_holder():
  """``hold(folder) -> Popen``: another process holding ``folder``'s lock (killed with
  SIGKILL at teardown, if the test did not)."""
  procs = []

  def hold(folder: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, folder], stdout=subprocess.PIPE,
                            text=True)
    procs.append(proc)
    assert proc.stdout.readline().strip() == "locked"
    return proc

  yield hold
  for proc in procs:
    proc.kill()
    proc.wait()
