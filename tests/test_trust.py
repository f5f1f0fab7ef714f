"""Runs a researcher can trust: resume refuses another run's checkpoint (each kind of
mismatch), a fresh run never mixes into old checkpoints, NaN/inf stop a run at the right round
(checked inside the compiled chunk), bad data and hyper-parameters are rejected at the
boundary, the checkpoint folder is locked, and damaged checkpoints fall back to an intact
step."""
import gc
import glob
import json
import os
import shutil
import signal
import time
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs

pytestmark = pytest.mark.integration  # checkpoint round trips and resumes (README: the test commands)

MODEL = fjs.models.softmax_regression(64, 10)


@pytest.fixture(scope="module")
def ds():
  return fjs.data.digits(num_clients=6, partition="dirichlet", alpha=0.5, seed=0)


def _algo(lr=0.3, model=MODEL):
  return fjs.fedavg(fjs.models.make_loss(model), optax.sgd(lr), local_steps=2, batch_size=8,
                    cohort_size=3)


# One algorithm, evaluation and initial model shared by the module's runs: the runner keeps the
# compiled chunk of an algorithm at given argument types, so runs after the first compile
# nothing (the runs are the same as with a fresh, equal algorithm each time).
ALGO = _algo()
EVAL_FN = fjs.evaluation.make_eval_fn(MODEL)
PARAMS = MODEL.init(jax.random.key(0))


def _run(ds, algo=None, *, model=MODEL, key=7, train=None, **kw):
  kw.setdefault("progress", False)
  kw.setdefault("eval_every", 2)
  kw.setdefault("chunk_size", 2)
  # the strategy "auto" chooses for this small model, without tracing a step to choose it
  kw.setdefault("clients", "vmap")
  shared = model is MODEL
  return fjs.run(algo or ALGO, jax.random.key(key),
                 PARAMS if shared else model.init(jax.random.key(0)),
                 ds.train if train is None else train, ds.test,
                 eval_fn=EVAL_FN if shared else fjs.evaluation.make_eval_fn(model), **kw)


# ----------------------------------------------------------------------------- resume


@pytest.fixture(scope="module")
def fedavg_ckpt(ds, tmp_path_factory):
  """The checkpoint folder of a 4-round run (fingerprint FedAvg, lr 0.3), written once for the
  module; a test resumes from a copy of it."""
  ckpt = str(tmp_path_factory.mktemp("fedavg") / "ckpt")
  _run(ds, num_rounds=4,
       checkpoint=fjs.Checkpointing(ckpt, fingerprint={"method": "FedAvg", "lr": 0.3}))
  return ckpt


@pytest.mark.parametrize("change, match", [
    (dict(algo=_algo(lr=0.31)), "algorithm"),                      # a hyper-parameter
    (dict(key=8), r"seed \(run key\)"),                               # the seed
    (dict(eval_every=3), "eval_every"),                               # the evaluation schedule
    (dict(fingerprint={"method": "FedAvg", "lr": 0.5}), r"config: lr.*0\.3.*0\.5"),
])
def test_resume_refuses_every_kind_of_mismatch(ds, tmp_path, change, match, fedavg_ckpt):
  ckpt = str(tmp_path / "ckpt")
  shutil.copytree(fedavg_ckpt, ckpt)   # this test's own copy of the 4-round run's checkpoints
  change = dict(change)
  fingerprint = change.pop("fingerprint", {"method": "FedAvg", "lr": 0.3})
  kw = dict(num_rounds=6, checkpoint=fjs.Checkpointing(ckpt, resume=True,
                                                       fingerprint=fingerprint), **change)
  with pytest.raises(fjs.errors.RunMismatchError, match=match):
    _run(ds, **kw)


def test_resume_refuses_other_data_partition_and_model(ds, tmp_path):
  ckpt = str(tmp_path / "ckpt")
  _run(ds, num_rounds=4, checkpoint=fjs.Checkpointing(ckpt))
  # another partition
  other = fjs.data.digits(num_clients=6, partition="dirichlet", alpha=0.5, seed=1)
  with pytest.raises(fjs.errors.RunMismatchError, match="training data"):
    _run(ds, train=other.train, num_rounds=6, checkpoint=fjs.Checkpointing(ckpt, resume=True))
  other_model = fjs.models.mlp((64,), 10, hidden=(16,))
  with pytest.raises(fjs.errors.RunMismatchError,
                     match="algorithm .*differs.*initial model differs"):
    _run(ds, _algo(model=other_model), model=other_model, num_rounds=6,
         checkpoint=fjs.Checkpointing(ckpt, resume=True))


def test_resume_refuses_fewer_rounds_and_extends_to_more(ds, tmp_path):
  ckpt = str(tmp_path / "ckpt")
  _run(ds, num_rounds=6, checkpoint=fjs.Checkpointing(ckpt))
  with pytest.raises(fjs.errors.RunMismatchError, match="already holds 6 rounds but num_rounds=4"):
    _run(ds, num_rounds=4, checkpoint=fjs.Checkpointing(ckpt, resume=True))
  resumed = _run(ds, num_rounds=10, checkpoint=fjs.Checkpointing(ckpt, resume=True))
  fresh = _run(ds, num_rounds=10)
  assert resumed.history.rounds == fresh.history.rounds
  assert len(resumed.history.rounds["round"]) == 10
  # 7 rounds at eval_every=2 end with an off-schedule final evaluation (round 7); extending to
  # 10 drops it, so the evaluations are those of a straight 10-round run.
  ckpt7 = str(tmp_path / "ckpt7")
  _run(ds, num_rounds=7, checkpoint=fjs.Checkpointing(ckpt7))
  extended = _run(ds, num_rounds=10, checkpoint=fjs.Checkpointing(ckpt7, resume=True))
  assert extended.history.evals == fresh.history.evals
  assert extended.history.evals["round"] == [0, 2, 4, 6, 8, 10]


def test_fresh_run_refuses_old_checkpoints_unless_overwrite(ds, tmp_path):
  ckpt = str(tmp_path / "ckpt")
  # another run (its seed): steps 4 and 6
  _run(ds, key=8, num_rounds=6, checkpoint=fjs.Checkpointing(ckpt))
  (tmp_path / "ckpt" / "notes.txt").write_text("mine")  # not a checkpoint: kept
  with pytest.raises(fjs.errors.CheckpointExistsError, match="--resume.*--overwrite"):
    _run(ds, num_rounds=4, checkpoint=fjs.Checkpointing(ckpt))
  over = _run(ds, num_rounds=4, checkpoint=fjs.Checkpointing(ckpt, overwrite=True))
  # The old run's steps are gone: resuming the new run continues *it*, to the fresh result.
  resumed = _run(ds, num_rounds=6, checkpoint=fjs.Checkpointing(ckpt, resume=True))
  fresh = _run(ds, num_rounds=6)
  assert over.history.rounds["round"] == [1, 2, 3, 4]
  assert resumed.history.rounds == fresh.history.rounds
  assert (tmp_path / "ckpt" / "notes.txt").read_text() == "mine"


def test_training_time_adds_up_across_resumes(ds, tmp_path, monkeypatch):
  ckpt = str(tmp_path / "ckpt")
  # The runner's clock moves 1.5 s on in each call of ``slow`` (host work of 1.5 s between
  # chunks, without waiting for it): real time plus the seconds so skipped.
  skipped = [0.0]
  clock = types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + skipped[0])
  monkeypatch.setattr(fjs.runtime.runner, "time", clock)
  slow = lambda *_: skipped.__setitem__(0, skipped[0] + 1.5)  # inside the timed loop
  _run(ds, num_rounds=6, checkpoint=fjs.Checkpointing(ckpt), on_chunk=slow)
  saved = json.load(open(os.path.join(ckpt, "6", "meta", "metadata")))["train_time_s"]
  assert saved >= 3.0  # two of the three pauses happened before the last checkpoint
  t0 = time.perf_counter()
  second = _run(ds, num_rounds=8, checkpoint=fjs.Checkpointing(ckpt, resume=True))
  own = time.perf_counter() - t0
  # The total is the saved time plus this call's own part, not this call's part alone.
  assert saved < second.train_time_s <= saved + own


# ------------------------------------------------------------------------- divergence


def test_nan_stops_the_run_with_round_and_quantity():
  """FedAvg with a too-large learning rate on least squares overflows to inf/NaN."""
  reg = fjs.data.diabetes(num_clients=6)
  model = fjs.models.linear_regression(10)
  algo = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(3.0), local_steps=2, batch_size=8)
  eval_fn = fjs.evaluation.make_eval_fn(model)
  go = lambda **kw: fjs.run(algo, jax.random.key(7), model.init(jax.random.key(0)), reg.train,
                            reg.test, num_rounds=60, eval_fn=eval_fn, eval_every=10,
                            chunk_size=10, progress=False, **kw)
  with pytest.raises(fjs.errors.NonFiniteError) as e:
    go(desc="FedAvg lr=3")
  err = e.value
  assert err.method == "FedAvg lr=3" and 1 < err.round < 60
  assert err.quantity in ("loss", "test loss", "test mse")  # training loss or evaluation
  # The reported round is the first whose loss is non-finite: the run stopped there.
  stopped = go(on_nonfinite="stop")
  assert stopped.diverged == {"round": err.round, "quantity": err.quantity}
  losses = stopped.history.rounds["loss"]
  assert len(losses) == err.round - 1 and np.all(np.isfinite(losses))
  assert np.all(np.isfinite(stopped.history.evals["mse"]))
  assert max(stopped.history.evals["round"]) < err.round
  assert f"round {err.round}" in str(err)


def test_state_divergence_round_does_not_depend_on_the_chunk_size(ds):
  """FedAdam's server state goes NaN at round 1 with a huge client step: reported at round 1
  whatever the chunking, and a stopped run keeps no round."""
  model = MODEL
  algo = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(1e30), local_steps=1,
                    server_optimizer=optax.adam(0.01))
  for chunk in (1, 5):
    r = fjs.run(algo, jax.random.key(0), PARAMS, ds.train, ds.test,
                num_rounds=10, eval_fn=EVAL_FN, eval_every=5,
                chunk_size=chunk, on_nonfinite="stop", progress=False)
    assert r.diverged["round"] == 1 and r.diverged["quantity"].startswith("state")
    assert r.history.rounds["round"] == [] and r.history.evals["round"] == [0]


def _nan_state_algo(bad_round: int) -> fjs.Algorithm:
  """Loss always finite; a state leaf becomes NaN after ``bad_round`` steps."""
  def init(key, params, data):
    return {"params": params, "t": jnp.zeros((), jnp.int32), "aux": jnp.zeros(3)}

  def step(key, state, data):
    t = state["t"] + 1
    aux = jnp.where(t >= bad_round, jnp.nan, 0.0) * jnp.ones(3)
    info = {"loss": jnp.float32(1.0), "bits_up": jnp.float32(0), "bits_down": jnp.float32(0)}
    return {"params": state["params"], "t": t, "aux": aux}, info

  return fjs.Algorithm(init, step)


def test_nonfinite_state_is_caught_inside_the_compiled_chunk(ds):
  algo = _nan_state_algo(5)
  chunk = jax.jit(fjs.runtime.runner.build_chunk(algo, 4))
  init_key, rounds_key = fjs.runtime.runner.split_run_key(jax.random.key(0))
  state = algo.init(init_key, MODEL.init(jax.random.key(0)), ds.train)
  state, out = chunk(rounds_key, state, jnp.int32(0), jnp.int32(8), ds.train, None)
  assert out.state_finite.shape == (3,) and bool(np.asarray(out.state_finite).all())
  lazy = jax.jit(fjs.runtime.runner.build_chunk(algo, 4, check_every_round=False))
  _, once = lazy(rounds_key, state, jnp.int32(4), jnp.int32(8), ds.train, None)
  state, out = chunk(rounds_key, state, jnp.int32(4), jnp.int32(8), ds.train, None)
  assert not bool(np.asarray(out.state_finite).all())
  assert out.state_ok.tolist() == [False] * 4        # every round checked: NaN from round 5
  assert once.state_ok.tolist() == [True] * 3 + [False]   # checked once, at the chunk's end
  assert once.state_finite.tolist() == out.state_finite.tolist()
  with pytest.raises(fjs.errors.NonFiniteError, match=r"state\['aux'\]") as e:
    fjs.run(algo, jax.random.key(0), MODEL.init(jax.random.key(0)), ds.train, num_rounds=12,
            chunk_size=4, progress=False)
  assert e.value.round == 5  # exact, though it falls inside a chunk of 4 rounds


def test_a_long_run_announces_its_remaining_time(ds, capsys):
  _run(ds, num_rounds=40, progress=True, desc="FedAvg", estimate_after_s=0.0)   # 20 chunks
  text = "".join(capsys.readouterr())
  assert "FedAvg: about" in text and "left" in text and "first, with compilation" in text
  _run(ds, num_rounds=40, progress=True, desc="FedAvg")  # short: no estimate
  assert "left (" not in "".join(capsys.readouterr())


def test_infinite_or_nonpositive_step_sizes_are_rejected():
  loss = fjs.models.make_loss(MODEL)
  for bad in (float("inf"), float("nan"), 0.0, -1.0):
    with pytest.raises(fjs.errors.ConfigError,
                       match=r"gamma \(step size\) must be a finite number"):
      fjs.sparse_proxskip(loss, bad, 0.1, 0.9)
    with pytest.raises(fjs.errors.ConfigError, match="lr must be a finite number"):
      fjs.fedht(loss, bad, 2, 0.9)
  with pytest.raises(fjs.errors.ConfigError, match=r"p \(communication probability\).*\(0, 1\]"):
    fjs.proxskip(loss, 0.1, 1.5)


# ------------------------------------------------------------------------------ data


def test_empty_client_and_nan_feature_rejected_at_the_data_boundary(ds):
  tr = ds.train
  n = np.asarray(tr.num_examples).copy()
  n[2] = 0
  mask = (np.arange(tr.max_examples)[None] < n[:, None]).astype(np.float32)
  empty = fjs.data.FederatedData(jax.device_put(np.asarray(tr.x) * mask[..., None]), tr.y,
                                 jax.device_put(mask), jax.device_put(n))
  algo = fjs.fedavg(fjs.models.make_loss(MODEL), optax.sgd(0.1), local_steps=2, batch_size=4)
  with pytest.raises(fjs.errors.DataError, match="client 2 has no example"):
    algo.init(jax.random.key(0), MODEL.init(jax.random.key(0)), empty)
  with pytest.raises(fjs.errors.DataError, match="client 2 has no example"):
    _run(ds, algo, train=empty, num_rounds=2)
  x = np.asarray(tr.x).copy()
  x[4, 0, 7] = np.nan
  with pytest.raises(fjs.errors.DataError, match="client 4 has a NaN or infinite feature"):
    _run(ds, train=tr._replace(x=jax.device_put(x)), num_rounds=2)
  holes = np.asarray(tr.mask).copy()
  holes[1, 0] = 0.0  # a padding row before real rows
  with pytest.raises(fjs.errors.DataError, match="client 1 mask must be 1 on the first"):
    tr._replace(mask=jax.device_put(holes)).validate()


def test_labels_outside_the_classes_rejected(ds):
  y = np.asarray(ds.train.y).copy()
  y[3, 0] = 10
  bad = fjs.data.FederatedDataset(ds.train._replace(y=jax.device_put(y)), ds.test, 10, "digits")
  with pytest.raises(fjs.errors.DataError, match=r"client 3 has a label outside \[0, 10\)"):
    bad.validate()
  t = np.asarray(ds.train.y, np.float32).copy()
  t[0, 0] = np.nan
  with pytest.raises(fjs.errors.DataError, match="client 0 has a NaN or infinite target"):
    ds.train._replace(y=jax.device_put(t)).validate()


def test_compressor_applied_to_a_tree_of_another_size():
  # compressed under jit (one program, not one per eager operation); the size check is Python
  c = fjs.compressors.rand_k(5, 2)
  key = jax.random.key(0)
  with pytest.raises(fjs.errors.ConfigError, match=r"rand-2 was built for d=5 .* tree of 10"):
    jax.jit(c.compress)(key, np.ones(10, np.float32))
  for make in (lambda: fjs.compressors.top_k(5, 2), lambda: fjs.compressors.natural(5),
               lambda: fjs.compressors.identity(5), lambda: fjs.compressors.qsgd(5, 2),
               lambda: fjs.compressors.comp_k(5, 1, 2)):
    with pytest.raises(fjs.errors.ConfigError, match="built for d=5"):
      jax.jit(make().compress)(key, {"a": np.ones(3, np.float32), "b": np.ones(4, np.float32)})
  assert jax.jit(c.compress)(key, np.ones(5, np.float32)).shape == (5,)


# ------------------------------------------------------------------- locks and damage

# FolderLock's own code in the holder process, loaded from its file without importing the
# package (jax, flax, orbax: seconds of start-up for a process that only sleeps); the one name
# it imports from the package, LockedError, is raised only by a holder that did not get the lock
def test_folder_lock_contention_names_the_owner_and_dies_with_it(ds, tmp_path, lock_holder):
  folder = str(tmp_path / "ckpt")
  proc = lock_holder(folder)
  with pytest.raises(fjs.errors.LockedError, match=f"pid {proc.pid}.*test holder"):
    _run(ds, num_rounds=2, checkpoint=fjs.Checkpointing(folder))
  with pytest.raises(fjs.errors.LockedError):
    fjs.runtime.locking.FolderLock(folder).acquire()
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  # The kernel released the lock with the killed owner: no stale lock.
  again = _run(ds, num_rounds=2, checkpoint=fjs.Checkpointing(folder))
  assert again.history.rounds["round"] == [1, 2]


def _step_files(ckpt: str, step: int) -> list[str]:
  files = [f for f in glob.glob(os.path.join(ckpt, str(step), "state", "**", "*"),
                                recursive=True) if os.path.isfile(f)]
  return sorted(files, key=os.path.getsize)


# orbax's background read of the truncated file fails inside TensorStore and leaves a coroutine
# that Python finalises later ("Event loop is closed", "Encountered error while reading array
# index"): collected at the end of this test, where it belongs, and not reported.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_damaged_checkpoint_falls_back_to_the_previous_step(ds, tmp_path):
  ckpt = str(tmp_path / "ckpt")
  _run(ds, num_rounds=8, checkpoint=fjs.Checkpointing(ckpt))  # keeps steps 6 and 8
  # Flip one bit in the middle of the newest step's biggest data file: orbax reads it back
  # without complaint (measured), so only the saved digest can tell.
  path = _step_files(ckpt, 8)[-1]
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0x10
  open(path, "wb").write(bytes(data))
  with pytest.warns(UserWarning,
                    match=r"resuming from step 6 instead \(step 8: .*does not match the digest"):
    resumed = _run(ds, num_rounds=10, checkpoint=fjs.Checkpointing(ckpt, resume=True))
  assert resumed.history.rounds == _run(ds, num_rounds=10).history.rounds
  # Truncate the biggest data file of the newest step: the same fallback, no raw traceback.
  for f in _step_files(ckpt, 10)[-1:]:
    with open(f, "r+b") as fh:
      fh.truncate(os.path.getsize(f) // 3)
  with pytest.warns(UserWarning, match="resuming from step 8"):
    again = _run(ds, num_rounds=12, checkpoint=fjs.Checkpointing(ckpt, resume=True))
  assert again.history.rounds == _run(ds, num_rounds=12).history.rounds
  gc.collect()


def test_no_readable_checkpoint_is_a_clear_error(ds, tmp_path):
  ckpt = str(tmp_path / "ckpt")
  _run(ds, num_rounds=4, checkpoint=fjs.Checkpointing(ckpt))
  for step in (2, 4):
    meta_path = os.path.join(ckpt, str(step), "meta", "metadata")
    meta = json.load(open(meta_path))
    meta["state_digest"] = "f" * 32
    json.dump(meta, open(meta_path, "w"))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    with pytest.raises(fjs.errors.CheckpointCorruptError,
                       match="no readable checkpoint.*--overwrite"):
      _run(ds, num_rounds=6, checkpoint=fjs.Checkpointing(ckpt, resume=True))


def test_counts_and_label_types_checked(ds):
  tr = ds.train
  n = np.asarray(tr.num_examples).copy()
  n[0] = tr.max_examples + 1
  with pytest.raises(fjs.errors.DataError, match=r"num_examples must be integers in \[0, M="):
    tr._replace(num_examples=jax.device_put(n)).validate()
  y = jax.device_put(np.asarray(tr.y).astype(np.float32))
  with pytest.raises(fjs.errors.DataError, match="must be integers"):
    fjs.data.FederatedDataset(tr._replace(y=y), ds.test, 10, "x").validate()


def _constant_nan_algo() -> fjs.Algorithm:
  """A NaN in a leaf the step passes through unchanged (never re-read by the rounds)."""
  def init(key, params, data):
    return {"w": jnp.zeros(3), "c": jnp.full(3, jnp.nan)}

  def step(key, s, data):
    return {"w": s["w"] + 1.0, "c": s["c"]}, {"loss": jnp.sum(s["w"])}

  return fjs.Algorithm(init, step)


def _late_nan_algo(bad_round: int = 2) -> fjs.Algorithm:
  """The state goes NaN at ``bad_round``; the loss (of the incoming state) a round later."""
  def init(key, params, data):
    return {"w": jnp.zeros(3), "t": jnp.zeros((), jnp.int32)}

  def step(key, s, data):
    t = s["t"] + 1
    return ({"w": jnp.where(t == bad_round, jnp.nan, s["w"] + 1.0), "t": t},
            {"loss": jnp.sum(s["w"])})

  return fjs.Algorithm(init, step)


@pytest.mark.parametrize("algo, round_, quantity, kept", [
    (_constant_nan_algo(), 1, "state['c']", []), (_late_nan_algo(2), 2, "state['w']", [1])])
def test_state_checked_once_a_chunk_still_names_the_exact_round(algo, round_, quantity, kept):
  """The runner checks the state once a chunk and re-runs a chunk that ends non-finite round by
  round: a NaN in a passed-through leaf, or a state that goes NaN a round before the loss shows
  it, is named at its own round whatever the chunk size (the history keeps the rounds before)."""
  for chunk in (1, 4):
    r = fjs.run(algo, jax.random.key(0), {"p": np.zeros(1, np.float32)},
                np.ones((4, 3), np.float32), num_rounds=8,
                chunk_size=chunk, progress=False, on_nonfinite="stop", layout="padded",
                clients="vmap")
    assert r.diverged == {"round": round_, "quantity": quantity}, chunk
    assert r.history.rounds["round"] == kept
