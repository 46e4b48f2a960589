"""Probabilistic tracking (probtrackx style): phantoms, mask semantics, and the CUDA kernel
against the NumPy reference step by step."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tractlens.gpu.probabilistic_numpy import track_numpy
from tractlens.gpu.probabilistic_params import ProbParams, SampleField, mask_bits

SHAPE = (30, 12, 12)


def straight_bundle(noise=0.1, seed=0):
    """A bundle along x through y, z in 4..7 (f 0.6, directions within ~6° of x), isotropic
    samples (f 0.1, random directions) elsewhere; 2 mm voxels; brain all but the x-end slabs."""
    rng = np.random.default_rng(seed)
    L, S = 2, 10
    dirs = rng.normal(size=(*SHAPE, L, S, 3))
    f = np.full((*SHAPE, L, S), 0.1)
    bundle = np.zeros(SHAPE, bool)
    bundle[:, 4:8, 4:8] = True
    along = np.array([1.0, 0, 0]) + rng.normal(0, noise, (int(bundle.sum()), S, 3))
    dirs[bundle, 0] = along
    f[bundle, 0] = 0.6
    dirs /= np.linalg.norm(dirs, axis=-1, keepdims=True)
    brain = np.ones(SHAPE, bool)
    brain[[0, -1]] = False
    return SampleField.from_grid(dirs, f, brain, (2.0, 2.0, 2.0)), brain, bundle


def slab(x0, x1, y=slice(None)):
    m = np.zeros(SHAPE, bool)
    m[x0:x1, y] = True
    return m


def run(device, field_, bits, seeds, params, **kw):
    if device == "gpu":
        from tractlens.gpu.backend import get_backend
        from tractlens.gpu.probabilistic_kernel import track_kernel

        return track_kernel(get_backend("gpu"), field_, bits, seeds, params, **kw)
    return track_numpy(field_, bits, seeds, params, **kw)


SEEDS = np.array([[3, 5, 5], [3, 6, 6]])


def test_a_bundle_seeded_at_one_end_stays_in_it_and_reaches_the_far_end(device):
    field_, brain, bundle = straight_bundle()
    bits = mask_bits(brain, targets=[slab(26, 28)])
    face = np.argwhere(bundle & slab(3, 4))  # the bundle's cross-section at one end: 16 seed voxels
    r = run(device, field_, bits, face, ProbParams(n_samples=100, n_steps=300), n_targets=1)
    inside = r.paths[bundle].sum() / r.paths.sum()
    visited = r.paths > 0.05 * r.paths.max()
    dice = 2 * (visited & bundle).sum() / (visited.sum() + bundle[1:-1].sum())
    print(f"\n[{device}] in-bundle fraction of visits {inside:.4f}, Dice {dice:.3f}, waytotal {r.waytotal}")
    assert inside > 0.85 and dice > 0.85  # edge seeds sample the isotropic border too
    assert r.waytotal == 1600  # no waypoints: every streamline is kept
    core = (face[:, 1] >= 5) & (face[:, 1] <= 6) & (face[:, 2] >= 5) & (face[:, 2] <= 6)
    assert (r.seed_targets[core] == 100).all()  # from the core, every streamline reaches the far end
    assert r.seed_targets.sum() > 0.6 * 1600  # from the edge, some wander off into the isotropic border
    assert r.paths[tuple(face.T)].min() >= 100  # each seed voxel is on (at least) its own streamlines


def test_exclusion_stop_and_waypoints_do_what_fsl_documents(device):
    field_, brain, _ = straight_bundle()
    params = ProbParams(n_samples=100, n_steps=300)
    excluded = run(device, field_, mask_bits(brain, exclude=slab(15, 16)), SEEDS, params)
    assert excluded.waytotal == 0 and excluded.paths.sum() == 0  # every streamline crosses it: all discarded
    stopped = run(device, field_, mask_bits(brain, stop=slab(15, 16)), SEEDS, params)
    assert stopped.waytotal == 200
    assert stopped.paths[15].sum() > 0 and stopped.paths[16:].sum() == 0  # the stop voxel counts, nothing beyond
    on, off = slab(20, 21), slab(20, 21, y=slice(0, 2))  # a waypoint on the bundle, one beside it
    both = mask_bits(brain, waypoints=[on, off])
    assert run(device, field_, both, SEEDS, params, n_waypoints=2).waytotal == 0
    either = run(device, field_, both, SEEDS, ProbParams(n_samples=100, n_steps=300, waycond="OR"), n_waypoints=2)
    assert either.waytotal == 200


def test_streamlines_are_counted_once_and_runs_repeat():
    field_, brain, _ = straight_bundle(noise=0.6)  # a wobbly bundle: streamlines re-enter voxels
    bits = mask_bits(brain)
    params = ProbParams(n_samples=50, n_steps=200, cthr=-1.0)
    r = track_numpy(field_, bits, SEEDS, params)
    assert r.paths.max() <= r.waytotal == 100
    again = track_numpy(field_, bits, SEEDS, params)
    np.testing.assert_array_equal(r.paths, again.paths)
    parts = [track_numpy(field_, bits, SEEDS, params, first_id=start, count=25) for start in (0, 25, 50, 75)]
    np.testing.assert_array_equal(sum(p.paths for p in parts), r.paths)  # batching changes nothing
    looped = track_numpy(field_, bits, SEEDS, ProbParams(n_samples=50, n_steps=200, cthr=-1.0, loopcheck=True))
    assert looped.paths.sum() < r.paths.sum()  # the loop check ends wandering halves early


@pytest.mark.gpu
@pytest.mark.parametrize("options", [{}, {"modeuler": True}, {"randfib": 2, "loopcheck": True}])
def test_kernel_takes_the_reference_steps(options):
    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.probabilistic_kernel import track_kernel

    field_, brain, bundle = straight_bundle(noise=0.4)
    bits = mask_bits(brain, exclude=slab(22, 23, y=slice(0, 3)), targets=[slab(26, 28)])
    params = ProbParams(n_samples=16, n_steps=120, **options)
    seeds = np.argwhere(bundle & slab(3, 4))  # 16 voxels, an F-ordered array as argwhere makes it
    ref, ref_trace = track_numpy(field_, bits, seeds, params, n_targets=1, record=True)
    gpu, trace = track_kernel(get_backend("gpu"), field_, bits, seeds, params, n_targets=1, trace=True)
    for half in (0, 1):
        expected = ref_trace[half]  # (n, steps recorded, 4)
        got = trace[:, half, : expected.shape[1]]
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(gpu.paths, ref.paths)
    np.testing.assert_array_equal(gpu.seed_matrix, ref.seed_matrix)
    assert gpu.waytotal == ref.waytotal and np.array_equal(gpu.seed_targets, ref.seed_targets)
    assert gpu.steps == ref.steps > 0
    assert gpu.provenance["rerun_large_sets"] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("masks", ["none", "exclusion and waypoint"])
def test_kernel_runs_streamlines_too_long_for_its_sets_again(masks):
    """With sets of 16 slots (12 voxels) the streamlines with more distinct voxels are abandoned in the first pass
    and run again with a large set; the totals equal the reference's exactly, both when visits
    are counted as they happen (nothing can discard a streamline) and when they are counted at
    the end."""
    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.probabilistic_kernel import track_kernel

    field_, brain, bundle = straight_bundle(noise=0.4)
    extra = {} if masks == "none" else {"exclude": slab(22, 23, y=slice(0, 3)), "waypoints": [slab(12, 13)]}
    bits = mask_bits(brain, targets=[slab(26, 28)], **extra)
    n_way = len(extra.get("waypoints", []))
    params = ProbParams(n_samples=16, n_steps=120, loopcheck=True)
    seeds = np.argwhere(bundle & slab(3, 4))
    ref, steps = track_numpy(field_, bits, seeds, params, 1, n_way, record=True, seed_matrix=True)
    points = np.concatenate(steps, axis=1)[..., :3]  # (n, both halves' positions, 3)
    distinct = np.array([len(np.unique(np.rint(p), axis=0)) for p in points])
    gpu = track_kernel(get_backend("gpu"), field_, bits, seeds, params, 1, n_way, set_slots=16, seed_matrix=True)
    assert gpu.provenance["rerun_large_sets"] == (distinct > 12).sum() > 0.1 * len(distinct)
    assert gpu.provenance["counting"] == ("immediate" if masks == "none" else "at end")
    np.testing.assert_array_equal(gpu.paths, ref.paths)
    assert gpu.waytotal == ref.waytotal and np.array_equal(gpu.seed_targets, ref.seed_targets)


def test_batches_stream_running_totals_and_cancel(device):
    from tractlens.gpu.backend import Cancelled
    from tractlens.gpu.probabilistic import iter_track

    field_, brain, bundle = straight_bundle()
    bits = mask_bits(brain, targets=[slab(26, 28)])
    face = np.argwhere(bundle & slab(3, 4))
    params = ProbParams(n_samples=40, n_steps=200)
    whole = track_numpy(field_, bits, face, params, n_targets=1, seed_matrix=True)
    seen = []
    running = list(
        iter_track(
            field_,
            bits,
            face,
            params,
            n_targets=1,
            device=device,
            batch_streamlines=200,
            progress=lambda d, t: seen.append(d),
            seed_matrix=True,
        )
    )
    assert seen == [200, 400, 600, 640]
    assert [r.streamlines for r in running] == seen
    assert all((a.paths <= b.paths).all() for a, b in itertools.pairwise(running))  # filling in
    np.testing.assert_array_equal(running[-1].paths, whole.paths)  # same on every engine and batching
    np.testing.assert_array_equal(running[-1].seed_targets, whole.seed_targets)
    assert running[-1].waytotal == whole.waytotal and running[-1].steps == whole.steps
    np.testing.assert_array_equal(running[-1].seed_matrix, whole.seed_matrix)
    kept = []
    with pytest.raises(Cancelled):
        for partial in iter_track(
            field_,
            bits,
            face,
            params,
            device=device,
            batch_streamlines=200,
            cancelled=lambda: bool(kept),
        ):
            kept.append(partial)
    # Cancelled once the first totals arrived; every batch computed by then is handed out
    # first (on the GPU the next batch is already under way when the first is reported).
    assert [r.streamlines for r in kept] in ([200], [200, 400])
    assert len(kept) == (2 if device == "gpu" else 1)
    np.testing.assert_array_equal(kept[-1].paths, running[len(kept) - 1].paths)


# ---------------------------------------------------------------- files and command line


def test_track_probabilistic_command_on_the_demo_bundles(demo_bedpostx, demo_dir, demo_phantom, tmp_path):
    import json

    import nibabel as nib

    from tests.test_cli import run_cli

    out = tmp_path / "prob"
    seed, target = demo_dir / "roi_crossing_lr_seed.nii.gz", demo_dir / "roi_crossing_lr_target.nii.gz"
    args = ["track", "probabilistic", "--samples", str(demo_bedpostx), "--seed", str(seed), "--target", str(target)]
    result = run_cli(*args, "--nsamples", "20", "--device", "cpu", "-o", str(out), "--json", "--seed-matrix")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    n_seed = int((nib.load(seed).get_fdata() > 0).sum())
    assert summary["streamlines"] == 20 * n_seed == summary["waytotal"]  # no waypoints, no exclusion
    expected = {"fdt_paths.nii.gz", "waytotal", "seeds_to_roi_crossing_lr_target.nii.gz", "probtrackx.json"}
    matrices = {f"matrix_seeds_to_{what}.{ext}" for what in ("all_targets", "seeds") for ext in ("csv", "npy")}
    assert expected | matrices == set(summary["files"])
    seed_matrix = np.load(out / "matrix_seeds_to_seeds.npy")
    assert seed_matrix.shape == (n_seed, n_seed) and np.trace(seed_matrix) == summary["waytotal"]
    sparse = np.loadtxt(out / "matrix_seeds_to_seeds.csv", delimiter=",", skiprows=1, dtype=int)
    assert len(sparse) == np.count_nonzero(seed_matrix) and sparse[:, 6].sum() == seed_matrix.sum()
    paths = nib.load(out / "fdt_paths.nii.gz").get_fdata()
    in_bundle = demo_phantom.occupancy[..., 0] > 0.1
    fraction = paths[in_bundle].sum() / paths.sum()
    reached = summary["targets"]["roi_crossing_lr_target"] / summary["streamlines"]
    print(f"\ncrossing_lr: {fraction:.3f} of visits in the bundle, {reached:.2f} of streamlines reach the target")
    assert fraction > 0.9 and reached > 0.5
    assert int((out / "waytotal").read_text()) == summary["waytotal"]
    matrix = np.loadtxt(out / "matrix_seeds_to_all_targets.csv", delimiter=",", skiprows=1)
    s2t = nib.load(out / "seeds_to_roi_crossing_lr_target.nii.gz").get_fdata()
    assert matrix[:, 3].sum() == s2t.sum() == summary["targets"]["roi_crossing_lr_target"]
    saved = tmp_path / "paths.trx"
    excluded = run_cli(
        *args,
        "--exclude",
        str(target),
        "--nsamples",
        "20",
        "--device",
        "cpu",
        "-o",
        str(tmp_path / "x"),
        "--json",
        "--save-paths",
        str(saved),
        "--save-paths-max",
        "300",
    )
    assert excluded.returncode == 0, excluded.stderr
    second = json.loads(excluded.stdout)
    assert second["waytotal"] == summary["streamlines"] - summary["targets"]["roi_crossing_lr_target"]
    # --save-paths: 300 of the run's streamlines traced again, the kept ones saved (none enters the target)
    from tractlens.app.io import load_tractogram

    tract = load_tractogram(saved)
    assert second["paths_traced"] == 300 and second["paths_saved"] == len(tract)
    assert 0 < len(tract) < 300 and len(tract) / 300 == pytest.approx(
        second["waytotal"] / second["streamlines"], abs=0.1
    )
    voxels = np.rint(tract.points).astype(int)
    assert not (nib.load(target).get_fdata() > 0)[tuple(voxels.T)].any()
    assert set(np.unique(tract.streamline_scalars["seed_voxel"])) <= set(range(n_seed))


@pytest.mark.parametrize(
    "extra, expect",
    [
        (["--nsamples", "0"], "n_samples and n_steps must be at least 1"),
        (["--cthr", "2"], "cthr is a cosine"),
        (["--seed", "OUTSIDE"], "no seed voxel lies inside the bedpostX brain mask"),
        (["--samples", "NOTBPX"], "not a bedpostX output"),
        (["--gpus", "0"], "--gpus must be at least 1"),
        (["--gpus", "64"], "64 GPU"),
    ],
)
def test_track_probabilistic_bad_inputs(demo_bedpostx, demo_dir, tmp_path, extra, expect):
    import nibabel as nib

    from tests.test_cli import _expect_input_error

    img = nib.load(demo_dir / "mask.nii.gz")
    outside = (img.get_fdata() == 0).astype(np.uint8)
    nib.save(nib.Nifti1Image(outside, img.affine), tmp_path / "outside.nii.gz")
    swap = {"OUTSIDE": str(tmp_path / "outside.nii.gz"), "NOTBPX": str(demo_dir)}
    args = ["--samples", str(demo_bedpostx), "--seed", str(demo_dir / "roi_crossing_lr_seed.nii.gz")]
    for i in range(0, len(extra), 2):
        if extra[i] in args:
            args[args.index(extra[i]) + 1] = swap.get(extra[i + 1], extra[i + 1])
        else:
            args += [extra[i], swap.get(extra[i + 1], extra[i + 1])]
    _expect_input_error("track", "probabilistic", *args, "-o", str(tmp_path / "o"), match=expect)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("bundle", ["crossing_lr", "crossing_ap", "arc", "kissing_lower", "kissing_upper"])
def test_demo_bundles_stay_in_their_bundle_through_crossing_and_kissing(
    device, bundle, demo_bedpostx, demo_dir, demo_phantom
):
    """Seeded at one end of each demo bundle (the 90° crossing, the curved arc, the two arcs that
    touch and part): the path distribution stays in that bundle. Reports the share of visits in the
    bundle and the Dice of the voxels reached by ≥ 1 % of streamlines against the bundle mask."""
    from tractlens.app.pipelines.probabilistic import prepare_probabilistic

    names = [b.name for b in demo_phantom.bundles]
    own = demo_phantom.occupancy[..., names.index(bundle)] > 0.1
    run = prepare_probabilistic(
        demo_bedpostx,
        demo_dir / f"roi_{bundle}_seed.nii.gz",
        targets=[demo_dir / f"roi_{bundle}_target.nii.gz"],
        params=ProbParams(n_samples=20),
    )
    result = run.track(device=device)
    share = result.paths[own].sum() / result.paths.sum()
    reached = result.paths >= 0.01 * result.streamlines
    dice = 2 * (reached & own).sum() / (reached.sum() + own.sum())
    to_target = result.seed_targets.sum() / result.streamlines
    print(
        f"\n[{device}] {bundle}: {share:.3f} of visits in the bundle, Dice {dice:.2f}, {to_target:.2f} reach its target"
    )
    assert share > 0.85 and dice > 0.7
    assert to_target > 0.5


def test_prepare_from_masks_in_memory_checks_them(demo_bedpostx, demo_dir):
    """The GUI's path: ROI masks already on the samples' grid; the loaded dyads layer keeps its samples."""
    import nibabel as nib

    from tractlens.app.errors import InputError
    from tractlens.app.loaders import load_layers
    from tractlens.app.pipelines.probabilistic import prepare_probabilistic, prepare_probabilistic_masks

    layers = load_layers(demo_bedpostx)
    dyads = next(layer for layer in layers if layer.kind == "dyads")
    samples = dyads.data.samples
    seed = nib.load(demo_dir / "roi_crossing_lr_seed.nii.gz").get_fdata() > 0
    target = nib.load(demo_dir / "roi_crossing_lr_target.nii.gz").get_fdata() > 0
    params = ProbParams(n_samples=5)
    run_ = prepare_probabilistic_masks(samples, seed, targets=[("target", target)], params=params)
    from_files = prepare_probabilistic(
        demo_bedpostx, demo_dir / "roi_crossing_lr_seed.nii.gz", targets=[demo_dir / "roi_crossing_lr_target.nii.gz"]
    )
    assert np.array_equal(run_.bits, from_files.bits) and np.array_equal(run_.seeds, from_files.seeds)
    result = run_.track(device="cpu")
    assert result.streamlines == 5 * int(seed.sum()) and result.seed_targets.sum() > 0
    with pytest.raises(InputError, match="seed mask is empty"):
        prepare_probabilistic_masks(samples, np.zeros_like(seed))
    with pytest.raises(InputError, match="not the samples' grid"):
        prepare_probabilistic_masks(samples, seed, stop=np.zeros((3, 3, 3), bool))
    with pytest.raises(InputError, match="same name"):
        prepare_probabilistic_masks(samples, seed, targets=[("a", target), ("a", target)])


def _demo_distribution(demo_bedpostx, demo_dir, n_samples, seed, device):
    import nibabel as nib

    from tractlens.app.io import load_bedpostx
    from tractlens.app.pipelines.probabilistic import prepare_probabilistic_masks

    mask = nib.load(demo_dir / "roi_crossing_lr_seed.nii.gz").get_fdata() > 0
    run_ = prepare_probabilistic_masks(
        load_bedpostx(demo_bedpostx), mask, params=ProbParams(n_samples=n_samples, seed=seed)
    )
    return run_.track(device=device).paths.ravel().astype(float)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_repeated_runs_with_other_random_seeds_correlate(demo_bedpostx, demo_dir, device):
    """The seed's criterion: path distributions of independent runs (other --seed-rng) correlate
    ≥ 0.998 — NumPy vs NumPy in CI, GPU vs NumPy on the GPU machine (75 seed voxels × 100
    samples; 7 500 streamlines per run)."""
    reference = _demo_distribution(demo_bedpostx, demo_dir, 100, 1, "cpu")
    other = _demo_distribution(demo_bedpostx, demo_dir, 100, 2, device)
    r = np.corrcoef(reference, other)[0, 1]
    print(f"\ncorrelation of the path distributions, NumPy seed 1 vs {device} seed 2: {r:.5f}")
    assert r >= 0.998
    assert not np.array_equal(reference, other)  # other random numbers, not the same run


def test_saved_paths_are_the_streamlines_the_run_counted(device):
    """Tracing the run's streamlines again (same random streams) gives polylines whose voxels are
    exactly what the path distribution counted, and the same kept ones (waypoint AND)."""
    from tractlens.gpu.probabilistic import path_positions, trace_paths

    field_, brain, bundle = straight_bundle(noise=0.4)
    bits = mask_bits(brain, exclude=slab(22, 23, y=slice(0, 3)), waypoints=[slab(12, 13)])
    params = ProbParams(n_samples=20, n_steps=150)
    seeds = np.argwhere(bundle & slab(3, 4))
    run_ = track_numpy(field_, bits, seeds, params, n_waypoints=1, seed_matrix=True)
    total = len(seeds) * params.n_samples
    lines, seed_of, kept = trace_paths(
        field_, bits, seeds, params, path_positions(total, total), n_waypoints=1, device=device, chunk=97
    )
    assert len(lines) == total and kept.sum() == run_.waytotal and 0 < run_.waytotal < total
    paths = np.zeros(field_.shape, np.int64)
    number = np.full(field_.shape, -1)
    number[tuple(seeds.T)] = np.arange(len(seeds))
    matrix = np.zeros((len(seeds), len(seeds)), np.int64)  # seed x seed, brute force
    for line, k, s in zip(lines, kept, seed_of, strict=True):
        if k:
            voxels = np.unique(np.rint(line).astype(int), axis=0)
            paths[tuple(voxels.T)] += 1
            others = number[tuple(voxels.T)]
            matrix[s, others[others >= 0]] += 1
    np.testing.assert_array_equal(paths, run_.paths)
    np.testing.assert_array_equal(matrix, run_.seed_matrix)
    assert (np.diag(matrix) == np.bincount(seed_of[kept], minlength=len(seeds))).all()
    assert matrix.sum() > np.trace(matrix)  # streamlines pass through other seed voxels too
    nearest = [np.abs(line - seeds[s]).max(1).min() for line, s in zip(lines, seed_of, strict=True)]
    assert max(nearest) <= 0.5  # each starts in its seed voxel
    np.testing.assert_array_equal(path_positions(10, 4), [0, 1, 2, 3])


@pytest.mark.gpu
def test_kernel_uses_fewer_threads_when_memory_is_short():
    """With CuPy's memory pool limited to 16 MiB, the visited-voxel sets of 6 400 threads (26 MB)
    do not fit: the tracker halves the threads until they do, and the result is the same; when
    not even the samples fit, a clear OutOfDeviceMemory."""
    import cupy as cp

    from tractlens.gpu.backend import OutOfDeviceMemory, get_backend
    from tractlens.gpu.probabilistic_kernel import track_kernel

    field_, brain, bundle = straight_bundle(noise=0.4)
    bits = mask_bits(brain)
    params = ProbParams(n_samples=400, n_steps=120)
    seeds = np.argwhere(bundle & slab(3, 4))
    backend = get_backend("gpu")
    full = track_kernel(backend, field_, bits, seeds, params)
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    try:
        pool.set_limit(size=16 * 2**20)
        short = track_kernel(backend, field_, bits, seeds, params)
        pool.free_all_blocks()  # (cached blocks would be reused within any limit)
        pool.set_limit(size=1024)
        with pytest.raises(OutOfDeviceMemory, match="posterior samples"):
            track_kernel(backend, field_, bits, seeds, params)
    finally:
        pool.set_limit(size=0)
    assert short.provenance["threads"] < full.provenance["threads"] == 6400
    np.testing.assert_array_equal(short.paths, full.paths)
    assert short.waytotal == full.waytotal
