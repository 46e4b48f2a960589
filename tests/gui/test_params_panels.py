"""The panels start at the parameter dataclasses' defaults and offer their limits and choices,
so a default changed in the dataclass changes the panel too (and one changed in a panel only
fails here)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QSpinBox

from tractlens.app.params import (
    ConnectomeParams,
    GeodesicSeedingParams,
    LesionDistanceParams,
    ProfileParams,
    SeedingParams,
)
from tractlens.app.window_units import window_default, window_limits
from tractlens.gpu.ballstick import BallStickParams
from tractlens.gpu.commit import CommitParams
from tractlens.gpu.deterministic import DeterministicParams
from tractlens.gpu.geodesic_params import GeodesicParams, MetricParams
from tractlens.gpu.params import default_of, field_of
from tractlens.gpu.probabilistic_params import ProbParams
from tractlens.widgets.params_form import ParamsForm, spin_for


def _assert_editor(editor, cls, name):
    """The editor starts at the window's preset (the default unless one is declared) and offers the
    limits, both in the window's unit (:mod:`app.window_units`: a cosine in degrees)."""
    default, meta = window_default(cls, name), field_of(cls, name).metadata
    where = f"{cls.__name__}.{name}"
    if isinstance(editor, QComboBox) and editor.currentData() is not None:  # a numbered choice, by name
        assert editor.currentData() == default, where
        assert [editor.itemData(i) for i in range(editor.count())] == list(meta["choices"]), where
    elif isinstance(editor, QComboBox):
        assert editor.currentText() == str(default), where
        assert [editor.itemText(i) for i in range(editor.count())] == [str(c) for c in meta["choices"]], where
    elif isinstance(editor, QCheckBox):
        assert editor.isChecked() == default, where
    else:
        shown = 0.5 * 10 ** -editor.decimals() if isinstance(editor, QDoubleSpinBox) else 0  # rounded to its decimals
        assert editor.value() == pytest.approx(default, abs=shown), where
        if meta.get("limits"):
            lo, hi = window_limits(cls, name)
            assert (editor.minimum(), editor.maximum()) == pytest.approx((lo, hi)), where


def _assert_form(form: ParamsForm, cls, skip=()):
    assert form.params_type is cls
    for spec in dataclasses.fields(cls):
        if spec.name not in skip:
            _assert_editor(form.editors[spec.name], cls, spec.name)


def test_generated_forms_take_defaults_limits_and_choices_from_the_dataclasses(qtbot):
    for cls in (DeterministicParams, GeodesicParams, MetricParams, ProbParams, BallStickParams):
        form = ParamsForm(cls)
        qtbot.addWidget(form)
        _assert_form(form, cls)
    assert isinstance(ParamsForm(ProbParams).editors["waycond"], QComboBox)  # choices from the metadata alone


def test_spin_for_gives_a_fields_range_and_default(qtbot):
    box = spin_for(SeedingParams, "seeds_per_voxel")
    assert isinstance(box, QSpinBox) and (box.minimum(), box.maximum(), box.value()) == (
        1,
        1000,
        SeedingParams.seeds_per_voxel,
    )
    box = spin_for(LesionDistanceParams, "margin_mm")
    assert isinstance(box, QDoubleSpinBox) and box.value() == 5.0


def test_panels_start_at_the_dataclass_defaults_and_limits(window):
    det = window.deterministic_panel
    _assert_form(det.form, DeterministicParams)
    _assert_editor(det.seeds_per_voxel, SeedingParams, "seeds_per_voxel")
    _assert_editor(det.placement, SeedingParams, "placement")
    _assert_editor(det.rng_seed, SeedingParams, "rng_seed")

    geo = window.geodesic_panel
    _assert_form(geo.form, GeodesicParams, skip=("step",))  # in mm, as the other panels' steps
    lo, hi = field_of(GeodesicParams, "step").metadata["limits"]
    step = geo.form.editors["step"]  # no tensors open: shown for 1 mm voxels, so the same numbers
    assert step.suffix() == " mm" and step.value() == pytest.approx(default_of(GeodesicParams, "step"))
    assert (step.minimum(), step.maximum()) == pytest.approx((lo, hi))
    _assert_form(geo.metric_form, MetricParams)
    for name, box in (("seeds_per_voxel", geo.seeds_per_voxel), ("directions", geo.directions),
                      ("rng_seed", geo.rng_seed), ("top_percent", geo.top)):  # fmt: skip
        _assert_editor(box, GeodesicSeedingParams, name)
    lo, hi = field_of(GeodesicSeedingParams, "cone_deg").metadata["limits"]
    assert (geo.cone.minimum(), geo.cone.maximum()) == (lo, hi) and not geo.use_cone.isChecked()

    # n_samples starts lower on purpose: the panel's first look (GUI_PRESETS), not probtrackx's 5000
    _assert_form(window.probabilistic_panel.form, ProbParams)
    assert window.probabilistic_panel.form.editors["n_samples"].value() == 1000

    commit = window.commit_panel
    for name, box in (("lambda_", commit.lambda_box), ("max_iter", commit.max_iter_box), ("tol", commit.tol_box)):
        _assert_editor(box, CommitParams, name)

    conn = window.connectivity_panel
    _assert_editor(conn.radius_box, ConnectomeParams, "radius_mm")
    _assert_editor(conn.points_box, ProfileParams, "n_points")
    _assert_editor(window.presurgical_panel.margin_box, LesionDistanceParams, "margin_mm")


def test_the_probabilistic_curvature_threshold_is_edited_in_degrees_and_kept_as_a_cosine(qtbot):
    form = ParamsForm(ProbParams)
    qtbot.addWidget(form)
    box = form.editors["cthr"]
    assert box.suffix() == "°" and (box.minimum(), box.maximum()) == (0.0, 180.0)
    assert box.value() == pytest.approx(78.5)  # the default cosine 0.2, in degrees
    assert form.value().cthr == default_of(ProbParams, "cthr")  # exactly the command line's 0.2
    box.setValue(45.0)
    assert form.value().cthr == pytest.approx(math.cos(math.radians(45.0)), abs=1e-12)
    box.setValue(90.0)
    assert form.value().cthr == 0.0  # "90°" is --cthr 0, exactly
    form.set_values(cthr=0.7)  # a session's or a script's cosine
    assert box.value() == pytest.approx(45.6) and form.value().cthr == 0.7
    form.set_values(cthr=-1.0)
    assert box.value() == 180.0 and form.value().cthr == -1.0


def test_numbered_choices_are_offered_by_name_and_keep_their_number(qtbot):
    form = ParamsForm(ProbParams)
    qtbot.addWidget(form)
    box = form.editors["randfib"]
    assert isinstance(box, QComboBox)
    assert [box.itemText(i) for i in range(box.count())] == ["stick 1", "any stick, uniformly", "by volume fraction"]
    assert box.currentText() == "stick 1" and form.value().randfib == default_of(ProbParams, "randfib") == 0
    box.setCurrentIndex(2)
    assert form.value().randfib == 2
    form.set_values(randfib=1)
    assert box.currentText() == "any stick, uniformly"
    ballstick = ParamsForm(BallStickParams)
    qtbot.addWidget(ballstick)
    model = ballstick.editors["model"]
    assert [model.itemData(i) for i in range(model.count())] == [1, 2] and model.currentData() == 1
    from tractlens.app.params import RegisterParams

    register = ParamsForm(RegisterParams)
    qtbot.addWidget(register)
    metric = register.editors["metric"]
    assert metric.currentText().startswith("mutual information") and register.value().metric == "mi"
    metric.setCurrentIndex(metric.findData("cc"))
    assert register.value().metric == "cc"
