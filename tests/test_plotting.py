"""Plotting: stable method colours, human axis labels, legend outside the axes, the bits
column of the communication panel, diverged-run labels."""
import math
import os

import matplotlib
import numpy as np
import pytest

from fedjaxsparse.harness import plotting
from fedjaxsparse.harness.plotting import (LABELS, evals_figure, method_colors, methods_figure,
                                           plot_evals, plot_methods, plot_series, series_figure)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NAMES = ["Final-TopK", "FedHT", "FedIHT", "ASP", "RandProx-l1", "SPS-Local", "SPS",
         "ASP-modified", "SPS-modified"]
CLIENTS = 10


def _record(i: int, rounds: int = 12, eval_every: int = 3, diverged_at: int | None = None):
  """A synthetic record; method ``i`` sends ``1000 (i + 1)`` bits (all clients) a round."""
  last = rounds if diverged_at is None else diverged_at
  r = list(range(1, last + 1))
  up = [1000.0 * (i + 1) * k for k in r]
  rd = {"round": r, "local_steps": [2 * k for k in r], "uplink_bits": up,
        "uplink_bits_per_client": [b / CLIENTS for b in up],
        "loss": [2.0 / (k + i) for k in r], "sum_h_norm": [1e-3 * (i + 1) / k for k in r],
        "mean_h_norm": [0.5 + 0.01 * k for k in r], "server_norm": [1.0 + 0.1 * k for k in r]}
  e = [0] + [k for k in r if k % eval_every == 0]
  ev = {"round": e, "local_steps": [2 * k for k in e],
        "uplink_bits": [1000.0 * (i + 1) * k for k in e],
        "uplink_bits_per_client": [100.0 * (i + 1) * k for k in e],
        "accuracy": [0.1 + 0.8 * (1 - math.exp(-k / (4 + i))) for k in e],
        "gap": [1.0 / (1 + k + i) for k in e],
        "bits_per_node": [100.0 * (i + 1) * k for k in e]}
  rec = {"history": {"rounds": rd, "evals": ev}}
  if diverged_at is not None:
    rec["diverged"] = {"round": diverged_at, "quantity": "loss"}
    rd["loss"][-1] = float("nan")
  return rec


@pytest.fixture
def records():
  return {n: _record(i) for i, n in enumerate(NAMES)}


@pytest.fixture(autouse=True)
def _close():
  yield
  plt.close("all")


def _lines(fig, name):
  """The data lines (not the divergence markers) of method ``name``, over all axes."""
  return [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid() == name]


def test_method_colors_distinct_stable_and_tab10_first():
  many = [f"m{i}" for i in range(25)]
  cols = method_colors(many)
  assert len(set(cols[m] for m in many[:20])) == 20
  tab10 = [matplotlib.colors.to_hex(c) for c in matplotlib.colormaps["tab10"].colors]
  assert [cols[m] for m in many[:10]] == tab10
  # a prefix keeps its colours when more methods are added
  assert method_colors(many[:4]) == {m: cols[m] for m in many[:4]}


def test_same_colour_across_figures_with_different_subsets(records):
  colors = method_colors(NAMES)
  fig1 = methods_figure(records, "accuracy", colors=colors)
  subset = {m: r for m, r in records.items() if m not in ("FedHT", "FedIHT")}
  fig2 = series_figure(subset, ["sum_h_norm", "mean_h_norm", "server_norm", "loss"],
                       colors=colors)
  for name in subset:
    c1 = {ln.get_color() for ln in _lines(fig1, name)}
    c2 = {ln.get_color() for ln in _lines(fig2, name)}
    assert len(c1) == 1 and c1 == c2, name
  # all methods of one figure are told apart
  assert len({_lines(fig1, n)[0].get_color() for n in NAMES}) == len(NAMES)


def test_default_colours_follow_given_order(records):
  fig = series_figure(records, ["loss"])
  expect = method_colors(NAMES)
  assert {n: _lines(fig, n)[0].get_color() for n in NAMES} == expect


def _figures(records):
  yield methods_figure(records, "accuracy", x="local_steps", bits="uplink_bits_per_client")
  yield series_figure(records, ["sum_h_norm", "mean_h_norm", "server_norm", "loss"],
                      x="local_steps")
  yield evals_figure(records, "gap", "bits_per_node", logx=True)
  yield series_figure(records, ["sum_h_norm"])


def test_every_axes_labelled_with_human_titles(records):
  raw = {"sum_h_norm", "mean_h_norm", "server_norm", "loss", "accuracy", "gap",
         "local_steps", "bits_per_node", "uplink_bits_per_client"}
  for fig in _figures(records):
    for ax in fig.axes:
      assert ax.get_xlabel().strip() and ax.get_ylabel().strip()
      assert ax.get_title().strip()
      assert ax.get_title() not in raw
      assert ax.get_ylabel() not in raw - {"loss", "accuracy"}
  fig = series_figure(records, ["sum_h_norm", "mean_h_norm"], x="local_steps")
  assert [ax.get_title() for ax in fig.axes] == [LABELS["sum_h_norm"][0],
                                                  LABELS["mean_h_norm"][0]]
  assert [ax.get_ylabel() for ax in fig.axes] == [LABELS["sum_h_norm"][1],
                                                   LABELS["mean_h_norm"][1]]
  assert fig.axes[0].get_xlabel() == "local steps (iterations)"


def test_unknown_column_falls_back_to_name_and_override(records):
  for r in records.values():
    r["history"]["rounds"]["weird_col"] = [1.0] * len(r["history"]["rounds"]["round"])
  fig = series_figure(records, ["weird_col"])
  assert fig.axes[0].get_title() == "weird_col" and fig.axes[0].get_ylabel() == "weird_col"
  fig = series_figure(records, ["weird_col"], labels={"weird_col": ("Weird", "w (units)")})
  assert fig.axes[0].get_title() == "Weird" and fig.axes[0].get_ylabel() == "w (units)"


def _overlap(a, b) -> bool:
  return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_legend_is_outside_every_axes(records):
  records["SPS"] = _record(6, diverged_at=7)
  for fig in _figures(records):
    fig.draw_without_rendering()   # the final layout (the extents a drawn figure has)
    renderer = fig.canvas.get_renderer()
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)
    leg = fig.legends[0].get_window_extent(renderer)
    fig_box = fig.bbox
    assert leg.x0 >= fig_box.x0 - 1 and leg.x1 <= fig_box.x1 + 1  # not clipped
    assert leg.y0 >= fig_box.y0 - 1 and leg.y1 <= fig_box.y1 + 1
    for ax in fig.axes:
      assert not _overlap(leg, ax.get_window_extent(renderer))
      assert not _overlap(leg, ax.get_tightbbox(renderer))  # nor its tick/axis labels
    assert len(fig.legends[0].get_texts()) == len(records)


def test_bits_panel_uses_chosen_column(records):
  fig = methods_figure(records, "accuracy", x="local_steps", bits="uplink_bits_per_client")
  bits_ax = fig.axes[1]
  assert "per client" in bits_ax.get_xlabel()
  assert bits_ax.get_xlabel() == LABELS["uplink_bits_per_client"][1]
  assert bits_ax.get_xscale() == "log"
  for name, rec in records.items():
    ev = rec["history"]["evals"]
    (ln,) = [ln for ln in bits_ax.get_lines() if ln.get_gid() == name]
    expect = [b for b in ev["uplink_bits_per_client"] if b > 0]
    np.testing.assert_allclose(ln.get_xdata(), expect)
    np.testing.assert_allclose(ln.get_ydata(), ev["accuracy"][1:])
    # per-client, not all-client bits
    assert not np.allclose(ln.get_xdata(), [b for b in ev["uplink_bits"] if b > 0])
  # default stays the all-client column
  fig = methods_figure(records, "accuracy")
  assert "all clients" in fig.axes[1].get_xlabel()
  ln = [ln for ln in fig.axes[1].get_lines() if ln.get_gid() == "ASP"][0]
  np.testing.assert_allclose(ln.get_xdata(),
                             records["ASP"]["history"]["evals"]["uplink_bits"][1:])


def test_diverged_record_label_and_marker(records):
  records["ASP"] = _record(3, diverged_at=7)
  records["SPS"]["diverged"] = None  # falsy: an ordinary run
  fig = methods_figure(records, "accuracy")
  texts = [t.get_text() for t in fig.legends[0].get_texts()]
  assert "ASP (diverged at round 7)" in texts
  assert "SPS" in texts and not any("SPS (diverged" in t for t in texts)
  assert texts.count("ASP (diverged at round 7)") == 1
  # the loss panel: x marker on the last finite point of ASP, none for the others
  loss_ax = fig.axes[2]
  (mark,) = [ln for ln in loss_ax.get_lines() if ln.get_gid() == "ASP:diverged"]
  assert mark.get_marker() == "x"
  rd = records["ASP"]["history"]["rounds"]
  assert list(mark.get_xdata()) == [rd["round"][-2]]  # the last loss is NaN
  assert list(mark.get_ydata()) == [rd["loss"][-2]]
  assert mark.get_color() == _lines(fig, "ASP")[0].get_color()
  assert not [ln for ax in fig.axes for ln in ax.get_lines()
              if str(ln.get_gid()).endswith(":diverged") and ln.get_gid() != "ASP:diverged"]
  # every panel that shows ASP marks its end
  assert len([ln for ax in fig.axes for ln in ax.get_lines()
              if ln.get_gid() == "ASP:diverged"]) == 3


def test_plot_functions_save_png_and_close(tmp_path, records):
  colors = method_colors(NAMES)
  before = len(plt.get_fignums())
  # writing and closing does not depend on how many methods a figure shows: three will do
  # (the figures' contents with all nine are checked on the figure functions above)
  few = {n: records[n] for n in NAMES[:3]}
  p1 = plot_methods(few, "accuracy", str(tmp_path / "a.png"), title="t",
                    x="local_steps", bits="uplink_bits_per_client", colors=colors)
  p2 = plot_series(few, ["sum_h_norm", "loss"], str(tmp_path / "b.png"), title="z",
                   x="local_steps", colors=colors)
  p3 = plot_evals(few, "gap", "bits_per_node", str(tmp_path / "c.png"), title="g")
  one = {"ASP": records["ASP"]}   # the positional call's own figure: one method is enough
  p4 = plot_methods(one, "accuracy", str(tmp_path / "d.png"))  # old positional API
  for p in (p1, p2, p3, p4):
    assert os.path.getsize(p) > 1000
    with open(p, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert len(plt.get_fignums()) == before
  assert plotting.plot_series.__defaults__[-2:] == (None, None)


def test_personal_figure_shows_personal_global_and_per_client_spread(tmp_path):
  """Panel 1: personal (solid) and global (dashed) lines per method; panel 2 the client mean;
  panel 3 the final per-client values sorted (NaN clients, without test data, left out)."""
  from fedjaxsparse.harness.plotting import personal_figure, plot_personal
  per = [[0.9, float("nan"), 0.5, 0.7], [0.95, float("nan"), 0.6, 0.8]]
  ev = {"round": [0, 5], "accuracy": [0.6, 0.7], "global_accuracy": [0.5, 0.55],
        "accuracy_client_mean": [0.65, 0.75], "accuracy_per_client": per}
  methods = {"Scafflix": {"history": {"rounds": {}, "evals": ev}},
             "FedAvg": {"history": {"rounds": {}, "evals": {"round": [0, 5],
                                                             "accuracy": [0.4, 0.5]}}}}
  fig = personal_figure(methods)
  a0, a1, a2 = fig.axes[:3]
  dashed = [ln for ln in a0.get_lines() if ln.get_linestyle() == "--"]
  assert [ln.get_gid() for ln in dashed] == ["Scafflix:global"]
  np.testing.assert_allclose(dashed[0].get_ydata(), [0.5, 0.55])
  assert {ln.get_gid() for ln in a0.get_lines()} == {"Scafflix", "Scafflix:global", "FedAvg"}
  assert [ln.get_gid() for ln in a1.get_lines()] == ["Scafflix"]
  (spread,) = a2.get_lines()
  np.testing.assert_allclose(spread.get_ydata(), [0.6, 0.8, 0.95])
  plt.close(fig)
  path = plot_personal(methods, str(tmp_path / "p.png"))
  assert os.path.getsize(path) > 0


def test_plot_curves_categorical_axis_skips_diverged_points(tmp_path, monkeypatch):
  """``xticks`` names the points 0, 1, ...; a None value (a diverged run) is not drawn."""
  seen = {}

  def keep(fig, path):
    seen["fig"] = fig
    return path

  monkeypatch.setattr(plotting, "_save", keep)
  path = plotting.plot_curves({"A": ([0, 1, 2], [1.0, None, 3.0]), "B": ([0, 1, 2], [2, 2, 2])},
                              str(tmp_path / "c.png"), "split", "acc", logx=False,
                              xticks=["IID", "Dir(0.1)", "Class Split"])
  ax = seen["fig"].axes[0]
  assert [t.get_text() for t in ax.get_xticklabels()] == ["IID", "Dir(0.1)", "Class Split"]
  xs = {ln.get_label(): list(ln.get_xdata()) for ln in ax.get_lines()}
  assert xs == {"A": [0, 2], "B": [0, 1, 2]} and path.endswith("c.png")


def test_layout_problems_finds_overlapping_and_escaping_text():
  """The checker measures matplotlib's own layout: two texts drawn on top of each other, a
  title running off the figure and a figure legend over the data are each reported; a
  figure with none of them is clean."""
  fig, ax = plt.subplots(figsize=(4, 3), layout="constrained")
  ax.plot([0, 1], [0, 1], label="a line")
  assert plotting.layout_problems(fig) == []
  ax.text(0.5, 0.5, "first words", transform=ax.transAxes)
  ax.text(0.52, 0.5, "second words", transform=ax.transAxes)
  problems = plotting.layout_problems(fig)
  assert any("'first words' overlaps text 'second words'" in p for p in problems), problems
  fig.suptitle("a title far too long to fit in a four-inch-wide figure, running off both edges")
  assert any("leaves the figure" in p for p in plotting.layout_problems(fig))
  fig2, ax2 = plt.subplots(figsize=(4, 3))
  ax2.plot([0, 1], [0, 1], label="a line")
  fig2.legend(loc="center")  # on the data
  assert "a figure legend covers an axes' data area" in plotting.layout_problems(fig2)


def test_long_titles_wrap_and_round_axes_have_integer_ticks(records):
  long = "a title that names the dataset, the split, the model and every setting " * 3
  fig = methods_figure(records, "accuracy", title=long)
  assert plotting.layout_problems(fig) == []
  assert "\n" in fig._suptitle.get_text()
  ticks = fig.axes[0].get_xticks()
  assert np.all(ticks == np.round(ticks))  # rounds are whole numbers


def test_overlapping_curves_differ_in_line_style_and_zero_bits_are_named(records):
  """Identical curves stay visible (each method its own line style); a method that sent no
  bits cannot be drawn on the log bits axis and is named in that panel's title."""
  records = dict(records)
  records["Copy of FedHT"] = records["FedHT"]
  local = _record(0)
  local["history"]["evals"]["uplink_bits"] = [0.0] * len(local["history"]["evals"]["round"])
  records["Local"] = local
  fig = methods_figure(records, "accuracy")
  a, b = _lines(fig, "FedHT")[0], _lines(fig, "Copy of FedHT")[0]
  np.testing.assert_array_equal(a.get_ydata(), b.get_ydata())
  assert (a.get_color(), a.get_linestyle()) != (b.get_color(), b.get_linestyle())
  assert a.get_linestyle() != b.get_linestyle() or a.get_color() != b.get_color()
  assert "0 bits: Local" in fig.axes[1].get_title()
  assert not [ln for ln in fig.axes[1].get_lines() if ln.get_gid() == "Local"]
  assert plotting.layout_problems(fig) == []


def test_log_axes_within_one_decade_have_readable_ticks():
  """A log axis spanning less than a decade labels a few 1-2-5 ticks, none overlapping."""
  fig, ax = plt.subplots(figsize=(5, 3), layout="constrained")
  ax.plot([1, 2, 3], [1.1e5, 1.5e5, 1.9e5])
  plotting.log_axis(ax, "y")
  fig.draw_without_rendering()
  labels = [t for t in plotting._texts(fig) if t in ax.yaxis.get_ticklabels(which="both")]
  assert labels and plotting.layout_problems(fig) == []
  # a span across one power of ten (0.2 … 1.2 holds only 10⁰): 1-2-5 labels, not one decade
  fig, ax = plt.subplots(figsize=(5, 3), layout="constrained")
  ax.plot([0, 1, 2], [1.2, 0.5, 0.2])
  plotting.log_axis(ax, "y")
  fig.draw_without_rendering()
  lo, hi = ax.get_ylim()
  shown = [t.get_text() for t in ax.yaxis.get_ticklabels()
           if t.get_text() and lo <= t.get_position()[1] <= hi]
  assert shown == ["0.2", "0.5", "1"] and plotting.layout_problems(fig) == []


def test_a_line_with_many_points_has_no_markers():
  fig = evals_figure({"m": {"history": {"rounds": {}, "evals": {
      "round": list(range(500)), "gap": [1.0 / (k + 1) for k in range(500)]}}}}, "gap", "round")
  assert all(ln.get_marker() in (None, "None", "") for ln in fig.axes[0].get_lines())


def test_check_plots_environment_makes_a_broken_figure_an_error(tmp_path, monkeypatch):
  fig, ax = plt.subplots(figsize=(3, 2))
  ax.set_title("a title much too long for a three-inch figure, running off the edges")
  monkeypatch.setenv(plotting.CHECK_ENV, "1")
  with pytest.raises(AssertionError, match="leaves the figure"):
    plotting.save_figure(fig, str(tmp_path / "bad.png"))
  assert not (tmp_path / "bad.png").exists()


def test_seed_bands_and_client_sizes(records, tmp_path):
  """A method with seed statistics is drawn as the seeds' mean with ± one standard error shaded
  (Fig. 2 of seed 000), in the panels against rounds only; the client-size histogram (its
  Fig. 5) counts every client once, on log bins, with a clean layout."""
  band = {"x": [0, 3, 6], "mean": [0.1, 0.5, 0.7], "se": [0.0, 0.05, 0.02]}
  fig = methods_figure(records, "accuracy", bands={"SPS": {"accuracy": band}})
  a0 = fig.axes[0]
  line = next(ln for ln in a0.get_lines() if ln.get_gid() == "SPS")
  np.testing.assert_allclose(line.get_ydata(), band["mean"])
  (poly,) = a0.collections
  ys = poly.get_paths()[0].vertices[:, 1]
  assert np.isclose(ys.max(), 0.72) and np.isclose(ys.min(), 0.1)
  assert not fig.axes[1].collections   # the bits panel keeps the record's run
  plt.close(fig)
  sizes = [1, 3, 7, 20, 20, 55, 400, 1200]
  fig = plotting.client_sizes_figure(sizes, "blog")
  (ax,) = fig.axes
  assert sum(p.get_height() for p in ax.patches) == len(sizes) and ax.get_xscale() == "log"
  assert plotting.layout_problems(fig) == []
  plt.close(fig)
  path = plotting.plot_client_sizes(sizes, str(tmp_path / "sizes.png"))
  assert open(path, "rb").read(4) == b"\x89PNG"


def test_matrix_heatmap_keeps_a_stripe_when_reduced():
  """Fig. 6.1's heatmap: a matrix wider than max_cells is shown by block maxima, so one large
  column (a "stripe") stays visible at its place; the column-mean panel finds it."""
  w = np.random.default_rng(0).normal(size=(300, 1000)) * 0.01
  w[:, 637] = 5.0
  fig = plotting.matrix_figure(w, "stripe", max_cells=100)
  shown = fig.axes[0].images[0].get_array()
  assert shown.shape == (100, 100) and np.argmax(np.asarray(shown).max(0)) == 637 // 10
  (cols,) = [ax for ax in fig.axes if ax.get_title() == "column means"]
  assert int(np.argmax(cols.get_lines()[0].get_ydata())) == 637
  assert plotting.layout_problems(fig) == []
  plt.close(fig)
  with pytest.raises(ValueError, match="2-D"):
    plotting.matrix_figure(np.ones(3))
