"""Exclusive use of an output folder by one process: a lock file holding the owner's pid.

The lock is an advisory ``fcntl.flock`` on ``FOLDER/.lock``: the kernel releases it when the
owner exits, even when it is killed with SIGKILL, so a crashed run never leaves a stale lock.
The file keeps the owner's pid and start time, which a second process reads to say who holds
the folder.
"""
from __future__ import annotations

import fcntl
import os
import socket
import time

from fedjaxsparse.errors import LockedError

__all__ = ["FolderLock"]


def __dir__() -> list[str]:
  # core.public_dir written out: this module imports only errors (a lock holder in another
  # process loads it on its own)
  return sorted(__all__)

LOCK_NAME = ".lock"


class FolderLock:
  """``with FolderLock(folder): ...`` holds ``folder`` exclusively (re-entrant per process:
  nested locks on the same folder in one process share it)."""

  _held: dict[str, int] = {}  # absolute folder -> nesting depth, in this process

  def __init__(self, folder: str, purpose: str = "a run"):
    self.folder = os.path.abspath(folder)
    self.path = os.path.join(self.folder, LOCK_NAME)
    self.purpose = purpose
    self._fd: int | None = None

  def acquire(self) -> "FolderLock":
    if self.folder in FolderLock._held:
      FolderLock._held[self.folder] += 1
      return self
    os.makedirs(self.folder, exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      owner = os.read(fd, 256).decode(errors="replace").strip() or "unknown process"
      os.close(fd)
      raise LockedError(
          f"{self.folder} is in use by another run ({owner}); wait for it to finish or use "
          "another output folder (CLI: --out).") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, {self.purpose}, since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
    self._fd = fd
    FolderLock._held[self.folder] = 1
    return self

  def release(self) -> None:
    depth = FolderLock._held.get(self.folder, 0)
    if depth > 1:
      FolderLock._held[self.folder] = depth - 1
      return
    FolderLock._held.pop(self.folder, None)
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> "FolderLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()
