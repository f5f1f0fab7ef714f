"""Each mistake a user can make ends in one line naming the file or argument and what was
expected — never a raw traceback from safetensors, flax, JAX or json: damaged checkpoints,
a config that asks for more than its weights hold, garbled C4 shards, empty or repeated
method lists, missing tfds data, params of another model, Scafflix coefficients and local
optima of the wrong shape, and DDSS dimensions that do not match."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs

TINY = fjs.models.transformer.TransformerConfig(hidden_size=16, intermediate_size=32, num_layers=1,
                                                num_heads=2, num_kv_heads=1, max_positions=16)


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("tiny_lm"))
  # the tiny model's parameter shapes (traced, not run: an eager flax init compiles ~70
  # programs), filled like its init (normal(0.02)) from NumPy: the values are incidental
  shapes = jax.eval_shape(lambda: fjs.models.transformer.init(TINY, jax.random.key(0)))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: (0.02 * rng.standard_normal(s.shape)).astype(s.dtype), shapes)
  fjs.models.hf.save(path, TINY, params)
  return path


def _copy(src, dst):
  os.makedirs(dst, exist_ok=True)
  for name in os.listdir(src):
    with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
      g.write(f.read())
  return dst


def _one_line(exc) -> str:
  text = str(exc.value)
  assert "\n" not in text and "Traceback" not in text
  return text


def test_damaged_or_truncated_safetensors_name_the_file(checkpoint_dir, tmp_path):
  assert fjs.models.hf.Checkpoint(checkpoint_dir).params()  # the intact copy reads
  bad = _copy(checkpoint_dir, str(tmp_path / "garbled"))
  with open(os.path.join(bad, "model.safetensors"), "wb") as f:
    f.write(b"\x07\x00\x00\x00\x00\x00\x00\x00{garbage")
  with pytest.raises(fjs.errors.DataError) as e:
    fjs.models.hf.Checkpoint(bad)
  assert "model.safetensors" in _one_line(e) and "damaged or truncated" in str(e.value)
  cut = _copy(checkpoint_dir, str(tmp_path / "cut"))
  path = os.path.join(cut, "model.safetensors")
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.truncate(size // 2)
  with pytest.raises(fjs.errors.DataError) as e:
    fjs.models.hf.Checkpoint(cut).params()
  assert "model.safetensors" in _one_line(e)


def test_a_config_asking_for_more_layers_than_the_weights_names_the_tensor(checkpoint_dir,
                                                                             tmp_path):
  more = _copy(checkpoint_dir, str(tmp_path / "more"))
  with open(os.path.join(more, "config.json")) as f:
    cfg = json.load(f)
  cfg["num_hidden_layers"] += 1
  with open(os.path.join(more, "config.json"), "w") as f:
    json.dump(cfg, f)
  with pytest.raises(fjs.errors.DataError) as e:
    fjs.models.hf.Checkpoint(more).params()
  text = _one_line(e)
  assert "layers.1" in text and "config.json (2 layers)" in text
  with open(os.path.join(more, "config.json"), "w") as f:
    f.write("{not json")
  with pytest.raises(fjs.errors.DataError, match="config.json: not valid JSON"):
    fjs.models.hf.Checkpoint(more)


def test_a_garbled_c4_shard_names_the_file_and_line(tmp_path):
  path = tmp_path / "c4.json"
  path.write_text('{"text": "one document"}\n{"text": "two"}{"text": "three"}\n')
  with pytest.raises(fjs.errors.DataError) as e:
    fjs.pruning.lm.c4_documents(str(path))
  text = _one_line(e)
  assert str(path) in text and "line 2" in text and "'text' field per line" in text
  path.write_text('{"url": "no text here"}\n')
  with pytest.raises(fjs.errors.DataError, match="line 1: no 'text' field"):
    fjs.pruning.lm.c4_documents(str(path))
  gz = tmp_path / "c4.json.gz"
  gz.write_bytes(b"\x1f\x8b\x08\x00 not really gzip")
  with pytest.raises(fjs.errors.DataError, match="cannot be read"):
    fjs.pruning.lm.c4_documents(str(gz))


@pytest.mark.parametrize("value, words", [
    (",", "option 'methods' names nothing; choose from"),
    ("FedAvg,FedAvg", "option 'methods' names 'FedAvg' more than once"),
    ("FedAvgg", "unknown name 'FedAvgg' (did you mean 'FedAvg'?)"),
])
def test_method_lists_are_checked_in_one_line(capsys, tmp_path, value, words):
  assert fjs.harness.cli.main(["run", "fedmrn_fmnist", "--quick", "--out", str(tmp_path),
                               "--no-progress", "--set", f"methods={value}"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and words in err[0], err
  assert not (tmp_path / "fedmrn_fmnist" / "checkpoints").exists()


def test_tfds_data_missing_says_where_it_looked(capsys, tmp_path, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "nothing"))
  assert fjs.harness.cli.main(["run", "fedspa_table1", "--dataset", "cifar10", "--out",
                               str(tmp_path), "--no-progress"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "'cifar10' (train) is not prepared" in err[0]
  assert "--data-dir" in err[0] and "fashion" not in err[0].lower()


def test_params_of_another_model_name_params_and_the_data_shape():
  ds = fjs.data.digits(num_clients=3)
  algo = fjs.fedavg(fjs.models.make_loss(fjs.models.mlp((8, 8), 10)), optax.sgd(0.1), local_steps=1)
  wrong = fjs.models.mlp((10, 10), 10).init(jax.random.key(0))
  with pytest.raises(ValueError) as e:
    fjs.run(algo, jax.random.key(0), wrong, ds.train, ds.test, num_rounds=1, progress=False)
  text = _one_line(e)
  assert "params do not fit" in text and "(100, 200)" in text and "shape (64,)" in text


def test_scafflix_coefficients_and_local_optima_of_the_wrong_shape():
  ds = fjs.data.digits(num_clients=4)
  model = fjs.models.softmax_regression(64, 10)
  loss, params = fjs.models.make_loss(model), model.init(jax.random.key(0))
  x_star = jax.tree.map(lambda a: jnp.stack([a] * 4), params)
  with pytest.raises(ValueError, match=r"gammas must be one number or one value per client "
                                       r"\(shape \(4,\)\), got shape \(3,\)"):
    fjs.scafflix(loss, [0.1, 0.1, 0.1], 0.5, 0.5, x_star).init(jax.random.key(0), params, ds.train)
  three = jax.tree.map(lambda a: a[:3], x_star)
  with pytest.raises(ValueError, match=r"x_star\['b'\] has shape \(3, 10\); expected "
                                       r"\(4, \*\(10,\)\)"):
    fjs.scafflix(loss, 0.1, 0.5, 0.5, three).init(jax.random.key(0), params, ds.train)
  with pytest.raises(ValueError, match="x_star must have the structure of params"):
    fjs.flix_sgd(loss, 0.1, 0.5, {"b": x_star["b"]}).init(jax.random.key(0), params, ds.train)


def test_ddss_dimensions_must_match_the_data():
  rng = np.random.default_rng(0)
  a = rng.normal(size=(30, 8)) * (rng.random((30, 8)) < 0.5)
  data, other = (fjs.data.sparse_rows.from_dense(a, rng.normal(size=30)),
                 fjs.data.sparse_rows.from_dense(a[:, :6], rng.normal(size=30)))
  prob = fjs.convex.screening.make_problem(data, 0.1)
  with pytest.raises(ValueError, match="prob was built for 8 features but data has p = 6"):
    fjs.algorithms.ddss.ddss(prob, step_size=0.1, inner_steps=4, data=other)
  algo = fjs.algorithms.ddss.ddss(prob, step_size=0.1, inner_steps=4, data=data)
  with pytest.raises(ValueError, match=r"x_init must have shape \(8,\)"):
    algo.init(jax.random.key(0), np.zeros(6), data)


def test_requests_that_cannot_be_met_are_refused_not_changed(capsys, tmp_path):
  """More Shakespeare roles than the plays have, or a dataset an experiment does not read,
  is refused in one line (it used to be capped, or ignored)."""
  with pytest.raises(ValueError, match=r"num_clients \(--clients\) must be in \[1, 1108\]"):
    fjs.data.load_dataset("shakespeare", num_clients=5000)
  assert fjs.harness.cli.main(["run", "scafflix_nn", "--dataset", "shakespeare", "--clients",
                               "5000", "--out", str(tmp_path), "--no-progress"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "must be in [1, 1108]" in err[0]
  assert fjs.harness.cli.main(["run", "ddss_lasso", "--dataset", "cifar10", "--out", str(tmp_path),
                               "--no-progress"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--dataset 'cifar10'" in err[0] and "--dataset synthetic" in err[0]


def test_integer_options_take_numpy_integers_and_name_the_range():
  """One integer checker for every integer option: NumPy integers are integers; a bool, a
  float or a value out of range is refused naming the option and its range."""
  check = fjs.errors.check_int
  assert check("epochs", np.int64(3), 1) == 3 and type(check("epochs", np.int32(3), 1)) is int
  for bad in (0, True, 2.0, "2", None):
    with pytest.raises(fjs.errors.ConfigError, match=r"epochs must be an int >= 1"):
      check("epochs", bad, 1)
  with pytest.raises(fjs.errors.ConfigError, match=r"k must be an int in \[1, 4\], got 5"):
    check("k", 5, 1, 4)
  with pytest.raises(ValueError, match=r"batch_size must be an int >= 1, got 0"):
    fjs.fedmrn(lambda *a: 0.0, 0.1, batch_size=0)


def test_a_label_outside_the_classes_is_named_when_the_loss_goes_non_finite():
  """The runner does not know the model's classes; when the loss goes non-finite it says what
  the integer labels span, so a label outside [0, classes) is found at once."""
  ds = fjs.data.digits(num_clients=3, seed=0)
  y = np.asarray(ds.train.y).copy()
  y[0, 0] = 12                                   # a 10-class problem
  model = fjs.models.softmax_regression(64, 10)
  algo = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.1), local_steps=1)
  with pytest.raises(fjs.errors.NonFiniteError, match=r"labels span \[0, 12\]"):
    fjs.run(algo, jax.random.key(0), model.init(jax.random.key(0)), ds.train._replace(y=y),
            num_rounds=1, progress=False)
