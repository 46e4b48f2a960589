"""Probabilistic tracking's compiled CPU engine (gpu.probabilistic_host) against the NumPy
reference (gpu.probabilistic_numpy), bit for bit: the same Philox streams and the same float64
operations in the same order give the same steps, so the totals (path distribution, waytotal,
seed × target counts, seed × seed matrix, steps) are equal exactly and the recorded positions too
(no tolerance). And the engine's selection, fallback without numba, cancellation and threads."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_probabilistic import slab, straight_bundle
from tractlens.gpu import probabilistic_host
from tractlens.gpu.backend import Cancelled
from tractlens.gpu.probabilistic import iter_track, track
from tractlens.gpu.probabilistic_host import CompiledTracker, track_compiled
from tractlens.gpu.probabilistic_numpy import track_numpy
from tractlens.gpu.probabilistic_params import ProbParams, SampleField, mask_bits

pytest.importorskip("numba", reason="the cpu extra (numba) is not installed")


def assert_same_totals(got, ref):
    np.testing.assert_array_equal(got.paths, ref.paths)
    np.testing.assert_array_equal(got.seed_targets, ref.seed_targets)
    assert got.waytotal == ref.waytotal and got.steps == ref.steps and got.streamlines == ref.streamlines
    if ref.seed_matrix is None:
        assert got.seed_matrix is None
    else:
        np.testing.assert_array_equal(got.seed_matrix, ref.seed_matrix)


def crossing_field(seed=4):
    """Three sticks everywhere (random, a smooth field along x, another along y), fractions
    varying per sample, anisotropic voxels (2 × 2 × 2.5 mm), a brain that reaches the grid's edges
    on two sides (streamlines leave the grid there) and has a hole."""
    rng = np.random.default_rng(seed)
    shape, L, S = (24, 20, 14), 3, 12
    dirs = rng.normal(size=(*shape, L, S, 3))
    dirs[..., 1, :, 0] += 3.0
    dirs[..., 2, :, 1] += 2.0
    dirs /= np.linalg.norm(dirs, axis=-1, keepdims=True)
    f = np.stack([rng.uniform(0.0, 0.2, (*shape, S)), rng.uniform(0.2, 0.6, (*shape, S)),
                  rng.uniform(0.0, 0.4, (*shape, S))], axis=-2)  # fmt: skip
    brain = np.ones(shape, bool)
    brain[:, :, [0, -1]] = False
    brain[10:13, 8:11, 5:8] = False
    return SampleField.from_grid(dirs, f, brain, (2.0, 2.0, 2.5)), brain


OPTIONS = {
    "defaults": {},
    "modeuler": {"modeuler": True},
    "randfib 2, loopcheck": {"randfib": 2, "loopcheck": True},
    "randfib 1, strict angle, high fibthresh": {"randfib": 1, "cthr": 0.8, "fibthresh": 0.3},
    "waypoints OR, modeuler, loopcheck, long steps": {"waycond": "OR", "modeuler": True, "loopcheck": True,
                                                      "step_mm": 1.7},
    "no curvature stop, few steps": {"cthr": -1.0, "n_steps": 9, "seed": 12345},
}  # fmt: skip


@pytest.mark.parametrize("options", list(OPTIONS))
def test_compiled_loop_takes_the_references_steps_bit_for_bit(options, monkeypatch):
    """The straight bundle with an exclusion slab beside it, a stop slab, two waypoints and two
    targets, on two threads in small blocks whose voxel lists are flushed after nearly every
    streamline (VOXEL_BUFFER 1: room for one streamline): the totals and the recorded steps equal
    the reference's exactly."""
    monkeypatch.setattr(probabilistic_host, "VOXEL_BUFFER", 1)
    field_, brain, bundle = straight_bundle(noise=0.4)
    bits = mask_bits(
        brain,
        exclude=slab(22, 23, y=slice(0, 3)),
        stop=slab(27, 28, y=slice(0, 2)),
        waypoints=[slab(12, 13), slab(14, 15, y=slice(2, 12))],
        targets=[slab(26, 28), slab(9, 10, y=slice(0, 4))],
    )
    params = ProbParams(**{"n_samples": 16, "n_steps": 120, **OPTIONS[options]})
    seeds = np.argwhere(bundle & slab(3, 4))
    ref, ref_steps = track_numpy(field_, bits, seeds, params, 2, 2, record=True, seed_matrix=True)
    got, steps = track_compiled(field_, bits, seeds, params, 2, 2, record=True, seed_matrix=True, threads=2)
    assert_same_totals(got, ref)
    for half in (0, 1):
        assert steps[half].shape == ref_steps[half].shape
        np.testing.assert_array_equal(steps[half], ref_steps[half])
    assert ref.steps > 0


@pytest.mark.parametrize("randfib", [0, 2])
def test_compiled_loop_equals_the_reference_in_crossing_fibres_up_to_the_grid_edge(randfib):
    """Three sticks per voxel, anisotropic voxels, streamlines that leave the grid, a seed voxel
    outside the brain (its streamlines never move and count their start voxel only), run
    positions in any order, and one or three threads."""
    field_, brain = crossing_field()
    seeds = np.array([[12, 10, 7], [2, 3, 3], [22, 18, 10], [11, 9, 6], [0, 0, 1]])  # [11, 9, 6]: the hole
    bits = mask_bits(brain, targets=[brain & (np.arange(24) > 20)[:, None, None]])
    params = ProbParams(n_samples=60, n_steps=300, randfib=randfib, seed=7)
    positions = np.random.default_rng(0).permutation(len(seeds) * params.n_samples)[:200]
    ref = track_numpy(field_, bits, seeds, params, 1, positions=positions, seed_matrix=True)
    for threads in (1, 3):
        got = track_compiled(field_, bits, seeds, params, 1, positions=positions, seed_matrix=True, threads=threads)
        assert_same_totals(got, ref)
    assert ref.paths[11, 9, 6] > 0 and ref.seed_targets.sum() > 0


def test_iter_track_runs_the_compiled_loop_on_the_cpu_in_batches(monkeypatch):
    """``engine="auto"`` on the CPU is the compiled loop; its running totals after each batch are
    the reference's after the same batches, and the last the whole run's."""
    calls = []
    real = CompiledTracker.run
    monkeypatch.setattr(CompiledTracker, "run", lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
    field_, brain, bundle = straight_bundle()
    bits = mask_bits(brain, targets=[slab(26, 28)])
    face = np.argwhere(bundle & slab(3, 4))
    params = ProbParams(n_samples=40, n_steps=200)
    kwargs = {"n_targets": 1, "device": "cpu", "batch_streamlines": 200, "first_batch": 50, "seed_matrix": True}
    compiled = list(iter_track(field_, bits, face, params, **kwargs))
    reference = list(iter_track(field_, bits, face, params, engine="numpy", **kwargs))
    assert [r.streamlines for r in compiled] == [50, 250, 450, 640] == [r.streamlines for r in reference]
    for got, ref in zip(compiled, reference, strict=True):
        assert_same_totals(got, ref)
    assert calls == [(0, 50), (50, 200), (250, 200), (450, 190)]
    assert compiled[-1].provenance["engine"] == "compiled" and reference[-1].provenance["engine"] == "numpy"
    assert compiled[-1].provenance["threads"] >= 1


def test_without_numba_auto_falls_back_to_the_reference_and_compiled_names_the_extra(numba_disabled):
    field_, brain, _ = straight_bundle()
    bits = mask_bits(brain)
    result = track(field_, bits, [[3, 5, 5]], ProbParams(n_samples=10, n_steps=50), device="cpu")
    assert result.provenance["engine"] == "numpy" and result.streamlines == 10
    with pytest.raises(ValueError, match=r"tractlens\[cpu\]"):
        track(field_, bits, [[3, 5, 5]], ProbParams(n_samples=10, n_steps=50), device="cpu", engine="compiled")


@pytest.mark.parametrize("threads", [1, 2])
def test_a_cancel_stops_between_blocks(threads):
    """``cancelled()`` is asked on the calling thread before each block is handed out: saying yes
    at its third question, no block starts after that, the blocks under way end, and Cancelled
    is raised (on two threads the first two blocks were handed out before the third question)."""
    field_, brain, bundle = straight_bundle()
    seeds = np.argwhere(bundle & slab(3, 4))
    params = ProbParams(n_samples=40, n_steps=100)
    tracker = CompiledTracker(field_, mask_bits(brain), seeds, params, threads=threads)
    asked = []
    block = max(probabilistic_host.SMALLEST_BLOCK, -(-640 // (threads * probabilistic_host.BLOCKS_PER_THREAD)))
    with pytest.raises(Cancelled):
        tracker.run(0, 640, cancelled=lambda: asked.append(1) or len(asked) >= 3)
    assert len(asked) == 3
    assert tracker.result().streamlines == 2 * block < 640


def test_the_per_streamline_ids_do_not_depend_on_the_batches_or_threads():
    """The same run split into odd batches on one thread, and whole on two: the same totals."""
    field_, brain = crossing_field(seed=9)
    seeds = np.argwhere(brain)[::97][:20]
    params = ProbParams(n_samples=30, n_steps=200, loopcheck=True)
    bits = mask_bits(brain)
    one = CompiledTracker(field_, bits, seeds, params, threads=1)
    for start, count in ((0, 7), (7, 300), (307, 293)):
        one.run(start, count)
    whole = CompiledTracker(field_, bits, seeds, params, threads=2)
    whole.run()
    assert_same_totals(one.result(), whole.result())
    assert whole.result().streamlines == 600
