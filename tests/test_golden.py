"""The golden-numbers guard (tests/conftest.py) compares what it should: every number of a
result except wall-clock measurements, every printed number except times and versions, and a
changed number fails the check."""
import numpy as np
import pytest
from conftest import GOLDEN_TOLERANCE, golden_numbers, golden_text_numbers


def test_result_numbers_keep_metrics_and_drop_wall_clock_measurements():
  res = {"table": [{"method": "FedAvg", "accuracy": 0.5, "time (s)": 1.2, "train s": 3.0,
                    "bits": 12, "curve": [1.0, None, 0.5]}],
         "wall_time_s": 9.0, "mask_search": {"ratio": 0.2}, "converged": True}
  got = golden_numbers(res)
  assert set(got) == {"table/0/accuracy", "table/0/bits", "table/0/curve", "converged"}
  assert got["table/0/bits"].dtype == np.int64 and got["converged"] == 1
  np.testing.assert_array_equal(got["table/0/curve"], [1.0, np.nan, 0.5])


def test_printed_numbers_carry_one_unit_of_their_last_digit():
  got, tol = golden_text_numbers("acc 0.812 at round 20/30\nrun took 3.2 s\njax 0.10.2 on cpu\n"
                                 "bits 1.50e+03")
  assert sorted(got) == ["000 acc # at round #|# [0]", "000 acc # at round #|# [1]",
                         "000 acc # at round #|# [2]", "003 bits # [0]"]
  assert tol["000 acc # at round #|# [0]"]["atol"] == pytest.approx(1.01e-3)
  assert "000 acc # at round #|# [1]" not in tol   # a count: exact
  assert got["000 acc # at round #|# [1]"].dtype.kind == "i"
  assert tol["003 bits # [0]"]["atol"] == pytest.approx(10.1)


def test_a_moved_number_fails_the_check(ndarrays_regression, tmp_path):
  path = tmp_path / "g.npz"
  np.savez(path, **golden_numbers({"loss": 1.0, "bits": 8}))
  ndarrays_regression.check(golden_numbers({"loss": 1.0 + 1e-7, "bits": 8}), fullpath=path,
                            default_tolerance=GOLDEN_TOLERANCE)
  with pytest.raises(AssertionError):
    ndarrays_regression.check(golden_numbers({"loss": 1.0 + 1e-3, "bits": 8}), fullpath=path,
                              default_tolerance=GOLDEN_TOLERANCE)
  with pytest.raises(AssertionError):
    ndarrays_regression.check(golden_numbers({"loss": 1.0, "bits": 9}), fullpath=path,
                              default_tolerance=GOLDEN_TOLERANCE)


def test_invariant_residuals_are_compared_absolutely():
  from conftest import ROUNDING_RESIDUALS, ROUNDING_TOLERANCE
  keys = golden_numbers({"methods": {"Sparse-ProxSkip": {"sum_h_norm": [1e-7, 2e-7]},
                                     "Scafflix": {"alpha_h_sum_norm": 3e-7}},
                         "table": [{"max |Δlogit|": 3e-6, "accuracy": 0.5}]})
  residual = sorted(k for k in keys if ROUNDING_RESIDUALS.search(k))
  assert residual == ["methods/Scafflix/alpha_h_sum_norm", "methods/Sparse-ProxSkip/sum_h_norm",
                      "table/0/max |Δlogit|"]
  assert ROUNDING_TOLERANCE["atol"] >= 1e-5 > GOLDEN_TOLERANCE["atol"]


def test_printed_rounding_residuals_are_compared_absolutely(ndarrays_regression, tmp_path):
  """A printed duality gap of an exact solution is float64 rounding noise: 1.1e-16 and 5.6e-17
  both pass (one unit of the last digit would not), a gap of 1e-9 fails."""
  line = "x* has 3 non-zeros out of 30; its duality gap is {} (certified: True)"
  got, tol = golden_text_numbers(line.format("1.1e-16"))
  path = tmp_path / "g.npz"
  np.savez(path, **got)
  for gap, passes in (("5.6e-17", True), ("1.0e-09", False)):
    numbers, tolerances = golden_text_numbers(line.format(gap))
    assert tolerances == tol
    if passes:
      ndarrays_regression.check(numbers, fullpath=path, tolerances=tolerances,
                                default_tolerance=GOLDEN_TOLERANCE)
    else:
      with pytest.raises(AssertionError):
        ndarrays_regression.check(numbers, fullpath=path, tolerances=tolerances,
                                  default_tolerance=GOLDEN_TOLERANCE)
