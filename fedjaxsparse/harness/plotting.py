"""Result plots: the test metric against rounds and against cumulative uplink bits, one line
per method, plus the training loss against rounds; diagnostics series; one-panel plots.

Every ``*_figure`` builder returns the matplotlib Figure; every ``plot_*`` builds it, saves a
PNG and closes it. ``methods = {name: record}`` with ``record["history"] = {"rounds": {...},
"evals": {...}}`` and optionally ``record["diverged"] = {"round": int, "quantity": str}``.
Pass one ``colors = method_colors(all_names)`` to every figure of an experiment so a method
keeps its colour across figures.

One layer for every figure: titles wrap to the figure's width, legends sit outside the data
(to the right, below any title), round axes get integer ticks, log axes label only decades
(or a few ticks when the data span less than one), a method whose series cannot be drawn on a
log axis (zero bits: Local training) is named in a note under the panel, and methods cycle
through line styles as well as colours so identical curves stay distinguishable.
:func:`layout_problems` lists, from matplotlib's own layout, every text that overlaps another
or leaves the figure; with ``FEDJAXSPARSE_CHECK_PLOTS=1`` in the environment (the test suite
sets it) every saved figure must have none.

Source for the team: seed 000 Fig. 5 (client sizes); seed 001 Fig. 6.1 (matrix); seed 003 Fig. 5
(curves).
"""
from __future__ import annotations

import math
import os
import textwrap
from typing import Mapping, Sequence

import jax
import numpy as np
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
from matplotlib import ticker  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["method_colors", "method_styles", "log_axis", "integer_axis", "wrap", "layout_problems",
           "save_figure", "methods_figure", "plot_methods", "series_figure", "plot_series",
           "evals_figure", "plot_evals", "personal_figure", "plot_personal", "plot_curves",
           "panels_figure", "plot_panels", "bars_figure", "plot_bars", "client_sizes_figure",
           "plot_client_sizes", "matrix_figure", "plot_matrix", "scatter_figure", "plot_scatter"]
__dir__ = _public_dir(__all__)

CHECK_ENV = "FEDJAXSPARSE_CHECK_PLOTS"
STYLES = ("-", "--", "-.", ":")
# x columns that count whole things (rounds, communications): integer ticks
INTEGER_AXES = ("round", "communications", "communication_round", "local_steps", "epoch",
                "outer", "iteration")

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
    "gap": ("optimality gap", "f(x) − f*"),
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


def method_styles(names: Sequence[str]) -> dict[str, str]:
  """One line style per method in the given order (cycling ``STYLES``): with the colours of
  :func:`method_colors`, two methods whose curves coincide stay distinguishable."""
  out: dict[str, str] = {}
  for name in names:
    if name not in out:
      out[name] = STYLES[len(out) % len(STYLES)]
  return out


def _palette() -> list[str]:
  cm = matplotlib.colormaps
  return ([to_hex(c) for c in cm["tab10"].colors]
          + [to_hex(c) for c in cm["tab20"].colors[1::2]]
          + [to_hex(c) for c in cm["tab20b"].colors]
          + [to_hex(c) for c in cm["tab20c"].colors])


def _colors(methods: Mapping, colors: Mapping | Sequence[str] | None) -> dict[str, str]:
  """``colors`` completed with unused palette colours for methods it lacks; a list of names is
  :func:`method_colors` of those names (a figure of some of an experiment's methods keeping
  the colours they have in a figure of all of them)."""
  if colors is None:
    return method_colors(list(methods))
  if not isinstance(colors, Mapping):
    colors = method_colors(list(colors))
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


MAX_MARKERS = 40  # points per line beyond which markers would merge into a band


def _line(ax, xs, ys, color: str, diverged: bool, gid: str, **kw) -> None:
  """Plot one method's line (``gid`` = method name); a diverged method's last finite point
  gets an ``x`` marker (``gid`` = "NAME:diverged"). Point markers are dropped from lines with
  more than ``MAX_MARKERS`` points."""
  xs, ys = _floats(xs), _floats(ys)
  n = min(len(xs), len(ys))
  xs, ys = xs[:n], ys[:n]
  if not n:
    return
  if n > MAX_MARKERS and kw.get("marker") not in (None, "x"):
    kw = {k: v for k, v in kw.items() if k != "marker"}
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
    log_axis(ax, axis)


def log_axis(ax, axis: str = "y", values: Sequence[float] | None = None) -> None:
  """A log-scaled ``axis`` whose labels cannot collide: decades only (at most 6 labelled),
  unlabelled minor ticks; a span holding fewer than two powers of ten (of ``values``, default:
  the lines' data) labels 1-2-5 ticks instead (a single value: the axis spans ×1.5 around it), and a
  span of less than a factor 2 stays linear (a log axis there labels one or two ticks, or
  repeats a rounded label)."""
  (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
  ax_ = ax.yaxis if axis == "y" else ax.xaxis
  ax_.set_major_locator(ticker.LogLocator(base=10, numticks=7))
  ax_.set_minor_formatter(ticker.NullFormatter())
  data = [float(v) for v in values] if values is not None else [
      float(v) for ln in ax.get_lines()
      for v in (ln.get_ydata() if axis == "y" else ln.get_xdata())]
  pos = [v for v in data if math.isfinite(v) and v > 0]
  decades = (math.floor(math.log10(max(pos))) - math.ceil(math.log10(min(pos))) + 1
             if pos else 0)   # the powers of ten inside the data's span
  if pos and decades < 2:
    lo, hi = min(pos), max(pos)
    if hi / lo < 1.01:   # one value: matplotlib would pad the view to a decade of ticks
      lo, hi = lo / 1.5, hi * 1.5
      (ax.set_ylim if axis == "y" else ax.set_xlim)(lo, hi)
    elif hi / lo < 2.0:   # a narrow span: linear, plain numbers without an offset
      (ax.set_yscale if axis == "y" else ax.set_xscale)("linear")
      ax_.set_major_locator(ticker.MaxNLocator(6))
      ax_.set_major_formatter(ticker.ScalarFormatter(useOffset=False))
      return
    subs = (1.0, 2.0, 5.0) if hi / lo > 2.5 else (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0,
                                                  6.0, 8.0)
    ax_.set_major_locator(ticker.LogLocator(base=10, subs=subs, numticks=12))
    ax_.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))  # plain numbers


def integer_axis(ax, axis: str = "x") -> None:
  """Integer ticks on a linear ``axis`` that counts rounds, epochs or communications."""
  ax_ = ax.xaxis if axis == "x" else ax.yaxis
  if ax_.get_scale() == "linear":
    ax_.set_major_locator(ticker.MaxNLocator(integer=True))


def _plain(ax) -> None:
  """No offset ('+1e5') or scientific-notation factor on the linear axes' tick labels."""
  for axis in ("x", "y"):
    scale = ax.get_xscale() if axis == "x" else ax.get_yscale()
    if scale == "linear":
      try:
        ax.ticklabel_format(axis=axis, useOffset=False)
      except AttributeError:  # a categorical or fixed formatter
        pass


def wrap(text: str, width_in: float, fontsize: float = 12.0) -> str:
  """``text`` wrapped to lines that fit ``width_in`` inches at ``fontsize`` points."""
  chars = max(20, int(width_in * 72 / (0.55 * fontsize)))
  return "\n".join(textwrap.fill(part, chars) for part in text.split("\n"))


def _finish(fig, axes, methods: Mapping, colors: Mapping, title: str,
            styles: Mapping | None = None, x: str | None = None) -> plt.Figure:
  """Grid, integer round ticks, panel titles wrapped to their panel, one figure-level legend
  outside every axes (line styles as drawn), and the suptitle wrapped to the figure."""
  width = fig.get_size_inches()[0]
  for ax in axes:
    ax.grid(alpha=0.3)
    if x in INTEGER_AXES:
      integer_axis(ax)
    _plain(ax)
    if ax.get_title():
      ax.set_title(wrap(ax.get_title(), ax.get_position().width * width, 11))
  handles, names = [], []
  for name, record in methods.items():
    names.append(_label(name, record))
    div = bool(record.get("diverged"))
    handles.append(Line2D([], [], color=colors[name], lw=1.6, marker="x" if div else None,
                          ms=8, mew=2, ls=(styles or {}).get(name, "-")))
  if handles:  # below the panels: off the data and off every title
    fig.legend(handles, names, loc="outside lower center", fontsize=9, frameon=False,
               handlelength=3, ncol=max(1, min(len(handles), int(width // 2.8))))
  if title:
    fig.suptitle(wrap(title, 0.9 * width, 13))
  return fig


def _texts(fig) -> list:
  """Every visible, non-empty text the figure draws (titles, labels, tick labels inside the
  view, legend entries, annotations), after a draw."""
  out = []
  for t in fig.findobj(matplotlib.text.Text):
    if not t.get_visible() or not t.get_text().strip():
      continue
    out.append(t)
  drawn = set()
  for ax in fig.axes:
    for axis in (ax.xaxis, ax.yaxis):
      # the ticks matplotlib draws: those inside the view interval (its own test)
      for tick in axis._update_ticks():  # noqa: SLF001
        drawn.update(id(lbl) for lbl in (tick.label1, tick.label2) if lbl.get_visible())
  ticks = {id(lbl) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
           for tick in axis.get_major_ticks() + axis.get_minor_ticks()
           for lbl in (tick.label1, tick.label2)}
  return [t for t in out if id(t) not in ticks or id(t) in drawn]


def layout_problems(fig, drawn: bool = False) -> list[str]:
  """What a reader would see as broken in ``fig``: each text (title, axis or tick label,
  legend entry) that leaves the figure or overlaps another text, and each legend that covers
  an axes' data area or a title — measured on matplotlib's own layout (drawn once; ``drawn``:
  the figure's canvas has just been drawn, so its layout is final). Empty for a clean
  figure."""
  if not drawn:
    fig.draw_without_rendering()  # the final layout (constrained layout included), no pixels
  renderer = fig.canvas.get_renderer()
  frame = fig.bbox
  texts = _texts(fig)
  boxes = [(t, t.get_window_extent(renderer)) for t in texts]
  problems = []
  name = lambda t: repr(t.get_text()[:40])
  for t, b in boxes:
    if (b.x0 < frame.x0 - 1 or b.y0 < frame.y0 - 1 or b.x1 > frame.x1 + 1
        or b.y1 > frame.y1 + 1):
      problems.append(f"text {name(t)} leaves the figure")
  for i in range(len(boxes)):
    for j in range(i + 1, len(boxes)):
      (t1, b1), (t2, b2) = boxes[i], boxes[j]
      inter_w = min(b1.x1, b2.x1) - max(b1.x0, b2.x0)
      inter_h = min(b1.y1, b2.y1) - max(b1.y0, b2.y0)
      if inter_w > 1 and inter_h > 1:
        problems.append(f"text {name(t1)} overlaps text {name(t2)}")
  titles = [b for t, b in boxes if t is getattr(fig, "_suptitle", None)
            or any(t is ax.title for ax in fig.axes)]
  for legend in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
    lb = legend.get_window_extent(renderer)
    for ax in fig.axes:
      if legend in fig.legends and lb.overlaps(ax.get_window_extent(renderer)):
        inter_w = min(lb.x1, ax.bbox.x1) - max(lb.x0, ax.bbox.x0)
        inter_h = min(lb.y1, ax.bbox.y1) - max(lb.y0, ax.bbox.y0)
        if inter_w > 1 and inter_h > 1:
          problems.append("a figure legend covers an axes' data area")
    for tb in titles:
      inter_w = min(lb.x1, tb.x1) - max(lb.x0, tb.x0)
      inter_h = min(lb.y1, tb.y1) - max(lb.y0, tb.y0)
      if inter_w > 1 and inter_h > 1:
        problems.append("a legend overlaps a title")
  return problems


def save_figure(fig, path: str, dpi: int = 110) -> str:
  """Save ``fig`` as ``path`` (the first process writes) and close it; returns ``path``. With
  ``FEDJAXSPARSE_CHECK_PLOTS=1`` a figure with :func:`layout_problems` is an error."""
  if os.environ.get(CHECK_ENV, "") not in ("", "0"):
    # one draw at the saved resolution: the layout checked is the image written (a check
    # before ``savefig`` would lay the figure out twice, as much time again)
    from matplotlib.backends.backend_agg import FigureCanvasAgg   # noqa: PLC0415
    from PIL import Image   # noqa: PLC0415  (matplotlib's own PNG writer)
    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(dpi)
    canvas.draw()
    problems = layout_problems(fig, drawn=True)
    if problems:
      plt.close(fig)
      raise AssertionError(f"{os.path.basename(path)}: " + "; ".join(sorted(set(problems))))
    if jax.process_index() == 0:
      Image.fromarray(np.asarray(canvas.buffer_rgba())).save(path, format="png")
    plt.close(fig)
    return path
  if jax.process_index() == 0:  # several processes: the first writes
    fig.savefig(path, dpi=dpi)
  plt.close(fig)
  return path


_save = save_figure


def methods_figure(methods: dict, metric: str, title: str = "", log_loss: bool = True,
                   x: str = "round", bits: str = "uplink_bits", colors: dict | None = None,
                   labels: dict | None = None, loss_key: str = "loss",
                   bands: dict | None = None) -> plt.Figure:
  """Three panels: ``metric`` vs ``x``, ``metric`` vs the evals column ``bits`` (log x,
  points with zero bits dropped; a method that sent none is named in the panel's title), and
  the column ``loss_key`` (``rounds``, else ``evals``: the training loss, or the objective of
  the model a table reports) vs ``x``.

  ``bands = {method: {column: {"x", "mean", "se"}}}`` (the mean over seeds of ``metric`` or
  ``loss_key`` at each evaluation and its standard error): that method's line in the panels
  against ``x`` is the mean, with the standard error shaded (the papers' figures); the bits
  panel keeps the record's run."""
  colors, styles = _colors(methods, colors), method_styles(list(methods))
  fig, axes = plt.subplots(1, 3, figsize=(17, 4.6), layout="constrained")
  unsent = []
  for name, record in methods.items():
    h = record["history"]
    ev, rd = h["evals"], h["rounds"]
    div, ls = bool(record.get("diverged")), styles[name]
    band = (bands or {}).get(name, {})
    if metric in band:
      _band(axes[0], band[metric], colors[name], name, ls)
    elif metric in ev and x in ev:
      _line(axes[0], ev[x], ev[metric], colors[name], div, name, marker=".", lw=1.2, ls=ls)
    if metric in ev and bits in ev:
      sent = [(b, v) for b, v in zip(ev[bits], ev[metric]) if b is not None and b > 0]
      if sent:
        _line(axes[1], *zip(*sent), colors[name], div, name, marker=".", lw=1.2, ls=ls)
      else:
        unsent.append(name)
    src = rd if loss_key in rd else ev  # a rounds column, or an evals one
    if loss_key in band:
      _band(axes[2], band[loss_key], colors[name], name, ls)
    elif loss_key in src and x in src:
      _line(axes[2], src[x], src[loss_key], colors[name], div, name, lw=1, ls=ls)
  mt, my = _title(metric, labels), _axis(metric, labels)
  axes[0].set(xlabel=_axis(x, labels), ylabel=my, title=f"{mt} vs {_title(x, labels)}")
  note = f"\n(not on the log axis, 0 bits: {', '.join(unsent)})" if unsent else ""
  axes[1].set(xlabel=_axis(bits, labels), ylabel=my,
              title=f"{mt} vs {_title(bits, labels)}{note}")
  if axes[1].get_lines():
    log_axis(axes[1], "x")
  axes[2].set(xlabel=_axis(x, labels), ylabel=_axis(loss_key, labels),
              title=_title(loss_key, labels))
  if log_loss:
    _log_if_positive(axes[2])
  return _finish(fig, axes, methods, colors, title, styles, x)




def _band(ax, band: Mapping, color: str, gid: str, ls: str) -> None:
  """The mean over seeds as the line, ± one standard error shaded."""
  xs, mean = _floats(band["x"]), np.asarray(_floats(band["mean"]))
  se = np.asarray(_floats(band["se"])) if band.get("se") is not None else np.zeros_like(mean)
  _line(ax, xs, mean, color, False, gid, lw=1.2, ls=ls)
  ax.fill_between(xs, mean - se, mean + se, color=color, alpha=0.18, lw=0)


def plot_methods(methods: dict, metric: str, path: str, title: str = "",
                 log_loss: bool = True, x: str = "round", bits: str = "uplink_bits",
                 colors: dict | None = None, labels: dict | None = None,
                 loss_key: str = "loss", bands: dict | None = None) -> str:
  """Save :func:`methods_figure` as a PNG at ``path``; returns ``path``."""
  return _save(methods_figure(methods, metric, title, log_loss, x, bits, colors, labels,
                              loss_key, bands), path)


def series_figure(methods: dict, names: list[str], title: str = "", x: str = "round",
                  colors: dict | None = None, labels: dict | None = None) -> plt.Figure:
  """One log-scale panel per ``rounds`` column in ``names`` (e.g. the zero-sum diagnostics
  ``sum_h_norm``, ``mean_h_norm``, ``server_norm``, ``loss``), one line per method."""
  colors, styles = _colors(methods, colors), method_styles(list(methods))
  fig, axes = plt.subplots(1, len(names), figsize=(4.3 * len(names) + 2.5, 4.0),
                           layout="constrained", squeeze=False)
  axes = list(axes[0])
  for ax, name in zip(axes, names):
    for method, record in methods.items():
      rd = record["history"]["rounds"]
      if name in rd and x in rd:
        _line(ax, rd[x], rd[name], colors[method], bool(record.get("diverged")), method,
              lw=1, ls=styles[method])
    ax.set(xlabel=_axis(x, labels), ylabel=_axis(name, labels), title=_title(name, labels))
    _log_if_positive(ax)
  return _finish(fig, axes, methods, colors, title, styles, x)


def plot_series(methods: dict, names: list[str], path: str, title: str = "",
                x: str = "round", colors: dict | None = None,
                labels: dict | None = None) -> str:
  """Save :func:`series_figure` as a PNG at ``path``; returns ``path``."""
  return _save(series_figure(methods, names, title, x, colors, labels), path)


def evals_figure(methods: dict, y: str, x: str, title: str = "", logx: bool = False,
                 logy: bool = True, colors: dict | None = None,
                 labels: dict | None = None) -> plt.Figure:
  """One panel: the ``evals`` column ``y`` against the column ``x``, one line per method."""
  colors, styles = _colors(methods, colors), method_styles(list(methods))
  fig, ax = plt.subplots(figsize=(8.5, 4.6), layout="constrained")
  for name, record in methods.items():
    ev = record["history"]["evals"]
    if y in ev and x in ev:
      _line(ax, ev[x], ev[y], colors[name], bool(record.get("diverged")), name,
            lw=1.2, ls=styles[name])
  ax.set(xlabel=_axis(x, labels), ylabel=_axis(y, labels),
         title=f"{_title(y, labels)} vs {_title(x, labels)}")
  if logx:
    _log_if_positive(ax, "x")
  if logy:
    _log_if_positive(ax)
  return _finish(fig, [ax], methods, colors, title, styles, x)


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
  fig = _finish(fig, axes, methods, colors, title)
  for ax in axes[:2]:
    if x in INTEGER_AXES:
      integer_axis(ax)
  return fig


def plot_personal(methods: dict, path: str, metric: str = "accuracy", title: str = "",
                  x: str = "round", colors: dict | None = None,
                  labels: dict | None = None) -> str:
  """Save :func:`personal_figure` as a PNG at ``path``; returns ``path``."""
  return _save(personal_figure(methods, metric, title, x, colors, labels), path)


def plot_curves(curves: Mapping[str, tuple], path: str, xlabel: str, ylabel: str,
                title: str = "", baseline: tuple[str, float] | None = None,
                logx: bool = True, xticks: Sequence[str] | None = None) -> str:
  """One panel of final results against a swept value (as in Fig. 5 of the FedMRN paper, Li et
  al. 2024: accuracy against the noise scale, a line per method and distribution): ``curves``
  maps a label to ``(xs, ys)`` (``None`` ys — diverged runs — are skipped); ``baseline`` is
  ``(label, y)``, drawn as a dashed horizontal line; ``xticks`` names the points x = 0, 1, ...
  (a categorical axis). Returns ``path``."""
  fig, ax = plt.subplots(figsize=(7.5, 4.2), layout="constrained")
  colors, styles = method_colors(list(curves)), method_styles(list(curves))
  for label, (xs, ys) in curves.items():
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
    if pts:
      ax.plot(*zip(*pts), marker="o" if len(pts) <= MAX_MARKERS else None,
              color=colors[label], ls=styles[label], label=label)
  if baseline is not None:
    ax.axhline(baseline[1], color="black", ls="--", lw=1.2, label=baseline[0])
  if logx and ax.get_lines():
    _log_if_positive(ax, "x")
  if xticks is not None:
    ax.set_xticks(range(len(xticks)), list(xticks))
  elif any(w in xlabel.lower() for w in ("epoch", "round", "iteration")):
    integer_axis(ax)
  _plain(ax)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  n = len(ax.get_legend_handles_labels()[0])
  fig.legend(loc="outside lower center", fontsize=8, frameon=False, handlelength=3,
             ncol=max(1, min(n, 3)))
  if title:
    ax.set_title(wrap(title, 6.5, 11))
  return _save(fig, path)


def panels_figure(panels: Sequence[Mapping], title: str = "") -> plt.Figure:
  """Several studies of one experiment side by side, one panel each, each with its own legend
  below it (a cost against a swept parameter beside error curves against rounds, say).

  Each panel is a mapping with ``lines`` (``{label: (xs, ys)}``; ``xs`` ``None``: the points
  0, 1, ...; points with a ``None`` y are skipped, a label without points stays in the
  legend), ``title``, ``xlabel``, ``ylabel`` and optionally ``marker`` (a point marker for
  every line) and ``logy`` (a log y axis when the panel holds a positive value). Colours and
  line styles follow the labels of each panel (:func:`method_colors`, :func:`method_styles`);
  x axes that stay linear get integer ticks; ``title`` is the figure's, wrapped to its width."""
  fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels) + 1, 4.4),
                           layout="constrained", squeeze=False)
  for ax, panel in zip(axes[0], panels):
    lines = panel["lines"]
    colors, styles = method_colors(list(lines)), method_styles(list(lines))
    for label, (xs, ys) in lines.items():
      xs = range(len(ys)) if xs is None else xs
      pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
      ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=panel.get("marker"),
              color=colors[label], ls=styles[label], label=label)
    ax.set(xlabel=panel.get("xlabel", ""), ylabel=panel.get("ylabel", ""),
           title=panel.get("title", ""))
    if panel.get("logy"):
      _log_if_positive(ax)
    integer_axis(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
              frameon=False)  # below the panel: off the data
  if title:
    fig.suptitle(wrap(title, fig.get_size_inches()[0], 13))
  return fig


def plot_panels(panels: Sequence[Mapping], path: str, title: str = "") -> str:
  """Save :func:`panels_figure` as a PNG at ``path``; returns ``path``."""
  return _save(panels_figure(panels, title), path)


def bars_figure(bars: Mapping[str, Sequence[float | None]], groups: Sequence[str],
                ylabel: str, title: str = "", baseline: tuple[str, float] | None = None,
                logy: bool = False) -> plt.Figure:
  """Grouped bars (a result per method and setting: perplexity after pruning at each sparsity,
  say): one group per entry of ``groups`` (the x tick labels), in each a bar per label of
  ``bars``, whose values hold one number per group (``None``: no bar); ``baseline`` is
  ``(label, y)``, drawn as a dashed horizontal line (the dense model, say); ``logy``: a log y
  axis over the bars and the baseline. One legend below the panel."""
  n = max(1, len(bars))
  fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(groups) * n / 2), 4.2),
                         layout="constrained")
  width = 0.8 / n
  colors = method_colors(list(bars))
  values = []
  for j, (label, ys) in enumerate(bars.items()):
    ys = _floats(ys)
    values += ys
    ax.bar(np.arange(len(groups)) + j * width, ys, width, color=colors[label], label=label)
  if baseline is not None:
    ax.axhline(baseline[1], color="k", ls="--", lw=1, label=baseline[0])
    values.append(float(baseline[1]))
  ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, list(groups))
  if logy:
    log_axis(ax, "y", [v for v in values if math.isfinite(v) and v > 0])
  ax.set_ylabel(ylabel)
  if title:
    ax.set_title(wrap(title, fig.get_size_inches()[0] - 2, 11))
  handles = len(ax.get_legend_handles_labels()[0])
  fig.legend(loc="outside lower center", fontsize=8, frameon=False,
             ncol=max(1, min(handles, 4)))
  return fig


def plot_bars(bars: Mapping[str, Sequence[float | None]], groups: Sequence[str], path: str,
              ylabel: str, title: str = "", baseline: tuple[str, float] | None = None,
              logy: bool = False) -> str:
  """Save :func:`bars_figure` as a PNG at ``path``; returns ``path``."""
  return save_figure(bars_figure(bars, groups, ylabel, title, baseline, logy), path, dpi=120)


def client_sizes_figure(sizes: Sequence[int], title: str = "") -> plt.Figure:
  """A histogram of the clients' example counts on logarithmic bins (federated data sets with
  natural clients are very unequal: Fig. 5 of the Sparse-ProxSkip paper, Meinhardt et al.
  2024, for BlogFeedback), with the count of clients, the median and the largest size in the
  legend."""
  sizes = np.asarray(sizes, np.float64)
  sizes = sizes[sizes > 0]
  fig, ax = plt.subplots(figsize=(7.5, 4.2), layout="constrained")
  lo, hi = max(1.0, sizes.min()), max(2.0, sizes.max())
  bins = np.geomspace(lo, hi * 1.0001, min(40, max(5, int(np.sqrt(len(sizes))) + 1)))
  ax.hist(sizes, bins=bins, color=method_colors(["sizes"])["sizes"], edgecolor="white",
          label=f"{len(sizes)} clients; median {np.median(sizes):.0f}, largest "
                f"{sizes.max():.0f} examples")
  ax.set_xscale("log")
  _plain(ax)
  ax.set_xlabel("examples per client")
  ax.set_ylabel("clients")
  ax.grid(alpha=0.3)
  fig.legend(loc="outside lower center", fontsize=8, frameon=False)
  if title:
    ax.set_title(wrap(title, 6.5, 11))
  return fig


def plot_client_sizes(sizes: Sequence[int], path: str, title: str = "") -> str:
  """Save :func:`client_sizes_figure` as a PNG at ``path``; returns ``path``."""
  return _save(client_sizes_figure(sizes, title), path)


def matrix_figure(matrix, title: str = "", max_cells: int = 512) -> plt.Figure:
  """A weight matrix ``[in, out]`` as a heatmap of ``|W|`` (rows: input features, columns:
  output neurons; a matrix larger than ``max_cells`` on a side is shown by the largest ``|W|``
  of each block of cells, so a stripe survives the reduction), with the columns' and rows' mean
  ``|W|`` beside it — as in Fig. 6.1 of Kai Yi's dissertation (the SymWanda chapter), whose
  column stripes motivate RIA's normalisation."""
  w = np.abs(np.asarray(matrix, np.float64))
  if w.ndim != 2:
    raise ValueError(f"matrix must be 2-D [in, out], got shape {w.shape}.")
  shown = w
  for axis in (0, 1):
    n = shown.shape[axis]
    if n > max_cells:
      f = -(-n // max_cells)
      pad = f * (-(-n // f)) - n
      widths = [(0, 0), (0, 0)]
      widths[axis] = (0, pad)
      shown = np.pad(shown, widths)
      shape = list(shown.shape)
      shape[axis:axis + 1] = [shape[axis] // f, f]
      shown = shown.reshape(shape).max(axis=axis + 1)
  fig, axes = plt.subplots(1, 3, figsize=(14, 4.8), layout="constrained",
                           gridspec_kw={"width_ratios": [3, 1.2, 1.2]})
  im = axes[0].imshow(shown, aspect="auto", cmap="viridis", interpolation="nearest")
  fig.colorbar(im, ax=axes[0], label="|W| (block max)" if shown.shape != w.shape else "|W|")
  axes[0].set(xlabel="output neuron (column)", ylabel="input feature (row)",
              title=f"|W|, {w.shape[0]}×{w.shape[1]}")
  axes[1].plot(w.mean(0), color=method_colors(["c"])["c"], lw=1)
  axes[1].set(xlabel="output neuron (column)", ylabel="mean |W| of the column",
              title="column means")
  axes[2].plot(w.mean(1), color=method_colors(["c", "r"])["r"], lw=1)
  axes[2].set(xlabel="input feature (row)", ylabel="mean |W| of the row", title="row means")
  for ax in axes[1:]:
    ax.grid(alpha=0.3)
  if title:
    fig.suptitle(wrap(title, 13, 12))
  return fig


def plot_matrix(matrix, path: str, title: str = "", max_cells: int = 512) -> str:
  """Save :func:`matrix_figure` as a PNG at ``path``; returns ``path``."""
  return _save(matrix_figure(matrix, title, max_cells), path)


def scatter_figure(points, labels, title: str = "", xlabel: str = "", ylabel: str = "",
                   legend: str = "cluster") -> plt.Figure:
  """A 2-D scatter of ``points [n, 2]`` coloured by integer ``labels [n]`` (a legend entry per
  label, ``"{legend} {label}"``): an embedding of the data (t-SNE) and its clusters."""
  pts = np.asarray(points, np.float64)
  lab = np.asarray(labels)
  if pts.ndim != 2 or pts.shape[1] != 2 or lab.shape != (pts.shape[0],):
    raise ValueError(f"points must be [n, 2] and labels [n]; got {pts.shape} and {lab.shape}.")
  kinds = sorted(set(lab.tolist()))
  colors = method_colors([f"{legend} {k}" for k in kinds])
  fig, ax = plt.subplots(figsize=(7.5, 6.0), layout="constrained")
  for k in kinds:
    at = lab == k
    ax.scatter(pts[at, 0], pts[at, 1], s=6, alpha=0.7, color=colors[f"{legend} {k}"],
               label=f"{legend} {k} ({int(at.sum())})")
  ax.set(xlabel=xlabel, ylabel=ylabel)
  ax.grid(alpha=0.3)
  fig.legend(loc="outside lower center", fontsize=8, frameon=False,
             ncols=min(5, len(kinds)), markerscale=2)
  if title:
    ax.set_title(wrap(title, 6.5, 11))
  return fig


def plot_scatter(points, labels, path: str, title: str = "", xlabel: str = "",
                 ylabel: str = "", legend: str = "cluster") -> str:
  """Save :func:`scatter_figure` as a PNG at ``path``; returns ``path``."""
  return save_figure(scatter_figure(points, labels, title, xlabel, ylabel, legend), path,
                     dpi=120)
