"""CPU time estimates announced before long jobs (app/estimates.py) and gradient files given
to the loader when they are not beside a diffusion series (app/loaders.py)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tractlens.app import estimates
from tractlens.app.errors import InputError
from tractlens.app.estimates import (
    ballstick_estimate,
    commit_estimate,
    format_duration,
    grid_diagonal_mm,
    probabilistic_estimate,
)
from tractlens.app.loaders import GradientFilesMissing, load_layers, needs_gradient_files


def test_durations_read_as_people_say_them():
    assert format_duration(0.2) == "1 s"
    assert format_duration(40) == "40 s"
    assert format_duration(12 * 60) == "12 min"
    assert format_duration(0.8 * 3600) == "0.8 h"
    assert format_duration(3.14 * 3600) == "3.1 h"


def test_whole_brain_ball_and_sticks_on_the_cpu_is_announced_with_its_hours():
    """31 000 voxels × 60 measurements at 10.8 voxels/s (the measured rate) ≈ 0.8 h."""
    estimate = ballstick_estimate(31_000, 60, 1000, 1250, device="cpu")
    assert estimate.seconds == pytest.approx(31_000 / 10.8, rel=1e-9)
    assert estimate.long
    assert estimate.text == "about 0.8 h on the CPU"
    assert "0.8 h" in estimate.announcement() and "cancel" in estimate.announcement()
    # half the iterations, half the time; an ROI of 50 voxels is not worth announcing
    assert ballstick_estimate(31_000, 60, 500, 625, "cpu").seconds == pytest.approx(estimate.seconds / 2)
    assert not ballstick_estimate(50, 60, 1000, 1250, "cpu").long


def test_a_gpu_run_is_never_announced(monkeypatch):
    estimate = ballstick_estimate(10**6, 60, 1000, 1250, device="gpu")
    assert estimate.device == "gpu" and estimate.seconds is None and not estimate.long and estimate.text == ""


def test_probabilistic_estimate_is_bounded_by_max_steps_and_grid_size(numba_disabled):
    """The NumPy reference's rate (no numba)."""
    diagonal = grid_diagonal_mm(np.diag([1.25, 1.25, 1.25, 1.0]), (145, 174, 145))
    assert diagonal == pytest.approx(1.25 * np.sqrt(145**2 + 174**2 + 145**2))
    whole = probabilistic_estimate(2000, 2000, 0.5, diagonal, "cpu")
    assert whole.seconds == pytest.approx(40.1, rel=0.35)  # the measured NumPy run: 2000 streamlines in 40.1 s
    short = probabilistic_estimate(2000, 10, 0.5, diagonal, "cpu")
    assert short.seconds == pytest.approx(2000 * 10 / estimates.PROBABILISTIC_CPU_STEPS_PER_S)
    assert probabilistic_estimate(10**6, 2000, 0.5, diagonal, "cpu").long


def test_probabilistic_estimate_with_the_compiled_loop_counts_its_threads(monkeypatch):
    """With numba: the compiled loop's rate per thread times the CPU engines' threads; 20,000
    streamlines × 498 steps on one thread ≈ the measured 4.36 s of CPU time."""
    pytest.importorskip("numba", reason="the cpu extra (numba) is not installed")
    diagonal = grid_diagonal_mm(np.diag([1.25, 1.25, 1.25, 1.0]), (145, 174, 145))
    monkeypatch.setenv("TRACTLENS_THREADS", "1")
    one = probabilistic_estimate(20_000, 2000, 0.5, diagonal, "cpu")
    assert one.seconds == pytest.approx(4.36, rel=0.35) and not one.long
    monkeypatch.setenv("TRACTLENS_THREADS", "4")
    assert probabilistic_estimate(20_000, 2000, 0.5, diagonal, "cpu").seconds == pytest.approx(one.seconds / 4)
    assert probabilistic_estimate(10**7, 2000, 0.5, diagonal, "cpu").long


def test_commit_estimate_matches_the_measured_run():
    estimate = commit_estimate(414_038, 1000, "cpu")
    assert estimate.seconds == pytest.approx(3.24, rel=0.05)
    assert not estimate.long
    assert commit_estimate(50_000_000, 1000, "cpu").long


def test_the_ballstick_pipeline_warns_with_the_shared_estimate(demo_dir, caplog, monkeypatch):
    import tractlens.app.pipelines.ballstick as pipeline
    from tractlens.app.io import load_dwi

    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    mask = np.zeros(dwi.shape3, bool)
    mask[tuple(s // 2 for s in dwi.shape3)] = True
    params = pipeline.BallStickParams(burnin=2, njumps=2, sample_every=1)
    with caplog.at_level("WARNING"):
        pipeline.fit_ballstick_pipeline(dwi, mask=mask, params=params, device="cpu")
    assert not [r for r in caplog.records if "will take" in r.getMessage()]  # one voxel: no warning
    expected = ballstick_estimate(1, len(dwi.bvals), 2, 2, "cpu")
    monkeypatch.setattr(pipeline, "CPU_WARN_S", expected.seconds / 2)
    with caplog.at_level("WARNING"):
        pipeline.fit_ballstick_pipeline(dwi, mask=mask, params=params, device="cpu")
    assert [r.getMessage() for r in caplog.records if expected.text in r.getMessage()]


@pytest.fixture
def dwi_without_gradients(demo_dir, tmp_path):
    shutil.copy(demo_dir / "dwi.nii.gz", tmp_path / "scan.nii.gz")
    gradients = tmp_path / "gradients"
    gradients.mkdir()
    shutil.copy(demo_dir / "dwi.bval", gradients / "scan.bval")
    shutil.copy(demo_dir / "dwi.bvec", gradients / "scan.bvec")
    return tmp_path / "scan.nii.gz", gradients / "scan.bval", gradients / "scan.bvec"


def test_a_dwi_without_gradient_files_says_how_to_give_them(dwi_without_gradients, demo_dir):
    dwi, _bval, _bvec = dwi_without_gradients
    assert needs_gradient_files(dwi)
    assert not needs_gradient_files(demo_dir / "dwi.nii.gz")  # found beside it
    assert not needs_gradient_files(demo_dir / "lesion.nii.gz")  # not a series
    with pytest.raises(GradientFilesMissing) as error:
        load_layers(dwi, device="cpu")
    assert "--bval FILE --bvec FILE" in str(error.value) and "tractlens view" in str(error.value)
    assert "Pass --bval" not in str(error.value)


def test_gradient_files_given_to_the_loader_open_the_series(dwi_without_gradients):
    dwi, bval, bvec = dwi_without_gradients
    layers = load_layers(dwi, device="cpu", gradients=(bval, bvec))
    assert [layer.kind for layer in layers][:1] == ["dwi"]
    assert layers[0].data.dwi.bval_path == str(bval)


def test_gradient_files_of_another_series_are_refused_with_the_counts(dwi_without_gradients, tmp_path):
    dwi, bval, bvec = dwi_without_gradients
    short = tmp_path / "short.bval"
    short.write_text(" ".join(bval.read_text().split()[:-2]) + "\n")
    with pytest.raises(InputError, match=r"b-values for \d+ volumes"):
        load_layers(dwi, device="cpu", gradients=(short, bvec))
