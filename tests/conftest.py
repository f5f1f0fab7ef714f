"""Test configuration: CPU only. Multi-device tests start their own subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (it must be set before jax starts)."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


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
