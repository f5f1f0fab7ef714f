"""Test configuration: CPU only; no test reads data the repository does not ship or generate.

Data that only some machines have (the real Fashion-MNIST) is opt-in: tests marked
``real_data`` read the folder named by ``$FEDJAXSPARSE_FASHION_MNIST`` when the variable is
set at the start of the session, and skip saying so otherwise. For every other test the
variable is then pointed at an empty folder, so no loader's default (Debian's
``/usr/share/datasets/fashion-mnist`` included) can be read silently: a test that needs
Fashion-MNIST-shaped files takes the ``fashion_mnist_dir`` fixture (a labelled stand-in
written in the real IDX format).

CPU only. Multi-device tests start their own subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (it must be set before jax starts).

The tests compile with XLA's backend optimisation level 0 and XLA:CPU's elemental emitters
instead of its newer fusion emitters (``--xla_cpu_use_fusion_emitters=false``); subprocesses
and notebook kernels inherit both. The tiny configurations spend most of their time
compiling: level 0 halves the suite's time, and the elemental emitters compile about 3×
faster (measured on the ``scafflix_nn`` tiny run: 30 s of compilation → 9 s); one LLVM
module per program instead of XLA's default split into parallel codegen parts
(``--xla_cpu_parallel_codegen_split_count=1``) compiles 12 % faster on 2 cores, and XLA:CPU's
compile-time preset (``--xla_cpu_opt_preset=FAST_COMPILE``) compiles large programs up to
40 % faster again (a FedMRN CNN round: 6.8 s → 4.1 s), the suite's many small ones less
(``test_cohort_round.py`` and ``test_float64.py``: 55.0 → 50.0 s of compilation, same
process count); every golden number unchanged. On x86-64 the
tests compile for AVX at most (``--xla_cpu_max_isa=AVX``: no fused multiply-add instruction),
so no program contracts a product and a sum into one rounding where another does not: tests
that compare two *different* programs bit for bit (ATO with λ = 0 against plain training, say)
hold on any x86-64 host. Two libraries inside XLA:CPU choose their matrix-product kernels at
run time from the host's CPU (AVX-512, AVX2, AVX), which the ISA cap does not reach: YNNPACK,
whose fusions the tests turn off (``--xla_cpu_experimental_ynn_fusion_type=``: the products go
to Eigen), and oneDNN, whose sgemm Eigen's products call, capped at AVX
(``ONEDNN_MAX_CPU_ISA=AVX``, set below: the same kernel on every x86-64 host). Measured on a
2-core AMD EPYC whose oneDNN reports AVX-512: a jitted 256×300 by 300×200 product rounds
differently with YNNPACK than without, and differently again with oneDNN capped at AVX. Most
golden numbers do not notice, but two tiny runs turned such last-bit differences into
differences between CI's hosts — a near-tie of Sparse-ProxSkip-Local's Top-K (3 units in the
last place apart at one local step) and one Table 8 test prediction of ``fedlpfm_fmnist`` (8e-5
of a loss, 0.1 point of accuracy) — and a printed float64 duality gap of an exact solution
moves within its rounding noise (compared within 1e-12, see ``TEXT_ROUNDING_RESIDUALS``). The
whole integration tier compiled for SSE4.2 instead of AVX (other vector widths, other reduction
orders in every XLA-emitted loop) passes every golden unchanged. Results are checked against
references and tolerances (or between two programs compiled alike), which none of the flags
affects; benchmarks measure at XLA's defaults."""
import atexit
import json
import os
import platform
import re
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# One OpenBLAS thread (numpy's linear algebra, set before numpy is first imported; subprocesses
# inherit it): with two xdist workers on two cores, OpenBLAS's second thread per worker only
# spins while waiting for work (measured: an L-BFGS reference solve 3.7 -> 0.2 CPU-s, the LSTM
# test's initialisation 4-12 -> 2 s). Results are unaffected: the tests compare against
# tolerances, and the goldens are numbers of JAX programs, not of numpy's BLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# XLA:CPU's Eigen products call oneDNN's sgemm, which picks its kernel at run time from the
# host's CPU (AVX-512, AVX2, AVX: different roundings); capped at AVX, every x86-64 host runs
# the same kernel (see the module docstring).
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX")
_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
_FLAGS = ["--xla_backend_optimization_level=0", _EMITTERS,
          "--xla_cpu_parallel_codegen_split_count=1", "--xla_cpu_opt_preset=FAST_COMPILE",
          "--xla_cpu_experimental_ynn_fusion_type="]   # no YNNPACK: see above
if platform.machine().lower() in ("x86_64", "amd64"):
  _FLAGS.append("--xla_cpu_max_isa=AVX")    # no FMA: see above
for _flag in _FLAGS:
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

# JAX's persistent compilation cache, shared by the test session's processes (xdist workers,
# CLI and notebook subprocesses inherit the variables): many tests compile the same programs
# (an experiment's tiny run and its notebook, one family's round in several tests) and every
# process compiles the same eager operations (12 ms each; a cache hit: 5 ms), so every program
# is cached, however small (the whole suite: 616 s -> 537 s with the flag above). The folder
# is created by the first process of the session (the xdist controller) and removed when it
# exits, so nothing carries over from one run to the next.
if "FEDJAXSPARSE_TEST_SESSION_CACHE" not in os.environ:    # the session's first process
  _CACHE = tempfile.mkdtemp(prefix="fedjaxsparse-test-jax-cache-")
  atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
  os.environ["FEDJAXSPARSE_TEST_SESSION_CACHE"] = _CACHE
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["FEDJAXSPARSE_TEST_SESSION_CACHE"]
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
# Every figure an experiment or notebook saves is checked for texts that overlap or leave it
# (fedjaxsparse.harness.plotting.layout_problems): a broken plot fails its test.
os.environ["FEDJAXSPARSE_CHECK_PLOTS"] = "1"


import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

from fedjaxsparse.data import fashion_mnist as _fm  # noqa: E402
from fedjaxsparse.data import standins as _standins  # noqa: E402

if "FEDJAXSPARSE_TEST_REAL_FASHION_MNIST" not in os.environ:   # the session's first process
  os.environ["FEDJAXSPARSE_TEST_REAL_FASHION_MNIST"] = os.environ.get(_fm.ENV_VAR, "")
  _EMPTY = tempfile.mkdtemp(prefix="fedjaxsparse-no-data-")
  atexit.register(shutil.rmtree, _EMPTY, ignore_errors=True)
  os.environ[_fm.ENV_VAR] = _EMPTY   # loaders' default folder: empty (subprocesses inherit it)
_REAL_FASHION_MNIST = os.environ["FEDJAXSPARSE_TEST_REAL_FASHION_MNIST"]


@pytest.fixture(scope="session")
def fashion_mnist_dir(tmp_path_factory) -> str:
  """A folder with Fashion-MNIST's four IDX files (gzip) holding a labelled stand-in
  (:func:`fedjaxsparse.data.standins.fashion_mnist_standin`, 1,600 train and 600 test images)."""
  folder = str(tmp_path_factory.mktemp("fashion_mnist_standin"))
  (x, y), (xt, yt) = _standins.fashion_mnist_standin(1600, 600, seed=0)
  _fm.write_split(folder, "train", x, y)
  _fm.write_split(folder, "test", xt, yt)
  return folder


@pytest.fixture(scope="session")
def digits():
  """The first 512 of scikit-learn's bundled digits: ``(x float32 [512, 64] in [0, 1],
  y int32 [512])`` — the structured-pruning tests' data (ATO, DHSPG)."""
  from sklearn.datasets import load_digits
  d = load_digits()
  import numpy
  return (d.data / 16.0).astype(numpy.float32)[:512], d.target.astype(numpy.int32)[:512]


@pytest.fixture(scope="session")
def real_fashion_mnist_dir() -> str:
  """The real Fashion-MNIST folder named by ``$FEDJAXSPARSE_FASHION_MNIST`` (skip if unset)."""
  folder = _REAL_FASHION_MNIST
  if not folder:
    pytest.skip(f"real Fashion-MNIST is opt-in: set {_fm.ENV_VAR} to the folder with its four "
                f"IDX files (Debian: {_fm.DEBIAN_DIR})")
  if not os.path.isdir(folder) or not any(n.startswith("train-images") for n in
                                          os.listdir(folder)):
    pytest.skip(f"real Fashion-MNIST is opt-in: {_fm.ENV_VAR}={folder!r} holds no IDX files "
                f"(set it to the folder with the four files, e.g. {_fm.DEBIAN_DIR})")
  return folder

QUICK_LIMIT_S = 120.0  # an experiment's quick setting must finish within this on 2 CPU cores


# ---------------------------------------------------------------------------------------------
# Golden numbers: the library's numerics guard. Every experiment's quick run (the ``quick``
# fixture) and every notebook's tiny run (tests/test_notebook.py) compares its numbers with
# ``tests/golden/<test>.npz`` (pytest-regressions' ``ndarrays_regression``). Regenerate them
# after a change that is *meant* to move numbers with ``python tests/golden/regenerate.py``.
#
# What is compared: every number of ``results.json`` (nested keys joined by "/"), except
# wall-clock measurements (keys such as ``time_s``, ``wall_time_s``, ``seconds``, ``timings``)
# and strings; for a notebook, every number it prints, line by line, except lines that report
# times, progress bars or versions and devices. Integers (counts, bits held as integers,
# rounds) must match exactly.
# Floats: within rtol 1e-5 (plus atol 1e-9; invariant residuals that are rounding noise within
# atol 1e-4, see ROUNDING_RESIDUALS): on one host the runs are bitwise deterministic
# (checked by running each twice), but XLA:CPU compiles for the host's instruction set, so
# another CPU may round a fused multiply-add differently in the last bit, which a tiny run's
# few hundred steps grow to ~1e-7 relative. A printed number is compared within one unit of
# its last printed digit (a last-bit change can flip a rounded digit); one printed without a
# decimal point (a count) exactly.
# ---------------------------------------------------------------------------------------------
GOLDEN_DIR = os.path.join(os.path.dirname(__file__), "golden")
GOLDEN_TOLERANCE = dict(rtol=1e-5, atol=1e-9)
# Invariant residuals that are zero up to float32 rounding (ProxSkip's ‖Σ h_i‖, Scafflix's
# ‖Σ α_i² h_i/γ_i‖, ATO's logit difference of a compressed model): values of ~1e-7..1e-5 that
# are rounding noise, compared absolutely. Measured: compiled with XLA:CPU's other emitters
# (different FMA contraction), these were the only golden numbers to move beyond rtol 1e-5.
ROUNDING_RESIDUALS = re.compile(r"sum_h_norm|h_sum_norm|logit_diff|Δlogit")
ROUNDING_TOLERANCE = dict(rtol=1e-5, atol=1e-4)
# Printed float64 residuals that are zero up to rounding: the duality gap of the DDSS notebook's
# exact solution x* (1.1e-16 with YNNPACK's products, 5.6e-17 without; its test asserts
# separately that it certifies, < 1e-12), compared absolutely within that 1e-12.
TEXT_ROUNDING_RESIDUALS = re.compile(r"duality gap is #")
TEXT_ROUNDING_TOLERANCE = dict(rtol=0.0, atol=1e-12)
# a key is a wall-clock measurement when one of its words is one of these (``"time (s)"``,
# ``"train s"``, ``wall_time_s``; ``mask_search``: FedSpa's Table 5 time ratios)
_TIMING_WORDS = {"s", "ms", "time", "times", "seconds", "wall", "timing", "timings", "elapsed",
                 "took", "host", "backend", "date", "mask_search"}
# printed lines that report times, progress bars or the software and hardware in use
_TIMING_LINE = re.compile(r"\d\s?(s|ms|µs|sec|seconds|min)\b|it/s|s/it|\btook\b|\bwall\b|"
                          r"\btime|\bseconds?\b|%\||\bjax \d|\bversion|Device\(")
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?!\w|\.\d)")


def golden_numbers(tree) -> dict:
  """The numbers of a JSON-like ``tree`` as ``{"key/0/sub": array}`` (see above)."""
  import numpy as np
  out = {}

  def visit(x, path):
    if isinstance(x, dict):
      for k, v in x.items():
        words = set(re.split(r"[^a-z0-9]+", str(k).lower())) | {str(k)}
        if not words & _TIMING_WORDS:
          visit(v, f"{path}/{k}" if path else str(k))
    elif isinstance(x, (list, tuple)):
      if x and all(isinstance(v, (int, float)) or v is None for v in x):
        ints = all(isinstance(v, int) for v in x)
        out[path] = np.array([np.nan if v is None else v for v in x],
                             np.int64 if ints else np.float64)
      else:
        for i, v in enumerate(x):
          visit(v, f"{path}/{i}")
    elif isinstance(x, bool):
      out[path] = np.array(int(x))
    elif isinstance(x, int):
      out[path] = np.array(x, np.int64)
    elif isinstance(x, float):
      out[path] = np.array(x, np.float64)

  visit(tree, "")
  return out


def golden_text_numbers(text: str) -> tuple[dict, dict]:
  """The numbers printed in ``text``, one key each (the line's number and text with numbers as
  ``#``, then the number's place in the line), and a tolerance per key: one unit of its last
  printed digit (a number printed without a decimal point must match exactly; a residual of
  :data:`TEXT_ROUNDING_RESIDUALS` within :data:`TEXT_ROUNDING_TOLERANCE`)."""
  import numpy as np
  out, tolerances = {}, {}
  for i, line in enumerate(text.splitlines()):
    found = _NUMBER.findall(line)
    if not found or _TIMING_LINE.search(line):
      continue
    line_key = f"{i:03d} " + _NUMBER.sub("#", line).strip()[:80].replace("/", "|")
    for j, v in enumerate(found):
      mantissa = v.lower().split("e")[0]
      if "." in mantissa:
        out[f"{line_key} [{j}]"] = np.array(float(v))
        tolerances[f"{line_key} [{j}]"] = (
            TEXT_ROUNDING_TOLERANCE if TEXT_ROUNDING_RESIDUALS.search(line_key) else dict(
                GOLDEN_TOLERANCE, atol=1.01 * float(f"1e{v.lower().split('e')[1] if 'e' in v.lower() else 0}")
                * 10.0 ** -len(mantissa.split(".")[1])))
      else:
        out[f"{line_key} [{j}]"] = np.array(int(mantissa)) if "e" not in v.lower() \
            else np.array(float(v))
  return out, tolerances


def _measured_seconds() -> dict:
  """``tests/durations.json``: the slower tests' measured seconds (``tests/durations.py``)."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


@pytest.hookimpl(tryfirst=True)   # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config, items):
  """Tests that check golden numbers carry the ``golden`` marker (``pytest -m golden``) and
  belong to the integration tier (``integration``).

  The collection is ordered slowest first by the measured seconds in ``tests/durations.json``
  (modules by their total, then each module's tests; a module's tests stay together, so its
  fixtures are built once). Under xdist's work stealing each worker runs its share from the
  front and an idle worker steals from the back of another's, so the run ends on short tests
  instead of one worker finishing a long test alone. The order changes no test's outcome: tests
  do not depend on one another."""
  for item in items:
    if "golden" in getattr(item, "fixturenames", ()):
      item.add_marker(pytest.mark.golden)
      item.add_marker(pytest.mark.integration)
  seconds = _measured_seconds()
  if not seconds:
    return
  own = {item.nodeid: seconds.get(item.nodeid, 0.0) for item in items}
  module_total: dict = {}
  for item in items:
    module_total[item.nodeid.split("::")[0]] = (
        module_total.get(item.nodeid.split("::")[0], 0.0) + own[item.nodeid])
  position = {item.nodeid: i for i, item in enumerate(items)}
  items.sort(key=lambda item: (-module_total[item.nodeid.split("::")[0]],
                               item.nodeid.split("::")[0], -own[item.nodeid],
                               position[item.nodeid]))


@pytest.fixture
def golden(request, ndarrays_regression):
  """``golden(results_or_printed_text, name="")``: compares the numbers with
  ``tests/golden/<test file>__<test>[__name].npz`` (see above)."""
  def check(data, name: str = ""):
    stem = f"{request.path.stem}__{request.node.name}" + (f"__{name}" if name else "")
    stem = re.sub(r"[^\w.-]+", "_", stem)
    if isinstance(data, str):
      numbers, tolerances = golden_text_numbers(data)
    else:
      numbers = golden_numbers(data)
      tolerances = {k: ROUNDING_TOLERANCE for k in numbers if ROUNDING_RESIDUALS.search(k)}
    assert numbers, "nothing to compare"
    ndarrays_regression.check(numbers, fullpath=os.path.join(GOLDEN_DIR, stem + ".npz"),
                              tolerances=tolerances, default_tolerance=GOLDEN_TOLERANCE)
  return check


@pytest.fixture
def quick(tmp_path, golden):
  """``quick(experiment, *flags) -> results``: runs ``fedjaxsparse run EXPERIMENT --quick``
  (plus ``flags``, which override the quick setting) into ``tmp_path`` and checks that it
  succeeds within ``QUICK_LIMIT_S`` — with every figure it saves checked for overlapping or
  escaping text (``FEDJAXSPARSE_CHECK_PLOTS``) and its numbers against the golden ones.
  Returns its ``results.json``."""
  import json
  import time

  from fedjaxsparse.harness.cli import main

  def run(experiment: str, *flags: str) -> dict:
    start = time.perf_counter()
    assert main(["run", experiment, "--quick", "--out", str(tmp_path), "--no-progress",
                 *flags]) == 0
    took = time.perf_counter() - start
    assert took < QUICK_LIMIT_S, f"{experiment} --quick took {took:.0f} s"
    with open(tmp_path / experiment / "results.json") as f:
      results = json.load(f)
    golden(results, experiment)
    return results

  return run


# The holder loads FolderLock's own file without importing the package (its one import, the
# error type, stubbed): a process start instead of the package's import time.
_HOLDER = """
import importlib.util, sys, time, types
errors = types.ModuleType("fedjaxsparse.errors")
errors.LockedError = RuntimeError
sys.modules["fedjaxsparse.errors"] = errors
spec = importlib.util.spec_from_file_location("locking", sys.argv[2])
locking = importlib.util.module_from_spec(spec)
spec.loader.exec_module(locking)
with locking.FolderLock(sys.argv[1], purpose="test holder"):
  print("locked", flush=True)
  time.sleep(120)
"""
_LOCKING = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "fedjaxsparse", "runtime", "locking.py")


@pytest.fixture
def lock_holder():
  """``hold(folder) -> Popen``: another process holding ``folder``'s lock (killed with
  SIGKILL at teardown, if the test did not)."""
  procs = []

  def hold(folder: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, folder, _LOCKING],
                            stdout=subprocess.PIPE, text=True)
    procs.append(proc)
    assert proc.stdout.readline().strip() == "locked"
    return proc

  yield hold
  for proc in procs:
    proc.kill()
    proc.wait()


# ---------------------------------------------------------------------------------------------
# Where a test's seconds go (opt-in): with FEDJAXSPARSE_TEST_PROFILE=FOLDER each test process
# appends one JSON line per test to FOLDER/<pid>.jsonl — the test's wall seconds and, from JAX's
# own monitoring events, the seconds spent tracing to jaxprs, lowering to StableHLO and in XLA's
# backend compiler (a persistent-cache hit counts there too, as its retrieval), with the number
# of programs compiled (and their names: ``names``; with FEDJAXSPARSE_TEST_PROFILE_SITES=1 also
# the line outside jax that asked for each: ``sites``) and of cache hits. `python tests/durations.py --profile FOLDER` tabulates
# them per file. Subprocesses a test starts (CLI, notebooks) are not followed: their time is in
# the test's wall seconds only.
# ---------------------------------------------------------------------------------------------
_PROFILE_DIR = os.environ.get("FEDJAXSPARSE_TEST_PROFILE")
if _PROFILE_DIR:
  import time as _time
  import traceback

  _SITES = os.environ.get("FEDJAXSPARSE_TEST_PROFILE_SITES") == "1"

  from jax._src import monitoring as _monitoring

  _EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
             "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
             "/jax/core/compile/backend_compile_duration": "compile_s"}
  _current: dict = {}

  def _on_duration(event, seconds, fun_name=None, **_):
    key = _EVENTS.get(event)
    if key and _current:
      _current[key] = _current.get(key, 0.0) + seconds
      if key == "compile_s":
        _current["programs"] = _current.get("programs", 0) + 1
        names = _current.setdefault("names", {})
        names[str(fun_name)] = names.get(str(fun_name), 0) + 1
        if _SITES:   # the first frame outside jax that asked for the program
          site = next((f"{fun_name} @ {os.path.relpath(fr.filename)}:{fr.lineno} {fr.name}"
                       for fr in reversed(traceback.extract_stack()[:-1])
                       if "/jax/" not in fr.filename and "/jaxlib/" not in fr.filename
                       and "contextlib" not in fr.filename), "?")
          sites = _current.setdefault("sites", {})
          sites[site] = sites.get(site, 0) + 1

  def _on_event(event, **_):
    if event == "/jax/compilation_cache/cache_hits" and _current:
      _current["cache_hits"] = _current.get("cache_hits", 0) + 1

  _monitoring.register_event_duration_secs_listener(_on_duration)
  _monitoring.register_event_listener(_on_event)

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(item, nextitem):
    _current.clear()
    _current.update(nodeid=item.nodeid, integration=item.get_closest_marker("integration")
                    is not None)
    start = _time.perf_counter()
    yield
    _current["wall_s"] = _time.perf_counter() - start
    os.makedirs(_PROFILE_DIR, exist_ok=True)
    with open(os.path.join(_PROFILE_DIR, f"{os.getpid()}.jsonl"), "a") as f:
      f.write(json.dumps(_current) + "\n")
    _current.clear()
