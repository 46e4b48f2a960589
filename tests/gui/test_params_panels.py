"""The panels start at the parameter dataclasses' defaults and offer their limits and choices,
so a default changed in the dataclass changes the panel too (and one changed in a panel only
fails here)."""

from __future__ import annotations

import dataclasses

import pytest
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QSpinBox

from tractlens.app.params import (
    ConnectomeParams,
    GeodesicSeedingParams,
    LesionDistanceParams,
    ProfileParams,
    SeedingParams,
)
from tractlens.gpu.ballstick import BallStickParams
from tractlens.gpu.commit import CommitParams
from tractlens.gpu.deterministic import DeterministicParams
from tractlens.gpu.geodesic_params import GeodesicParams, MetricParams
from tractlens.gpu.params import default_of, field_of
from tractlens.gpu.probabilistic_params import ProbParams
from tractlens.widgets.params_form import ParamsForm, spin_for


def _assert_editor(editor, cls, name):
    default, meta = default_of(cls, name), field_of(cls, name).metadata
    where = f"{cls.__name__}.{name}"
    if isinstance(editor, QComboBox):
        assert editor.currentText() == str(default), where
        assert [editor.itemText(i) for i in range(editor.count())] == [str(c) for c in meta["choices"]], where
    elif isinstance(editor, QCheckBox):
        assert editor.isChecked() == default, where
    else:
        assert editor.value() == pytest.approx(default), where
        if meta.get("limits"):
            lo, hi = meta["limits"]
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

    # n_samples starts lower on purpose: the panel's first look (GUI_N_SAMPLES), not probtrackx's 5000
    _assert_form(window.probabilistic_panel.form, ProbParams, skip=("n_samples",))

    commit = window.commit_panel
    for name, box in (("lambda_", commit.lambda_box), ("max_iter", commit.max_iter_box), ("tol", commit.tol_box)):
        _assert_editor(box, CommitParams, name)

    conn = window.connectivity_panel
    _assert_editor(conn.radius_box, ConnectomeParams, "radius_mm")
    _assert_editor(conn.points_box, ProfileParams, "n_points")
    _assert_editor(window.presurgical_panel.margin_box, LesionDistanceParams, "margin_mm")
