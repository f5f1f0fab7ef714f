"""Result plots: the test metric against rounds and against cumulative uplink bits, one line
per method, plus the training loss against rounds."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)


def plot_methods(methods: dict, metric: str, path: str, title: str = "",
                 log_loss: bool = True) -> str:
  """Save a 3-panel PNG for ``methods = {name: {"history": History.to_dict()}}``.

  Panels: ``metric`` vs round, ``metric`` vs cumulative uplink bits (per client-average bits
  are the total divided by the number of clients), training loss vs round.
  """
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
  for name, record in methods.items():
    h = record["history"]
    ev, rd = h["evals"], h["rounds"]
    if metric in ev:
      axes[0].plot(ev["round"], ev[metric], marker=".", label=name)
      sent = [(b, v) for b, v in zip(ev["uplink_bits"], ev[metric]) if b > 0]
      if sent:
        axes[1].plot(*zip(*sent), marker=".", label=name)
    if "loss" in rd:
      axes[2].plot(rd["round"], rd["loss"], label=name, lw=1)
  axes[0].set(xlabel="round", ylabel=f"test {metric}", title=f"test {metric} vs rounds")
  axes[1].set(xlabel="cumulative uplink bits (all clients)", ylabel=f"test {metric}",
              title=f"test {metric} vs communication")
  axes[1].set_xscale("log")
  axes[2].set(xlabel="round", ylabel="training loss", title="training loss")
  if log_loss:
    axes[2].set_yscale("log")
  for ax in axes:
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
