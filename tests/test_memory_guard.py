"""The memory guard (app.memory_guard): a CPU job announces its host memory before it starts,
is refused with a clear message when it is not free, and never takes more than it announced."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tractlens.app import memory_guard
from tractlens.app.errors import InputError
from tractlens.app.memory_guard import MemoryNeed, check_host_memory


def test_a_need_above_what_is_free_is_refused_with_the_need_the_free_and_the_fix():
    need = MemoryNeed("COMMIT", 3 << 30, {"segments": 2 << 30, "signal": 1 << 30})
    with pytest.raises(InputError) as info:
        check_host_memory(need, "Give a mask", free=1 << 30)
    text = str(info.value)
    assert "COMMIT on the CPU needs about 3.0 GiB" in text and "only 1.0 GiB is free" in text
    assert "segments 2.0 GiB" in text and "Give a mask" in text and "not started" in text
    check_host_memory(need, "Give a mask", free=4 << 30)  # enough: nothing said


def test_the_guard_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("TRACTLENS_MEMORY_GUARD", "off")
    check_host_memory(MemoryNeed("COMMIT", 1 << 40), "", free=1)


def test_commit_on_the_cpu_is_refused_before_it_starts_when_memory_is_short(monkeypatch):
    """The use case the window's job and the CLI call refuses the job before its work (only a
    sample of streamlines was cut, for the estimate); the error is the job's error."""
    from tests.benchmarks.bench_commit import bundle_inputs
    from tractlens.app import memory_guard
    from tractlens.app.pipelines.commit import commit_pipeline
    from tractlens.gpu import commit_segments as commit  # the cutting both the guard and the pipeline call

    dwi, tract = bundle_inputs(200, shape=(16, 16, 16), n_meas=20)
    monkeypatch.setattr(memory_guard, "host_free_bytes", lambda: 1 << 20)
    cut = []
    real = commit.segments
    monkeypatch.setattr(commit, "segments", lambda points, offsets, *a, **k: cut.append(len(offsets) - 1) or real(
        points, offsets, *a, **k))  # fmt: skip
    with pytest.raises(InputError, match=r"COMMIT on the CPU needs about .* but only 1 MiB is free"):
        commit_pipeline(dwi, tract, device="cpu")
    assert cut == [200]  # the estimate's sample (all 200 here), and nothing else


PEAK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, ".")
    from tests.benchmarks.bench_commit import bundle_inputs
    from tractlens.app import memory_guard
    from tractlens.app.pipelines.commit import commit_pipeline
    from tractlens.gpu.commit import CommitParams

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

    if sys.argv[3] == "warm":  # the compiled loops loaded first: no compiler's allowance in the need
        small = bundle_inputs(40, shape=(8, 8, 8), n_meas=int(sys.argv[2]))
        commit_pipeline(*small, params=CommitParams(max_iter=2), device="cpu")
    dwi, tract = bundle_inputs(int(sys.argv[1]), n_meas=int(sys.argv[2]))
    needs = []
    real = memory_guard.check_host_memory
    memory_guard.check_host_memory = lambda need, fix, **k: needs.append(need) or real(need, fix, **k)
    with open("/proc/self/clear_refs", "w") as f:  # the peak (VmHWM) from here on
        f.write("5")
    before = status("VmRSS")
    result = commit_pipeline(dwi, tract, params=CommitParams(max_iter=5, tol=0.0), device="cpu")
    print(json.dumps({"peak": status("VmHWM") - before, "need": max(n.total for n in needs), "parts": needs[0].parts,
                      "fit_need": needs[-1].total, "ec": result.problem.n_ec, "ec_announced": needs[0].plan["ec_compartments"],
                      "segments": len(result.problem.segments), "plan": needs[0].plan,
                      "cut_passes": result.provenance["cut_passes"]}))
    """
)


@pytest.mark.parametrize(
    ("streamlines", "measurements", "loops"),
    [(3000, 30, "cold"), (12000, 60, "cold"), (3000, 288, "cold"), (12000, 288, "warm")],
)
def test_a_commit_job_takes_no_more_host_memory_than_it_announced(streamlines, measurements, loops):
    """In a fresh process (numba's compilation included, or the loops loaded before: "warm", the
    need then has no compiler's allowance): the peak resident memory of the job above what the
    process held before it (VmHWM, reset at the start) is below its estimate, and the job cuts
    in as many passes as its estimate planned."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, str(streamlines), str(measurements), loops],
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    print(out)
    assert 0 < out["peak"] <= out["need"], out
    assert out["cut_passes"] == (2 if out["plan"]["two_pass_cut"] else 1)
    if loops == "warm":
        assert out["parts"]["runtime"] == memory_guard.RUNTIME_BYTES


def _demo_field():
    from tractlens.app.demo import demo_path
    from tractlens.app.pipelines.track import load_tensor_field

    return load_tensor_field(dwi=demo_path() / "dwi.nii.gz", device="cpu")


def test_tracking_on_the_cpu_is_refused_before_it_starts_when_memory_is_short(monkeypatch):
    from tractlens.app import memory_guard
    from tractlens.app.pipelines.track import deterministic_pipeline

    field = _demo_field()
    monkeypatch.setattr(memory_guard, "host_free_bytes", lambda: 1 << 20)
    batches = []
    with pytest.raises(InputError, match=r"Tracking on the CPU needs about .* but only 1 MiB is free"):
        deterministic_pipeline(field, whole_brain=True, device="cpu", on_batch=batches.append)
    assert not batches


TRACK_PEAK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, ".")
    from tests.test_memory_guard import _demo_field
    from tractlens.app import memory_guard
    from tractlens.app.pipelines.track import deterministic_pipeline

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

    field = _demo_field()
    needs = []
    real = memory_guard.check_host_memory
    memory_guard.check_host_memory = lambda need, fix, **k: needs.append(need) or real(need, fix, **k)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    result = deterministic_pipeline(field, whole_brain=True, seeds_per_voxel=int(sys.argv[1]), device="cpu")
    print(json.dumps({"peak": status("VmHWM") - before, "need": needs[0].total, "parts": needs[0].parts,
                      "points": len(result.tractogram.points)}))
    """
)


def test_a_tracking_job_takes_no_more_host_memory_than_it_announced():
    """Whole-brain tracking of the demo, 4 seeds per voxel, in a fresh process: its peak
    resident memory above what the process held before is below its estimate."""
    done = subprocess.run([sys.executable, "-c", TRACK_PEAK_SCRIPT, "4"], capture_output=True, text=True, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    print(out)
    assert 0 < out["peak"] <= out["need"], out


def test_commit_announces_4_bytes_per_voxel_and_measurement_in_the_fit(monkeypatch):
    """The CPU fit holds the signal once in float32 and, with the fused loops, no other vector
    per measurement (A x and A z are made row by row): 4 bytes per fitted voxel and measurement
    (the float64 fit held 44, the fit with separate products 12, the fused one keeping A x 8).
    After it, A x in float64 is made whole only up to 512 MB (the error maps then come from
    blocks of rows): on 16³ voxels the need is 12 bytes a value (signal + model), on 800,000 it
    is 4."""
    import numpy as np

    from tests.benchmarks.bench_commit import bundle_inputs
    from tractlens.app.memory_guard import commit_host_need
    from tractlens.gpu.commit import CommitParams

    pytest.importorskip("numba", reason="the fused loops need the cpu extra (numba)")
    _, tract = bundle_inputs(500, shape=(16, 16, 16), n_meas=20)
    # every voxel of the grid counted as fitted (the bundle passes through a 16³ corner of it)
    voxels = lambda tract, rows, *a: memory_guard.Traversal(int((rows >= 0).sum()), int((rows >= 0).sum()))  # noqa: E731
    monkeypatch.setattr(memory_guard, "traversal", voxels)

    def per_value(shape, lo, hi):
        rows = np.arange(int(np.prod(shape))).reshape(shape)

        def need(n_meas):
            return commit_host_need(tract, rows, np.ones(3), np.eye(4), n_meas, CommitParams()).parts

        a, b = need(lo), need(hi)
        return sum(b[k] - a[k] for k in ("signal", "fit vectors")) / (rows.size * (hi - lo))

    assert per_value((16, 16, 16), 90, 288) == 12
    assert per_value((100, 100, 80), 288, 400) == 4


def test_commit_announces_at_most_k_ec_compartments_a_voxel(monkeypatch):
    """Without a peaks file the need counts ec_orientations compartments a voxel at most (the
    former one-per-orientation compartments are counted over the points, up to one a segment)."""
    import dataclasses

    import numpy as np

    from tests.benchmarks.bench_commit import bundle_inputs
    from tractlens.app.memory_guard import commit_host_need
    from tractlens.gpu.commit import CommitParams

    _, tract = bundle_inputs(500, shape=(16, 16, 16), n_meas=20)
    rows = np.arange(16**3).reshape(16, 16, 16)
    real = memory_guard.traversal
    monkeypatch.setattr(memory_guard, "traversal", lambda *a: dataclasses.replace(real(*a), voxels=a[1].size))

    def plan(k):
        return commit_host_need(tract, rows, np.ones(3), np.eye(4), 60, CommitParams(ec_orientations=k)).plan

    assert plan(1)["ec_compartments"] == 16**3 and plan(2)["ec_compartments"] == 2 * 16**3 < plan(2)["segments"]
    assert plan(0)["ec_compartments"] > 2 * 16**3  # the distinct orientations of the whole


def _segment_rows(tract, rows):
    import numpy as np

    from tractlens.gpu import commit_segments

    seg = commit_segments.segments(tract.points, tract.offsets, rows, np.ones(3), to_voxel=np.eye(4))
    return len(np.unique(np.asarray(seg.row)))


def _lines(points, offsets):
    import types

    import numpy as np

    return types.SimpleNamespace(points=np.asarray(points, dtype=np.float32), offsets=np.asarray(offsets))


def test_the_fitted_voxels_are_counted_from_the_points_not_the_mask():
    """COMMIT fits the voxels its segments lie in. The guard counts them in one pass over the
    points (their voxels grown by the longest step): never fewer than the segments' voxels, and
    for a bundle in a whole-grid mask far fewer than the mask's voxels, which it used to count."""
    import numpy as np

    from tests.benchmarks.bench_commit import bundle_inputs
    from tractlens.app.memory_guard import traversed_voxels

    _, tract = bundle_inputs(300, shape=(16, 16, 16), n_meas=20)
    rows = np.full((48, 48, 48), -1, dtype=np.int64)
    rows[2:-2, 2:-2, 2:-2] = np.arange(44**3).reshape(44, 44, 44)  # a mask around the bundle's corner
    counted = traversed_voxels(tract, rows, np.eye(4))
    assert _segment_rows(tract, rows) <= counted < 16**3 < 44**3
    # the same points in millimetres of a 2 mm grid: counted through the affine
    affine = np.diag([0.5, 0.5, 0.5, 1.0])
    in_mm = _lines(np.asarray(tract.points) * 2, tract.offsets)
    assert traversed_voxels(in_mm, rows, affine) == counted


def test_long_steps_count_every_usable_voxel_and_steps_between_streamlines_do_not():
    import numpy as np

    from tractlens.app.memory_guard import MAX_STEP_VOXELS, traversed_voxels

    rows = np.arange(40**3).reshape(40, 40, 40)
    rows[:, :, :5] = -1
    near = np.array([[5, 5, 10], [5.5, 5, 10], [30, 30, 30], [30.5, 30, 30]], dtype=np.float32)
    two = _lines(near, [0, 2, 4])  # far apart, but as two streamlines: steps of 0.5
    assert traversed_voxels(two, rows, None) == 2 * 4 * 3 * 3  # each pair of voxels grown by one
    far = np.array([[5, 5, 10], [5 + MAX_STEP_VOXELS + 1, 5, 10]], dtype=np.float32)
    assert traversed_voxels(_lines(far, [0, 2]), rows, None) == int((rows >= 0).sum())
    assert traversed_voxels(_lines(np.zeros((0, 3)), [0]), rows, None) == 0


def _exact_pairs(tract, rows, voxel_size):
    """COMMIT's EC compartments without a peaks file: distinct (voxel, orientation) of its segments."""
    import numpy as np

    from tractlens.gpu import commit_operator, commit_segments

    seg = commit_segments.segments(tract.points, tract.offsets, rows, voxel_size, to_voxel=np.eye(4))
    return len(commit_operator.ec_from_segments(seg)[0])


@pytest.mark.parametrize("cap", [1 << 12, 1 << 19])
def test_the_ec_compartments_are_counted_within_a_few_per_cent(monkeypatch, cap):
    """Bundles (many streamlines along the same paths: their segments share (voxel, orientation)
    pairs) in a mask that leaves a border out: the pass over the points counts the pairs within a
    few per cent of the exact count — exactly (up to the voxels between a step's ends, which it
    does not see) while they are fewer than the cap, by hash sampling beyond it (cap 4096:
    relative standard error ≤ 2.2 %, 4.5 standard errors allowed here). The need then announces
    at least the exact count, with the margin, and far fewer than a sample scaled to the whole
    would (the sample's sharing is the sample's only)."""
    import numpy as np

    from tests.benchmarks.bench_commit import bundle_inputs
    from tractlens.app.memory_guard import EC_PAIR_MARGIN, commit_host_need, traversal
    from tractlens.gpu.commit import CommitParams

    monkeypatch.setattr(memory_guard, "PAIR_SAMPLE_KEYS", cap)
    _, tract = bundle_inputs(20000, shape=(40, 40, 40), n_meas=20)
    rows = np.full((40, 40, 40), -1, dtype=np.int64)
    rows[1:-1, 1:-1, 2:-2] = np.arange(38 * 38 * 36).reshape(38, 38, 36)
    sizes = np.full(3, 2.0)
    exact = _exact_pairs(tract, rows, sizes)
    counted = traversal(tract, rows, np.eye(4), sizes).ec_pairs
    assert exact > 4 * cap or cap > exact  # sampled, or exact
    assert 0.9 * exact <= counted <= 1.1 * exact, (counted, exact)
    if cap > exact:
        assert 0.95 * exact <= counted <= exact  # only the voxels between the ends missed
    announced = commit_host_need(tract, rows, sizes, np.eye(4), 20, CommitParams()).plan["ec_compartments"]
    assert exact <= announced <= EC_PAIR_MARGIN * 1.1 * exact + 1000


def test_the_pairs_are_those_of_the_steps_usable_ends_and_bins():
    """Two streamlines along x (one bin) through the same voxels, one along y: pairs of each
    step's usable end voxels and its bin, none across the gap between streamlines."""
    import numpy as np

    from tractlens.app.memory_guard import traversal

    rows = np.arange(10**3).reshape(10, 10, 10)
    rows[7:] = -1  # x ≥ 7 not usable
    along_x = [[2, 5, 5], [2.5, 5, 5], [3, 5, 5], [3.5, 5, 5]]  # voxels 2, 3, 4 (3.5 rounds up)
    along_y = [[8, 1, 1], [8, 1.5, 1], [8, 2, 1]]  # outside the usable voxels
    points = along_x + along_x + along_y + [[4, 4, 4], [4, 4, 5]]  # then one step along z: voxels (4,4,4), (4,4,5)
    tract = _lines(points, [0, 4, 8, 11, 13])
    assert traversal(tract, rows, None, np.ones(3)).ec_pairs == 3 + 2
    assert traversal(tract, rows, None).ec_pairs is None  # not counted without the voxel size


def test_commit_is_refused_before_the_fit_when_the_counted_need_is_not_free(monkeypatch):
    """The first check passes (enough free then); after the cut, with the segments and EC
    compartments counted, what the fit still needs is not free: refused before the fit with the
    need, what is already held and what is free."""
    from tests.benchmarks.bench_commit import bundle_inputs
    from tractlens.app.pipelines.commit import commit_pipeline
    from tractlens.gpu import commit_solver

    dwi, tract = bundle_inputs(300, shape=(16, 16, 16), n_meas=20)
    free = iter([1 << 40, 1 << 20])  # the first check, then the fit's
    monkeypatch.setattr(memory_guard, "host_free_bytes", lambda: next(free))
    fits = []
    monkeypatch.setattr(commit_solver, "fista_fused", lambda *a, **k: fits.append(1))
    monkeypatch.setattr(commit_solver, "fista", lambda *a, **k: fits.append(1))
    with pytest.raises(InputError, match=r"COMMIT on the CPU needs about .* already held, but only 1 MiB is free"):
        commit_pipeline(dwi, tract, device="cpu")
    assert not fits and next(free, None) is None  # both checks made, no fit


def test_the_fit_is_checked_with_the_exact_counts(monkeypatch):
    """The second check's need is the fit's, from the made segments, voxels and EC compartments."""
    from tests.benchmarks.bench_commit import bundle_inputs
    from tractlens.app.memory_guard import commit_fit_need
    from tractlens.app.pipelines.commit import commit_pipeline
    from tractlens.gpu.commit import CommitParams

    dwi, tract = bundle_inputs(300, shape=(16, 16, 16), n_meas=20)
    needs = []
    real = memory_guard.check_host_memory
    monkeypatch.setattr(
        memory_guard, "check_host_memory", lambda need, fix, **k: needs.append(need) or real(need, fix, **k)
    )
    params = CommitParams(max_iter=2)
    result = commit_pipeline(dwi, tract, device="cpu", params=params)
    p = result.problem
    runtime = needs[0].parts["runtime"]  # with the compiler when this job loaded the loops
    expected = commit_fit_need(len(p.segments), p.n_rows, p.n_ec, len(tract), p.n_meas, params, runtime)
    assert len(needs) == 2 and needs[1].total == expected.total and needs[1].plan["ec_compartments"] == p.n_ec
    assert result.provenance["host_memory_announced_bytes"] == max(needs[0].total, needs[1].total)


def test_the_signal_is_divided_in_blocks_of_voxels_with_the_same_values(monkeypatch, tmp_path):
    """The normalised signal of a mapped column-major series, a few voxels at a time (blocks
    that bound the worker threads' temporaries): bit for bit the boolean-indexed quotient."""
    import numpy as np

    from tractlens.app.pipelines import commit_inputs

    monkeypatch.setattr(commit_inputs, "SIGNAL_BLOCK_VOXELS", 7)
    rng = np.random.default_rng(3)
    shape = (9, 11, 5, 13)
    mm = np.memmap(tmp_path / "dwi.raw", dtype=np.float32, mode="w+", shape=shape, order="F")
    mm[:] = rng.uniform(10, 1000, shape).astype(np.float32)
    mm.flush()
    data = np.memmap(tmp_path / "dwi.raw", dtype=np.float32, mode="r", shape=shape, order="F")
    usable = rng.random(shape[:3]) < 0.6
    b0 = rng.uniform(50, 500, shape[:3]).astype(np.float32)
    y = commit_inputs._normalised_signal(data, b0, usable)
    expected = np.asarray(data)[usable] / b0[usable][:, None]
    assert y.dtype == np.float32 and np.array_equal(y, expected)
