"""The probabilistic tracking use case in passes (:mod:`app.pipelines.track_probabilistic`): a
coarse first pass, refining passes, the same totals as one run, cancellation, and the same from
ROI snapshots as from masks."""

from __future__ import annotations

from collections import deque

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.errors import InputError
from tractlens.app.io import load_bedpostx
from tractlens.app.pipelines.probabilistic import prepare_probabilistic_masks
from tractlens.app.pipelines.track_probabilistic import (
    FIRST_PASS_CPU,
    MAX_FIRST_PASS_CPU,
    ProbInputs,
    pass_sizes,
    track_probabilistic,
)
from tractlens.app.regions import RoiCopy
from tractlens.gpu.backend import Cancelled
from tractlens.gpu.probabilistic import ProbParams

SEED, TARGET = "roi_crossing_lr_seed", "roi_crossing_lr_target"


@pytest.fixture
def demo_inputs(demo_bedpostx, demo_dir):
    samples = load_bedpostx(demo_bedpostx)

    def roi(name, role):
        image = nib.load(demo_dir / f"{name}.nii.gz")
        return RoiCopy(name, role, np.asarray(image.dataobj) > 0, image.affine)

    return samples, [roi(SEED, "seed"), roi(TARGET, "target")]


def test_passes_start_coarse_refine_and_end_on_the_whole_runs_totals(demo_inputs, device):
    samples, rois = demo_inputs
    params = ProbParams(n_samples=40, seed=3)
    updates = list(
        track_probabilistic(ProbInputs(samples, rois, params), device=device, first_pass=250, later_pass=700)
    )
    counts = [u.result.streamlines for u in updates]
    assert counts == [250, 950, 1650, 2350, 3000]  # 75 seed voxels x 40: coarse, then refining passes
    assert [u.pass_number for u in updates] == list(range(5)) and [u.final for u in updates] == [False] * 4 + [True]
    visits = [int(u.result.paths.sum()) for u in updates]
    assert visits == sorted(visits) and visits[0] > 0
    masks = {roi.role: roi.mask for roi in rois}
    whole = prepare_probabilistic_masks(samples, masks["seed"], targets=[(TARGET, masks["target"])], params=params)
    expected = whole.track(device=device)
    last = updates[-1].result
    assert np.array_equal(last.paths, expected.paths) and last.waytotal == expected.waytotal  # exact
    assert np.array_equal(last.seed_targets, expected.seed_targets)
    assert updates[-1].run.targets == [TARGET]


def test_the_first_pass_is_coarser_on_the_cpu_and_later_passes_a_tenth(numba_disabled):
    """The NumPy reference (no numba): its visit bitmap caps a pass."""
    assert pass_sizes(1_000_000, 1000, "cpu") == (FIRST_PASS_CPU, 100_000)
    assert pass_sizes(500, 1000, "cpu") == (500, 500)  # a small run: one pass
    assert pass_sizes(1_000_000, 100, "cpu", first_pass=0) == (1_000_000, 1_000_000)  # the engine's batches
    first, later = pass_sizes(10**9, 10**5, "cpu")  # the NumPy engine's bitmap caps a pass
    assert first == FIRST_PASS_CPU and later == 256 * 2**20 // 10**5
    assert pass_sizes(10**9, 10**7, "cpu") == (26, 26)  # and the first one too
    # A known rate sizes the CPU's first pass to about 0.1 s (within 64 .. 20,000 streamlines).
    assert pass_sizes(10**6, 1000, "cpu", rate=2000.0)[0] == 200
    assert pass_sizes(10**6, 1000, "cpu", rate=10.0)[0] == 64


def test_the_compiled_engines_passes_are_not_capped_by_a_bitmap():
    """With numba the CPU runs the compiled loop: a pass is capped only by its batch (running
    totals at least every COMPILED_BATCH streamlines), whatever the grid; a fast rate gives a
    first pass of up to MAX_FIRST_PASS_CPU."""
    pytest.importorskip("numba", reason="the cpu extra (numba) is not installed")
    from tractlens.gpu.probabilistic_host import COMPILED_BATCH

    assert pass_sizes(500_000, 1000, "cpu") == (FIRST_PASS_CPU, 50_000)
    assert pass_sizes(10**9, 10**7, "cpu") == (FIRST_PASS_CPU, COMPILED_BATCH)  # an HCP-sized grid or larger
    assert pass_sizes(10**9, 10**7, "cpu", first_pass=0) == (COMPILED_BATCH, COMPILED_BATCH)
    assert pass_sizes(10**6, 10**7, "cpu", rate=2000.0)[0] == 200
    assert pass_sizes(10**6, 10**7, "cpu", rate=1e6)[0] == MAX_FIRST_PASS_CPU


def test_a_cancel_hands_out_the_passes_done_then_stops(demo_inputs):
    samples, rois = demo_inputs
    seen = []
    passes = track_probabilistic(
        ProbInputs(samples, rois, ProbParams(n_samples=40)),
        device="cpu",
        first_pass=300,
        later_pass=300,
        cancelled=lambda: len(seen) >= 2,
    )
    with pytest.raises(Cancelled):
        for update in passes:
            seen.append(update.result.streamlines)
    assert seen == [300, 600]


def test_throttled_passes_show_the_first_and_the_last(demo_inputs):
    samples, rois = demo_inputs
    updates = list(
        track_probabilistic(
            ProbInputs(samples, rois, ProbParams(n_samples=20)),
            device="cpu",
            first_pass=100,
            later_pass=100,
            interval_s=3600.0,
        )
    )
    assert [u.result.streamlines for u in updates] == [100, 1500]


def test_inputs_that_cannot_be_tracked_are_refused_before_tracking(demo_inputs):
    samples, rois = demo_inputs
    target_only = [roi for roi in rois if roi.role == "target"]
    with pytest.raises(InputError, match="no seed ROI"):
        next(track_probabilistic(ProbInputs(samples, target_only, ProbParams(n_samples=2)), device="cpu"))
    outside = np.zeros(samples.mask.shape, bool)
    outside[0, 0, 0] = True
    bad = [RoiCopy("corner", "seed", outside, samples.affine)]
    with pytest.raises(InputError, match="brain mask"):
        next(track_probabilistic(ProbInputs(samples, bad, ProbParams(n_samples=2)), device="cpu"))


def test_a_prepared_run_tracks_in_the_engines_batches_as_the_command_line_does(demo_inputs):
    samples, rois = demo_inputs
    run = ProbInputs(samples, rois, ProbParams(n_samples=10)).prepare()
    updates = list(track_probabilistic(run, device="cpu", first_pass=0))
    assert len(updates) == 1 and updates[0].final
    assert deque(run.run(device="cpu"), maxlen=1)[0].waytotal == updates[0].result.waytotal
