"""The runner: one trace per run, one dispatch per chunk, chunk-size invariance, evaluation
schedule, bit accounting in the history, and bitwise checkpoint/resume."""
import json
import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs


@pytest.fixture(scope="module")
def setup():
  """``(ds, model, algo, eval_fn)``: one algorithm and evaluation for the module's runs — the
  runner keeps a compiled chunk per algorithm, evaluation, chunking and argument types, so runs
  of the same chunking share one program (the tests below use a few chunkings between them)."""
  ds = fjs.data.digits(num_clients=12, partition="dirichlet", alpha=0.5, seed=0)
  model = fjs.models.softmax_regression(64, 10)
  algo = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.3), local_steps=3, batch_size=8,
                    cohort_size=5)
  return ds, model, algo, fjs.evaluation.make_eval_fn(model)


def _run(setup, **kw):
  ds, model, algo, eval_fn = setup
  kw.setdefault("progress", False)
  return fjs.run(algo, jax.random.key(7), model.init(jax.random.key(0)), ds.train, ds.test,
                 eval_fn=eval_fn, **kw)


def test_chunk_function_is_traced_once_for_a_whole_run(setup):
  ds, model, algo, eval_fn = setup
  chex.clear_trace_counter()
  chunk = jax.jit(chex.assert_max_traces(
      fjs.runtime.runner.build_chunk(algo, 20, eval_fn, 20), n=1))
  init_key, rounds_key = fjs.runtime.runner.split_run_key(jax.random.key(0))
  state = algo.init(init_key, model.init(jax.random.key(0)), ds.train)
  for r0 in range(0, 200, 20):  # 10 chunks, the last one shorter than the others
    state, out = chunk(rounds_key, state, jnp.int32(r0), jnp.int32(190), ds.train, ds.test)
  assert int(state.round) == 190
  # The last chunk covers rounds 181..200; only round 190, the final one, is evaluated and the
  # masked rounds 191..200 report nothing.
  np.testing.assert_array_equal(np.flatnonzero(out.evaluated), [9])
  assert float(np.abs(np.asarray(out.info.loss)[10:]).sum()) == 0.0


def test_whole_run_traces_once_and_dispatches_once_per_chunk(setup):
  res = _run(setup, num_rounds=200, eval_every=10, chunk_size=20)
  assert res.num_traces == 1
  assert res.num_dispatches == 10
  # A last, shorter chunk reuses the same program (masked rounds), still one trace.
  res = _run(setup, num_rounds=205, eval_every=10, chunk_size=20)
  assert res.num_traces == 1
  assert res.num_dispatches == math.ceil(205 / 20)
  assert res.history.rounds["round"] == list(range(1, 206))
  assert int(res.state.round) == 205


def test_chunk_size_does_not_change_the_run(setup):
  a = _run(setup, num_rounds=30, eval_every=10, chunk_size=4)    # 7 chunks and a shorter one
  # NumPy integers are integers (a config read from an array, say)
  b = _run(setup, num_rounds=np.int64(30), eval_every=np.int64(10), chunk_size=np.int32(20))
  chex.assert_trees_all_close(a.state, b.state, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(a.history.rounds["loss"], b.history.rounds["loss"], rtol=1e-5)


def test_evaluation_after_the_chunk_equals_evaluation_inside_it(setup):
  """chunk_size = eval_every evaluates after each chunk as its own program; chunk_size = 2 ×
  eval_every evaluates inside the scan behind a cond: the same rounds, the same metrics (an
  off-schedule final round included)."""
  a = _run(setup, num_rounds=25, eval_every=10, chunk_size=10)
  b = _run(setup, num_rounds=25, eval_every=10, chunk_size=20)
  assert a.history.evals["round"] == b.history.evals["round"] == [0, 10, 20, 25]
  for name in ("accuracy", "loss"):
    np.testing.assert_allclose(a.history.evals[name], b.history.evals[name], rtol=1e-5)
  chex.assert_trees_all_close(a.state, b.state, rtol=1e-6, atol=1e-7)


@pytest.mark.integration   # multi-round runs compared (the integration tier's kind), for the unit tier's margin
def test_loop_free_rounds_dispatch_one_round_and_checkpoint_per_eval(setup, tmp_path,
                                                                   monkeypatch):
  """clients="unroll" runs one round per dispatch (no loop, no cond), evaluates on schedule,
  checkpoints every eval_every rounds, and computes the vmap run (a FedAvg of 2 clients × 2
  local steps a round: the unrolled program grows with both)."""
  ds, model, _, eval_fn = setup
  small = (ds, model, fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.3), local_steps=2,
                                 batch_size=8, cohort_size=2), eval_fn)
  saved, save = [], fjs.runtime.checkpoint.Checkpointer.save
  monkeypatch.setattr(fjs.runtime.checkpoint.Checkpointer, "save",
                      lambda self, r, *a: (saved.append(r), save(self, r, *a))[1])
  a = _run(small, num_rounds=12, eval_every=4, chunk_size=2, clients="vmap")
  b = _run(small, num_rounds=12, eval_every=4, clients="unroll",
           checkpoint=fjs.Checkpointing(str(tmp_path / "ck")))
  assert (a.clients, b.clients) == ("vmap", "unroll")
  assert b.num_dispatches == 12 and b.num_traces == 1
  assert b.history.evals["round"] == a.history.evals["round"] == [0, 4, 8, 12]
  np.testing.assert_allclose(a.history.evals["accuracy"], b.history.evals["accuracy"],
                             rtol=1e-5)
  chex.assert_trees_all_close(a.state, b.state, rtol=1e-5, atol=1e-6)
  assert saved == [4, 8, 12]
  saved.clear()   # a run shorter than checkpoint.interval_s writes its last chunk only
  c = _run(small, num_rounds=12, eval_every=4, chunk_size=2,
           checkpoint=fjs.Checkpointing(str(tmp_path / "ck2"), interval_s=3600.0))
  assert saved == [12] and c.history.evals["round"] == [0, 4, 8, 12]


def test_evaluation_schedule_and_cumulative_bits(setup):
  ds, model, _, eval_fn = setup
  res = _run(setup, num_rounds=25, eval_every=10, chunk_size=4)
  assert res.history.evals["round"] == [0, 10, 20, 25]
  d = sum(l.size for l in jax.tree.leaves(model.init(jax.random.key(0))))
  per_round = 5 * fjs.accounting.dense_bits(d)  # cohort of 5 dense fp32 uploads
  np.testing.assert_allclose(res.history.rounds["bits_up"], per_round)
  np.testing.assert_allclose(res.history.rounds["uplink_bits"],
                             per_round * np.arange(1, 26))
  np.testing.assert_allclose(res.history.evals["uplink_bits"], per_round * np.array(
      [0, 10, 20, 25]))
  # The evaluation inside the scan equals evaluating the final model directly.
  final = jax.jit(eval_fn)(res.state.params, ds.test)
  np.testing.assert_allclose(res.history.evals["accuracy"][-1], final["accuracy"], rtol=1e-6)
  json.dumps(res.history.to_dict())  # JSON-serialisable


def test_training_improves_accuracy(setup):
  res = _run(setup, num_rounds=60, eval_every=10, chunk_size=20)
  acc = res.history.evals["accuracy"]
  assert acc[0] < 0.2 and acc[-1] > 0.8


class _Stop(Exception):
  pass


def test_resume_from_checkpoint_is_bitwise_identical(setup, tmp_path):
  full = _run(setup, num_rounds=12, eval_every=4, chunk_size=2)

  def stop_after_round_6(round_, state, history):
    if round_ == 6:
      raise _Stop

  ckpt = str(tmp_path / "ckpt")
  with pytest.raises(_Stop):
    _run(setup, num_rounds=12, eval_every=4, chunk_size=2, checkpoint=fjs.Checkpointing(ckpt),
         on_chunk=stop_after_round_6)
  resumed = _run(setup, num_rounds=12, eval_every=4, chunk_size=2,
                 checkpoint=fjs.Checkpointing(ckpt, resume=True))
  assert resumed.num_dispatches == 3  # only the rounds after 6 ran
  chex.assert_trees_all_equal(full.state, resumed.state)
  assert full.history.to_dict() == resumed.history.to_dict()


def test_resume_with_another_key_is_refused(setup, tmp_path):
  ds, model, algo, _ = setup
  ckpt = str(tmp_path / "ckpt")
  _run(setup, num_rounds=2, eval_every=4, checkpoint=fjs.Checkpointing(ckpt))  # one chunk
  with pytest.raises(ValueError, match=r"seed \(run key\)"):
    fjs.run(algo, jax.random.key(8), model.init(jax.random.key(0)), ds.train, ds.test,
            num_rounds=4, checkpoint=fjs.Checkpointing(ckpt, resume=True), progress=False)


@pytest.mark.parametrize("kw, match", [
    (dict(num_rounds=0), "num_rounds"),
    (dict(num_rounds=5, eval_every=0), "eval_every"),
    (dict(num_rounds=5, checkpoint=fjs.Checkpointing("d", interval_s=-1.0)),
     "checkpoint.interval_s"),
    (dict(num_rounds=5, checkpoint=fjs.Checkpointing("d", interval_s=float("nan"))),
     "checkpoint.interval_s"),
    (dict(num_rounds=5, checkpoint=fjs.Checkpointing("d", every=0)), "checkpoint.every"),
    (dict(num_rounds=5, checkpoint=fjs.Checkpointing("")), "checkpoint.directory"),
])
def test_bad_arguments(setup, kw, match):
  with pytest.raises(ValueError, match=match):
    _run(setup, **kw)


def test_checkpoint_is_one_checkpointing_record(setup, tmp_path):
  """``checkpoint`` takes a ``fjs.Checkpointing`` record, not a bare folder; its fields are
  checked by their names."""
  folder = str(tmp_path / "ck")
  with pytest.raises(TypeError, match=r"checkpoint must be .*Checkpointing.*"
                                      r"fjs\.Checkpointing\(directory, \.\.\.\)"):
    _run(setup, num_rounds=2, checkpoint=folder)
  with pytest.raises(ValueError, match=r"checkpoint\.every must be an int >= 1, got 0"):
    _run(setup, num_rounds=2, checkpoint=fjs.Checkpointing(folder, every=0))
  assert not os.path.exists(folder)   # refused before anything was written
