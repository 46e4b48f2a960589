"""The window's units for parameters the engine keeps in another (app.window_units): probtrackx's
curvature threshold, a cosine, shown in degrees."""

from __future__ import annotations

import math

import pytest

from tractlens.app.params import DeterministicParams, ProbParams
from tractlens.app.window_units import (
    cosine_to_degrees,
    degrees_to_cosine,
    from_window,
    to_window,
    window_default,
    window_limits,
    window_unit,
)


def test_a_cosine_threshold_round_trips_through_degrees():
    for cosine in (-1.0, -0.3, 0.0, 0.2, 0.5, 0.7, 1.0):
        assert degrees_to_cosine(cosine_to_degrees(cosine)) == pytest.approx(cosine, abs=1e-12)
    assert cosine_to_degrees(0.5) == pytest.approx(60.0) and cosine_to_degrees(0.2) == pytest.approx(78.463, abs=1e-3)
    assert degrees_to_cosine(90.0) == 0.0 and degrees_to_cosine(60.0) == pytest.approx(0.5, abs=1e-12)
    assert cosine_to_degrees(1.0000001) == 0.0  # rounding past ±1 is clipped, not a math error


def test_the_cthr_field_is_shown_in_degrees_and_other_fields_as_they_are():
    assert window_unit(ProbParams, "cthr") == "°" and window_limits(ProbParams, "cthr") == (0.0, 180.0)
    assert window_default(ProbParams, "cthr") == pytest.approx(math.degrees(math.acos(0.2)))
    assert to_window(ProbParams, "cthr", 0.7) == pytest.approx(45.573, abs=1e-3)
    assert from_window(ProbParams, "cthr", 45.0) == pytest.approx(math.sqrt(0.5), abs=1e-12)
    # an angle already in degrees and a length are left alone
    assert window_unit(DeterministicParams, "max_angle_deg") == "°"
    assert (
        to_window(DeterministicParams, "max_angle_deg", 45.0)
        == from_window(DeterministicParams, "max_angle_deg", 45.0)
        == 45.0
    )
    assert window_limits(ProbParams, "step_mm") == (0.01, 10.0) and window_unit(ProbParams, "step_mm") == "mm"
    assert window_default(ProbParams, "n_samples") == 1000  # the window's preset, not probtrackx's 5000


def test_the_command_line_keeps_probtrackx_cosine():
    from tractlens.app.cli.options import params_from_args
    from tractlens.app.cli.parser import build_command_parser

    args = build_command_parser().parse_args(
        ["track", "probabilistic", "--samples", "s", "--seed", "m.nii.gz", "-o", "out", "--cthr", "0.7"]
    )
    assert params_from_args(ProbParams, args).cthr == 0.7
