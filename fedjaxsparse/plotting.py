"""Result plots: the test metric against rounds and against cumulative uplink bits, one line
per method, plus the training loss against rounds; diagnostics series; one-panel plots.

Every ``*_figure`` builder returns the matplotlib Figure; every ``plot_*`` builds it, saves a
PNG and closes it. ``methods = {name: record}`` with ``record["history"] = {"rounds": {...},
"evals": {...}}`` and optionally ``record["diverged"] = {"round": int, "quantity": str}``.
Pass one ``colors = method_colors(all_names)`` to every figure of an experiment so a method
keeps its colour across figures.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
import numpy as np
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

# column name -> (panel title, axis label with units)
LABELS: dict[str, tuple[str, str]] = {
    # diagnostics (``rounds`` columns)
    "sum_h_norm": ("zero-sum drift ‖Σᵢ hᵢ‖", "‖Σᵢ hᵢ‖"),
    "mean_h_norm": ("control-variate size", "mean ‖hᵢ‖"),
    "server_norm": ("server model norm", "‖w‖"),
    "loss": ("training loss", "loss"),
    # test metrics (``evals`` columns)
    "accuracy": ("test accuracy", "accuracy"),
    "r2": ("test R²", "R²"),
    "mse": ("test mean squared error", "MSE"),
    "gap": ("optimality gap", "gap (f − f* or ‖∇f‖²)"),
    # x axes
    "round": ("communication round", "communication round"),
    "local_steps": ("local steps", "local steps (iterations)"),
    "communication_round": ("communication round", "communication round (expected)"),
    "communications": ("communication rounds", "communication rounds"),
    "uplink_bits": ("uplink bits", "cumulative uplink bits, all clients"),
    "uplink_bits_per_client": ("uplink bits per client", "cumulative uplink bits per client"),
    "downlink_bits": ("downlink bits", "cumulative downlink bits, all clients"),
    "downlink_bits_per_client": ("downlink bits per client",
                                 "cumulative downlink bits per client"),
    "bits_per_node": ("bits per node", "bits sent per node"),
}


def method_colors(names: Sequence[str]) -> dict[str, str]:
  """One colour per method in the given order: tab10, then tab20's light shades, then
  tab20b/tab20c (cycling beyond 50 methods)."""
  palette = _palette()
  out: dict[str, str] = {}
  for name in names:
    if name not in out:
      out[name] = palette[len(out) % len(palette)]
  return out


def _palette() -> list[str]:
  cm = matplotlib.colormaps
  return ([to_hex(c) for c in cm["tab10"].colors]
          + [to_hex(c) for c in cm["tab20"].colors[1::2]]
          + [to_hex(c) for c in cm["tab20b"].colors]
          + [to_hex(c) for c in cm["tab20c"].colors])


def _colors(methods: Mapping, colors: Mapping | None) -> dict[str, str]:
  """``colors`` completed with unused palette colours for methods it lacks."""
  if colors is None:
    return method_colors(list(methods))
  out = dict(colors)
  free = [c for c in _palette() if c not in set(map(str, out.values()))] or _palette()
  for name in methods:
    if name not in out:
      out[name] = free.pop(0) if free else _palette()[len(out) % len(_palette())]
  return out


def _entry(name: str, labels: Mapping | None) -> tuple[str, str]:
  """(title, axis label) of a column: ``labels`` (a pair or one string), LABELS, the name."""
  v = {**LABELS, **(labels or {})}.get(name, (name, name))
  return (v, v) if isinstance(v, str) else (v[0], v[1])


def _title(name: str, labels: Mapping | None = None) -> str:
  return _entry(name, labels)[0]


def _axis(name: str, labels: Mapping | None = None) -> str:
  return _entry(name, labels)[1]


def _label(name: str, record: Mapping) -> str:
  """The legend label: the name, plus the divergence round when the run stopped on a NaN."""
  div = record.get("diverged") if isinstance(record, Mapping) else None
  if not div:
    return name
  r = div.get("round") if isinstance(div, Mapping) else None
  return f"{name} (diverged at round {r})" if r is not None else f"{name} (diverged)"


def _floats(values) -> list[float]:
  return [math.nan if v is None else float(v) for v in values]


def _line(ax, xs, ys, color: str, diverged: bool, gid: str, **kw) -> None:
  """Plot one method's line (``gid`` = method name); a diverged method's last finite point
  gets an ``x`` marker (``gid`` = "NAME:diverged")."""
  xs, ys = _floats(xs), _floats(ys)
  n = min(len(xs), len(ys))
  xs, ys = xs[:n], ys[:n]
  if not n:
    return
  ax.plot(xs, ys, color=color, gid=gid, **kw)
  if diverged:
    last = [i for i in range(n) if math.isfinite(xs[i]) and math.isfinite(ys[i])]
    if last:
      i = last[-1]
      ax.plot([xs[i]], [ys[i]], ls="none", marker="x", ms=10, mew=2.2, color=color,
              zorder=5, gid=f"{gid}:diverged")


def _log_if_positive(ax, axis: str = "y") -> None:
  """Log scale on ``axis`` when the axes hold a positive finite value (else keep linear)."""
  data = [v for ln in ax.get_lines() for v in (ln.get_ydata() if axis == "y"
                                                else ln.get_xdata())]
  if any(math.isfinite(float(v)) and float(v) > 0 for v in data):
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")


def _finish(fig, axes, methods: Mapping, colors: Mapping, title: str) -> plt.Figure:
  """Grid, one figure-level legend outside every axes, and the suptitle."""
  for ax in axes:
    ax.grid(alpha=0.3)
  handles, names = [], []
  for name, record in methods.items():
    names.append(_label(name, record))
    div = bool(record.get("diverged"))
    handles.append(Line2D([], [], color=colors[name], lw=1.6, marker="x" if div else None,
                          ms=8, mew=2))
  if handles:
    fig.legend(handles, names, loc="outside right upper", fontsize=9, frameon=False)
  if title:
    fig.suptitle(title)
  return fig


def _save(fig, path: str) -> str:
  if jax.process_index() == 0:  # several processes: the first writes
    fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def methods_figure(methods: dict, metric: str, title: str = "", log_loss: bool = True,
                   x: str = "round", bits: str = "uplink_bits", colors: dict | None = None,
                   labels: dict | None = None) -> plt.Figure:
  """Three panels: ``metric`` vs ``x``, ``metric`` vs the evals column ``bits`` (log x,
  points with zero bits dropped), training loss vs ``x``."""
  colors = _colors(methods, colors)
  fig, axes = plt.subplots(1, 3, figsize=(17, 4.6), layout="constrained")
  for name, record in methods.items():
    h = record["history"]
    ev, rd = h["evals"], h["rounds"]
    div = bool(record.get("diverged"))
    if metric in ev and x in ev:
      _line(axes[0], ev[x], ev[metric], colors[name], div, name, marker=".", lw=1.2)
    if metric in ev and bits in ev:
      sent = [(b, v) for b, v in zip(ev[bits], ev[metric]) if b is not None and b > 0]
      if sent:
        _line(axes[1], *zip(*sent), colors[name], div, name, marker=".", lw=1.2)
    if "loss" in rd and x in rd:
      _line(axes[2], rd[x], rd["loss"], colors[name], div, name, lw=1)
  mt, my = _title(metric, labels), _axis(metric, labels)
  axes[0].set(xlabel=_axis(x, labels), ylabel=my, title=f"{mt} vs {_title(x, labels)}")
  axes[1].set(xlabel=_axis(bits, labels), ylabel=my, title=f"{mt} vs {_title(bits, labels)}")
  axes[1].set_xscale("log")
  axes[2].set(xlabel=_axis(x, labels), ylabel=_axis("loss", labels),
              title=_title("loss", labels))
  if log_loss:
    _log_if_positive(axes[2])
  return _finish(fig, axes, methods, colors, title)


def plot_methods(methods: dict, metric: str, path: str, title: str = "",
                 log_loss: bool = True, x: str = "round", bits: str = "uplink_bits",
                 colors: dict | None = None, labels: dict | None = None) -> str:
  """Save :func:`methods_figure` as a PNG at ``path``; returns ``path``."""
  return _save(methods_figure(methods, metric, title, log_loss, x, bits, colors, labels), path)


def series_figure(methods: dict, names: list[str], title: str = "", x: str = "round",
                  colors: dict | None = None, labels: dict | None = None) -> plt.Figure:
  """One log-scale panel per ``rounds`` column in ``names`` (e.g. the zero-sum diagnostics
  ``sum_h_norm``, ``mean_h_norm``, ``server_norm``, ``loss``), one line per method."""
  colors = _colors(methods, colors)
  fig, axes = plt.subplots(1, len(names), figsize=(4.3 * len(names) + 2.5, 4.0),
                           layout="constrained", squeeze=False)
  axes = list(axes[0])
  for ax, name in zip(axes, names):
    for method, record in methods.items():
      rd = record["history"]["rounds"]
      if name in rd and x in rd:
        _line(ax, rd[x], rd[name], colors[method], bool(record.get("diverged")), method,
              lw=1)
    ax.set(xlabel=_axis(x, labels), ylabel=_axis(name, labels), title=_title(name, labels))
    _log_if_positive(ax)
  return _finish(fig, axes, methods, colors, title)


def plot_series(methods: dict, names: list[str], path: str, title: str = "",
                x: str = "round", colors: dict | None = None,
                labels: dict | None = None) -> str:
  """Save :func:`series_figure` as a PNG at ``path``; returns ``path``."""
  return _save(series_figure(methods, names, title, x, colors, labels), path)


def evals_figure(methods: dict, y: str, x: str, title: str = "", logx: bool = False,
                 logy: bool = True, colors: dict | None = None,
                 labels: dict | None = None) -> plt.Figure:
  """One panel: the ``evals`` column ``y`` against the column ``x``, one line per method."""
  colors = _colors(methods, colors)
  fig, ax = plt.subplots(figsize=(8.5, 4.6), layout="constrained")
  for name, record in methods.items():
    ev = record["history"]["evals"]
    if y in ev and x in ev:
      _line(ax, ev[x], ev[y], colors[name], bool(record.get("diverged")), name,
              lw=1.2)
  ax.set(xlabel=_axis(x, labels), ylabel=_axis(y, labels),
         title=f"{_title(y, labels)} vs {_title(x, labels)}")
  if logx:
    ax.set_xscale("log")
  if logy:
    _log_if_positive(ax)
  return _finish(fig, [ax], methods, colors, title)


def plot_evals(methods: dict, y: str, x: str, path: str, title: str = "",
               logx: bool = False, logy: bool = True, colors: dict | None = None,
               labels: dict | None = None) -> str:
  """Save :func:`evals_figure` as a PNG at ``path``; returns ``path``."""
  return _save(evals_figure(methods, y, x, title, logx, logy, colors, labels), path)


def personal_figure(methods: dict, metric: str = "accuracy", title: str = "",
                    x: str = "round", colors: dict | None = None,
                    labels: dict | None = None) -> plt.Figure:
  """Personalised FL at a glance (evals of
  :func:`fedjaxsparse.evaluation.make_personal_eval_fn`), three panels: the personalised
  ``metric`` (example-weighted, solid) and the global model's ``global_<metric>`` (dashed)
  vs ``x``; the plain client mean ``<metric>_client_mean``; the clients' final
  ``<metric>_per_client`` sorted (the spread behind the averages)."""
  colors = _colors(methods, colors)
  fig, axes = plt.subplots(1, 3, figsize=(17, 4.6), layout="constrained")
  for name, record in methods.items():
    ev, div, c = record["history"]["evals"], bool(record.get("diverged")), colors[name]
    if x not in ev:
      continue
    if metric in ev:
      _line(axes[0], ev[x], ev[metric], c, div, name, marker=".", lw=1.4)
    if f"global_{metric}" in ev:
      _line(axes[0], ev[x], ev[f"global_{metric}"], c, False, f"{name}:global", ls="--",
            lw=1.1)
    if f"{metric}_client_mean" in ev:
      _line(axes[1], ev[x], ev[f"{metric}_client_mean"], c, div, name, marker=".", lw=1.4)
    per = ev.get(f"{metric}_per_client")
    if per:
      final = np.sort([v for v in _floats(per[-1]) if math.isfinite(v)])
      _line(axes[2], np.arange(1, len(final) + 1) / max(len(final), 1), final, c, False,
            name, lw=1.6)
  mt, my = _title(metric, labels), _axis(metric, labels)
  axes[0].set(xlabel=_axis(x, labels), ylabel=my,
              title=f"{mt}: personal models (solid), global model (dashed)")
  axes[1].set(xlabel=_axis(x, labels), ylabel=my, title=f"{mt}: plain mean over clients")
  axes[2].set(xlabel="fraction of clients", ylabel=my,
              title=f"{mt} of each client at the end (sorted)")
  return _finish(fig, axes, methods, colors, title)


def plot_personal(methods: dict, path: str, metric: str = "accuracy", title: str = "",
                  x: str = "round", colors: dict | None = None,
                  labels: dict | None = None) -> str:
  """Save :func:`personal_figure` as a PNG at ``path``; returns ``path``."""
  return _save(personal_figure(methods, metric, title, x, colors, labels), path)


def plot_curves(curves: Mapping[str, tuple], path: str, xlabel: str, ylabel: str,
                title: str = "", baseline: tuple[str, float] | None = None,
                logx: bool = True, xticks: Sequence[str] | None = None) -> str:
  """One panel of final results against a swept value (seed 003 Fig. 5: accuracy against the
  noise scale, a line per method and distribution): ``curves`` maps a label to ``(xs, ys)``
  (``None`` ys — diverged runs — are skipped); ``baseline`` is ``(label, y)``, drawn as a
  dashed horizontal line; ``xticks`` names the points x = 0, 1, ... (a categorical axis).
  Returns ``path``."""
  fig, ax = plt.subplots(figsize=(7.5, 4.2), layout="constrained")
  colors = method_colors(list(curves))
  for label, (xs, ys) in curves.items():
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
    if pts:
      ax.plot(*zip(*pts), marker="o", color=colors[label], label=label)
  if baseline is not None:
    ax.axhline(baseline[1], color="black", ls="--", lw=1.2, label=baseline[0])
  if logx:
    ax.set_xscale("log")
  if xticks is not None:
    ax.set_xticks(range(len(xticks)), list(xticks))
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  fig.legend(loc="outside right upper", fontsize=8, frameon=False)
  if title:
    ax.set_title(title)
  return _save(fig, path)
