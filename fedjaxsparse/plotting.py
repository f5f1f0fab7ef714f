"""Result plots: the test metric against rounds and against cumulative uplink bits, one line
per method, plus the training loss against rounds."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)


def plot_methods(methods: dict, metric: str, path: str, title: str = "",
                 log_loss: bool = True, x: str = "round") -> str:
  """Save a 3-panel PNG for ``methods = {name: {"history": History.to_dict()}}``.

  Panels: ``metric`` vs ``x`` (an evals/rounds column, default the round), ``metric`` vs
  cumulative uplink bits (all clients), training loss vs ``x``.
  """
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
  for name, record in methods.items():
    h = record["history"]
    ev, rd = h["evals"], h["rounds"]
    if metric in ev:
      axes[0].plot(ev[x], ev[metric], marker=".", label=name)
      sent = [(b, v) for b, v in zip(ev["uplink_bits"], ev[metric]) if b > 0]
      if sent:
        axes[1].plot(*zip(*sent), marker=".", label=name)
    if "loss" in rd:
      axes[2].plot(rd[x], rd["loss"], label=name, lw=1)
  axes[0].set(xlabel=x, ylabel=f"test {metric}", title=f"test {metric} vs {x}")
  axes[1].set(xlabel="cumulative uplink bits (all clients)", ylabel=f"test {metric}",
              title=f"test {metric} vs communication")
  axes[1].set_xscale("log")
  axes[2].set(xlabel=x, ylabel="training loss", title="training loss")
  if log_loss:
    axes[2].set_yscale("log")
  return _finish(fig, axes, path, title)


def plot_series(methods: dict, names: list[str], path: str, title: str = "",
                x: str = "round") -> str:
  """One log-scale panel per ``rounds`` column in ``names`` (e.g. the zero-sum diagnostics
  ``sum_h_norm``, ``mean_h_norm``, ``server_norm``, ``loss``), one line per method."""
  fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8))
  for ax, name in zip(axes, names):
    for method, record in methods.items():
      rd = record["history"]["rounds"]
      if name in rd:
        ax.plot(rd[x], rd[name], label=method, lw=1)
    ax.set(xlabel=x, title=name, yscale="log")
  return _finish(fig, axes, path, title)


def _finish(fig, axes, path: str, title: str) -> str:
  for ax in axes:
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def plot_evals(methods: dict, y: str, x: str, path: str, title: str = "",
               logx: bool = False, logy: bool = True) -> str:
  """One panel: the ``evals`` column ``y`` against the column ``x``, one line per method."""
  fig, ax = plt.subplots(figsize=(6.5, 4.5))
  for name, record in methods.items():
    ev = record["history"]["evals"]
    ax.plot(ev[x], ev[y], label=name, lw=1.2)
  ax.set(xlabel=x, ylabel=y, xscale="log" if logx else "linear",
         yscale="log" if logy else "linear")
  return _finish(fig, [ax], path, title)
