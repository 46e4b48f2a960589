"""Connectivity matrices, along-tract profiles and distance to a lesion (gpu.connectivity,
gpu.tractometry, app.pipelines.connectivity): brute-force and analytic references.

Every test taking ``device`` runs on NumPy and, marked ``gpu``, on CuPy; the GPU results
must equal the NumPy ones (labels exactly, distances to 1e-6 mm (per point: float32, 1e-5),
profiles to 1e-5)."""

from __future__ import annotations

import itertools
import json

import nibabel as nib
import numpy as np
import pytest

from tests.test_cli import run_cli
from tractlens.app.errors import InputError
from tractlens.app.io.lut import load_lut
from tractlens.app.model import Tractogram, Volume
from tractlens.app.pipelines import connectivity as pipe
from tractlens.gpu import connectivity as conn
from tractlens.gpu import tractometry as tm

# ------------------------------------------------------------------ brute-force references


def brute_label(point, labels, linear, radius):
    """The label of the voxel holding the point, else of the nearest labelled voxel centre
    within ``radius`` mm (first in C order on ties)."""
    own = np.floor(point + 0.5).astype(int)
    if np.all(own >= 0) and np.all(own < labels.shape) and labels[tuple(own)] > 0:
        return int(labels[tuple(own)])
    centres = np.argwhere(labels > 0)
    d = np.linalg.norm((centres - point) @ np.asarray(linear).T, axis=1)
    if not (d <= radius).any():
        return 0
    d = np.where(d <= radius, d, np.inf)
    return int(labels[tuple(centres[np.argmin(d)])])


def brute_matrix(pairs, nodes, weights=None):
    n = len(nodes)
    counts, sums = np.zeros((n, n), int), np.zeros((n, n))
    where = {int(v): i for i, v in enumerate(nodes)}
    for s, (a, b) in enumerate(pairs):
        if a == 0 or b == 0:
            continue
        i, j = where[a], where[b]
        w = 1.0 if weights is None else weights[s]
        counts[i, j] += 1
        sums[i, j] += w
        if i != j:
            counts[j, i] += 1
            sums[j, i] += w
    return counts, sums


def random_parcellation(rng, shape=(18, 16, 14), regions=6):
    labels = np.zeros(shape, np.int32)
    for k in range(regions):
        lo = rng.integers(0, np.array(shape) - 4)
        size = rng.integers(2, 5, 3)
        labels[lo[0] : lo[0] + size[0], lo[1] : lo[1] + size[1], lo[2] : lo[2] + size[2]] = (k + 1) * 7  # sparse ids
    return labels


def random_streamlines(rng, shape, n):
    lengths = rng.integers(1, 8, n)
    points = rng.uniform(-1.0, np.array(shape) + 0.0, (int(lengths.sum()), 3))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return points, offsets


# ------------------------------------------------------------------ connectome


@pytest.mark.parametrize("radius", [0.0, 2.5, 5.0])
def test_endpoint_assignment_equals_brute_force_nearest_labelled_voxel(device, rng, radius):
    labels = random_parcellation(rng)
    linear = np.array([[1.0, 0, 0], [0, 1.5, 0], [0, 0, 2.0]])  # anisotropic voxels: distances in mm
    points, offsets = random_streamlines(rng, labels.shape, 400)
    got = conn.assign_endpoints(points, offsets, labels, linear, radius_mm=radius, device=device)
    expected = np.array(
        [
            [brute_label(points[offsets[s]], labels, linear, radius), brute_label(points[offsets[s + 1] - 1], labels, linear, radius)]
            for s in range(len(offsets) - 1)
        ]
    )  # fmt: skip
    np.testing.assert_array_equal(got.labels, expected)
    assigned = got.labels > 0
    assert np.all(got.distances[assigned] <= max(radius, np.linalg.norm(0.5 * np.diag(linear))) + 1e-12)
    assert np.all(np.isinf(got.distances[~assigned]))
    assert 0.02 < assigned.mean() < 0.98  # the case exercises both outcomes


def test_connectome_counts_and_means_equal_brute_force_and_are_symmetric(device, rng):
    labels = random_parcellation(rng, regions=7)
    linear = np.diag([2.0, 2.0, 2.0])
    points, offsets = random_streamlines(rng, labels.shape, 3000)
    assignment = conn.assign_endpoints(points, offsets, labels, linear, radius_mm=4.0, device=device)
    nodes = np.unique(labels[labels > 0])
    weights = rng.uniform(0, 1, len(offsets) - 1)
    result = conn.connectome(assignment, nodes, weights)
    counts, sums = brute_matrix(assignment.labels, nodes, weights)
    np.testing.assert_array_equal(result.counts, counts)
    np.testing.assert_allclose(result.sums, sums, rtol=1e-12)
    np.testing.assert_array_equal(result.counts, result.counts.T)
    assert result.counts.sum() > 100 and np.count_nonzero(np.diag(result.counts)) > 0
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(result.mean, np.where(counts > 0, sums / np.maximum(counts, 1), 0), rtol=1e-12)
    # a cell's streamlines are exactly those joining its two regions
    a, b = np.unravel_index(np.argmax(np.triu(result.counts, 1)), result.counts.shape)
    picked = result.edge_streamlines(a, b)
    both = {int(nodes[a]), int(nodes[b])}
    expected = np.array([{int(x), int(y)} == both for x, y in assignment.labels])
    np.testing.assert_array_equal(picked, expected)
    assert picked.sum() == result.counts[a, b]


def test_labels_missing_from_nodes_and_huge_label_values():
    nodes = np.array([3, 2**30])
    got = conn.node_indices(np.array([[3, 2**30], [0, 3], [5, 2**30]]), nodes)
    np.testing.assert_array_equal(got, [[0, 1], [-1, 0], [-1, 1]])


def test_streamline_lengths_in_mm():
    points = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [5, 5, 5], [5, 5, 6]], float)
    lengths = conn.streamline_lengths_mm(points, np.array([0, 3, 4, 5]), np.diag([2.0, 3.0, 4.0]))
    np.testing.assert_allclose(lengths, [2.0 + 3.0, 0.0, 0.0])


def _demo_tract(demo_dir, reference):
    from tractlens.app.io import load_tractogram

    return load_tractogram(demo_dir / "bundles.trk", reference=reference)


def _demo_labels(demo_dir):
    img = nib.load(demo_dir / "parcellation.nii.gz")
    volume = Volume("parcellation", np.asarray(img.dataobj).astype(np.int32), img.affine, kind="labels")
    volume.source = str(demo_dir / "parcellation.nii.gz")
    return volume


def test_demo_connectome_finds_each_bundle_between_its_two_regions(demo_dir):
    labels = _demo_labels(demo_dir)
    lut = load_lut(demo_dir / "parcellation.txt")
    tract = _demo_tract(demo_dir, demo_dir / "parcellation.nii.gz")
    result = pipe.compute_connectome(tract, labels, lut=lut, device="cpu")
    bundle = tract.streamline_scalars["bundle"].astype(int)
    expected = np.zeros((10, 10), int)
    for k in range(1, 6):
        expected[2 * k - 2, 2 * k - 1] = expected[2 * k - 1, 2 * k - 2] = (bundle == k).sum()
    np.testing.assert_array_equal(result.counts, expected)
    assert result.row_names[0] == "crossing_lr_start" and result.row_names[9] == "kissing_upper_end"
    np.testing.assert_array_equal(result.cell_streamlines(4, 5), bundle == 3)  # arc_start <-> arc_end
    lengths = pipe.compute_connectome(tract, labels, weight="length", device="cpu")
    arc = conn.streamline_lengths_mm(tract.points, tract.offsets, tract.affine[:3, :3])[bundle == 3]
    assert lengths.values[4, 5] == pytest.approx(arc.mean(), rel=1e-12)
    csv = pipe.matrix_csv_text(result).splitlines()
    assert csv[0].startswith("region,crossing_lr_start,crossing_lr_end")
    assert csv[1].split(",")[2] == str((bundle == 1).sum())


def test_connectome_weights_need_their_scalars(demo_dir):
    labels = _demo_labels(demo_dir)
    tract = _demo_tract(demo_dir, demo_dir / "parcellation.nii.gz")
    with pytest.raises(InputError, match="no per-streamline 'cm'"):
        pipe.compute_connectome(tract, labels, weight="cm", device="cpu")
    with pytest.raises(InputError, match="3 streamline weights for 65"):
        pipe.compute_connectome(tract, labels, weight="commit", weights=np.ones(3), device="cpu")
    weights = np.arange(len(tract), dtype=float)
    result = pipe.compute_connectome(tract, labels, weight="commit", weights=weights, device="cpu")
    bundle = tract.streamline_scalars["bundle"].astype(int)
    assert result.values[0, 1] == pytest.approx(weights[bundle == 1].mean())
    empty = Volume("empty", np.zeros(labels.shape3, np.int32), labels.affine, kind="labels")
    with pytest.raises(InputError, match="no region"):
        pipe.compute_connectome(tract, empty, device="cpu")


def test_probabilistic_seed_by_target_counts_grouped_by_region():
    seeds = np.array([[0, 0, 0], [1, 0, 0], [2, 0, 0], [3, 0, 0]])
    counts = np.array([[1, 0], [2, 5], [0, 3], [4, 4]])
    labels = np.zeros((4, 1, 1), np.int32)
    labels[1:3, 0, 0] = 9
    volume = Volume("l", labels, np.eye(4), kind="labels")
    grouped = pipe.seed_target_matrix(seeds, counts, ["a", "b"], labels=volume)
    assert grouped.row_names == ["unlabelled", "label_9"] and grouped.column_names == ["a", "b"]
    np.testing.assert_array_equal(grouped.counts, [[5, 4], [2, 8]])
    single = pipe.seed_target_matrix(seeds, counts, ["a", "b"])
    np.testing.assert_array_equal(single.counts, [[7, 12]])
    assert single.cell_streamlines(0, 0) is None


def test_lookup_tables_in_the_field_s_formats(tmp_path):
    fs = tmp_path / "FreeSurferColorLUT.txt"
    fs.write_text(
        "#$Id\n0   Unknown  0 0 0 0\n17  Left-Hippocampus   220 216 20  0\n\n53 Right-Hippocampus 220 216 20 0\n"
    )
    table = load_lut(fs)
    assert table.name(17) == "Left-Hippocampus" and table.colours[17] == (220, 216, 20) and table.name(4) == "label_4"
    tsv = tmp_path / "sub-01_dseg.tsv"
    tsv.write_text("index\tname\tcolor\n1\tGM\t#ff0000\n2\tWM\t#00ff00\n")
    table = load_lut(tsv)
    assert table.names == {1: "GM", 2: "WM"} and table.colours[2] == (0, 255, 0)
    bad = tmp_path / "bad.txt"
    bad.write_text("1 a\nx b\n")
    with pytest.raises(InputError, match="line 2 does not start with a label number"):
        load_lut(bad)
    binary = tmp_path / "labels.nii.gz"
    binary.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe")
    with pytest.raises(InputError, match="not a text file"):
        load_lut(binary)


# ------------------------------------------------------------------ profiles


def test_profile_recovers_a_known_fa_gradient_with_streamlines_either_way_round(device, rng):
    shape = (60, 12, 10)
    x = np.arange(shape[0], dtype=np.float64)
    fa = np.broadcast_to((0.2 + 0.6 * x / (shape[0] - 1))[:, None, None], shape).astype(np.float32)
    lines, reversed_ = [], []
    for s in range(40):
        n = int(rng.integers(15, 60))
        t = np.sort(rng.uniform(0, 1, n))
        t[0], t[-1] = 0.0, 1.0  # uneven spacing: the resampling must go by arc length
        y, z = rng.uniform(3, 8), rng.uniform(3, 6)
        line = np.stack([10 + 40 * t, np.full(n, y), np.full(n, z)], axis=1)
        flip = s % 3 == 0
        lines.append(line[::-1] if flip else line)
        reversed_.append(flip)
    tract = Tractogram.from_list(lines, affine=np.diag([2.0, 2.0, 2.0, 1.0]), dimensions=shape)
    volume = Volume("FA", fa, np.diag([2.0, 2.0, 2.0, 1.0]))
    result = pipe.compute_profile(tract, volume, 25, device=device)
    expected = 0.2 + 0.6 * np.linspace(10, 50, 25) / (shape[0] - 1)  # left to right (+x)
    np.testing.assert_allclose(result.mean, expected, atol=1e-5)
    np.testing.assert_allclose(result.sd, 0.0, atol=1e-5)
    assert (result.n == 40).all()
    np.testing.assert_array_equal(result.flipped, reversed_)
    text = pipe.profile_csv_text(result, volume.affine, "FA").splitlines()
    assert text[0] == "point,position,FA_mean,FA_sd,n,x_mm,y_mm,z_mm" and len(text) == 26


def test_profile_sd_is_the_spread_across_streamlines():
    shape = (30, 10, 10)
    values = np.zeros(shape, np.float32)
    values[:, :5] = 1.0  # streamlines at y=2 see 1, at y=7 see 0
    lines = [np.stack([np.linspace(5, 25, 30), np.full(30, y), np.full(30, 5.0)], 1) for y in (2.0, 7.0, 2.0, 7.0)]
    tract = Tractogram.from_list(lines, dimensions=shape)
    result = pipe.compute_profile(tract, Volume("m", values, np.eye(4)), 10, device="cpu")
    np.testing.assert_allclose(result.mean, 0.5)
    np.testing.assert_allclose(result.sd, np.std([1, 0, 1, 0], ddof=1))


def test_resample_is_even_in_arc_length_and_keeps_single_points():
    points = np.array([[0, 0, 0], [1, 0, 0], [10, 0, 0], [5, 5, 5]], float)
    out = tm.resample(points, np.array([0, 3, 4]), 11)
    np.testing.assert_allclose(out[0, :, 0], np.linspace(0, 10, 11))
    np.testing.assert_allclose(out[1], np.tile([5, 5, 5], (11, 1)))
    with pytest.raises(ValueError, match="at least 2"):
        tm.resample(points, np.array([0, 4]), 1)


# ------------------------------------------------------------------ distance to a lesion


def _sphere(shape, centre, radius):
    grid = np.indices(shape, dtype=np.float64)
    return ((grid - np.asarray(centre, float)[:, None, None, None]) ** 2).sum(axis=0) <= radius**2


@pytest.mark.parametrize("voxel", [(1.0, 1.0, 1.0), (2.0, 2.0, 2.0)])
def test_distance_to_a_spherical_lesion_is_analytic_within_half_a_voxel(device, rng, voxel):
    shape = (48, 48, 48)
    centre, radius = np.array([23.3, 24.0, 24.6]), 7.4  # voxels; off the grid's centres
    mask = _sphere(shape, centre, radius)
    lines, analytic = [], []
    for _ in range(300):
        u = rng.normal(size=3)
        u /= np.linalg.norm(u)
        w = rng.normal(size=3)
        w -= w.dot(u) * u
        w /= np.linalg.norm(w)
        offset = rng.uniform(0, radius + 12)
        t = np.arange(-18, 18.01, rng.uniform(0.4, 3.0))  # long segments too: sampled in between
        lines.append(centre + offset * w + t[:, None] * u)
        analytic.append(max(0.0, offset - radius) * voxel[0])
    tract = Tractogram.from_list(lines, affine=np.diag([*voxel, 1.0]), dimensions=shape)
    result = pipe.compute_lesion_distance(tract, mask, np.diag([*voxel, 1.0]), device=device)
    error = result.per_streamline - np.array(analytic)
    assert np.abs(error).max() <= 0.5 * voxel[0], np.abs(error).max()
    assert np.abs(error).mean() < 0.2 * voxel[0]
    # per point: the analytic distance of each point, same bound; 0 inside the lesion
    points = tract.points.astype(np.float64)
    point_analytic = np.maximum(0, np.linalg.norm(points - centre, axis=1) - radius) * voxel[0]
    assert np.abs(result.per_point - point_analytic).max() <= 0.65 * voxel[0]
    inside = mask[tuple(np.floor(points + 0.5).astype(int).clip(0, 47).T)]
    assert inside.any() and np.all(result.per_point[inside] == 0)


def test_distance_equals_brute_force_over_all_lesion_voxels(device, rng):
    """The nearest-candidate shortcut (distance transform, eight corners) against every lesion
    voxel, on an irregular lesion and anisotropic voxels: equal up to the sampling step."""
    shape = (30, 26, 20)
    mask = np.zeros(shape, bool)
    mask[8:12, 10:18, 5:9] = True
    mask[14:16, 4:7, 12:17] = True
    linear = np.diag([1.0, 1.25, 2.0])
    points, offsets = random_streamlines(rng, shape, 150)
    points = points.astype(np.float32).astype(np.float64)  # streamline points are float32
    got = tm.region_distance(points, offsets, mask, linear, step_mm=0.1, device=device)
    centres = np.argwhere(mask).astype(float)

    def brute(p):
        in_vox = centres - p
        mm = np.linalg.norm(in_vox @ linear.T, axis=1)
        vox = np.linalg.norm(in_vox, axis=1)
        own = np.floor(p + 0.5).astype(int)
        if np.all(own >= 0) and np.all(own < shape) and mask[tuple(own)]:
            return 0.0
        return (mm * (1 - 0.5 / np.maximum(vox, 0.5))).min()

    per_point = np.array([brute(p) for p in points])
    np.testing.assert_allclose(got.per_point, per_point, atol=1e-5)  # per point: stored as float32
    # along the streamlines: fine sampling of every segment, brute force at each sample
    for s in range(0, len(offsets) - 1, 10):
        line = points[offsets[s] : offsets[s + 1]]
        fine = [line[-1]] + [a + t * (b - a) for a, b in itertools.pairwise(line) for t in np.linspace(0, 1, 200)]
        expected = min(brute(p) for p in fine)  # within half its spacing above the true minimum
        fine_step = max((np.linalg.norm(np.diff(line, axis=0) @ linear.T, axis=1) / 199).max(initial=0), 0)
        assert expected - fine_step / 2 - 1e-9 <= got.per_streamline[s] <= expected + 0.05 + 1e-9


def test_distance_refuses_empty_lesions():
    tract = Tractogram.from_list([np.zeros((2, 3))], dimensions=(4, 4, 4))
    with pytest.raises(InputError, match="empty"):
        pipe.compute_lesion_distance(tract, np.zeros((4, 4, 4), bool), np.eye(4))


def test_distance_rows_count_streamlines_within_the_margin():
    row = pipe.distance_row("b", np.array([0.0, 3.0, 6.0, 10.0]), 5.0)
    assert (row.streamlines, row.min_mm, row.within_margin, row.percent_within) == (4, 0.0, 2, 50.0)


@pytest.mark.gpu
def test_gpu_endpoints_distances_and_profiles_equal_numpy(rng):
    labels = random_parcellation(rng, regions=8)
    points, offsets = random_streamlines(rng, labels.shape, 5000)
    linear = np.diag([1.0, 1.5, 2.0])
    cpu = conn.assign_endpoints(points, offsets, labels, linear, radius_mm=3.0, device="cpu")
    gpu = conn.assign_endpoints(points, offsets, labels, linear, radius_mm=3.0, device="gpu")
    np.testing.assert_array_equal(cpu.labels, gpu.labels)
    np.testing.assert_allclose(cpu.distances, gpu.distances, rtol=1e-12)
    mask = labels == 7
    d_cpu = tm.region_distance(points, offsets, mask, linear, device="cpu")
    d_gpu = tm.region_distance(points, offsets, mask, linear, device="gpu")
    np.testing.assert_allclose(d_gpu.per_point, d_cpu.per_point, atol=1e-5)  # float32 per point
    np.testing.assert_allclose(d_gpu.per_streamline, d_cpu.per_streamline, atol=1e-6)
    field = rng.uniform(0, 1, labels.shape).astype(np.float32)
    keep = np.diff(offsets) > 0
    p_cpu = tm.profile(points, offsets, field, 20, device="cpu")
    p_gpu = tm.profile(points, offsets, field, 20, device="gpu")
    assert keep.all()
    np.testing.assert_allclose(p_gpu.mean, p_cpu.mean, atol=1e-5)


# ------------------------------------------------------------------ command line


def test_cli_connectome_profile_and_distance_on_the_demo(demo_dir, tmp_path):
    matrix = tmp_path / "matrix.csv"
    out = run_cli("connectome", str(demo_dir / "bundles.trk"), "--labels", str(demo_dir / "parcellation.nii.gz"),
                  "--lut", str(demo_dir / "parcellation.txt"), "-o", str(matrix), "--json", "--device", "cpu")  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["edges"] == 5 and summary["streamlines_in_matrix"] == 65 and summary["assigned"] == 65
    assert summary["region_names"][:2] == ["crossing_lr_start", "crossing_lr_end"]
    table = np.loadtxt(matrix, delimiter=",", skiprows=1, usecols=range(1, 11))
    assert table.shape == (10, 10) and table[0, 1] == 13 and (table == table.T).all() and table.sum() == 130

    out = run_cli("connectome", str(demo_dir / "bundles.trk"), "--labels", str(demo_dir / "parcellation.nii.gz"),
                  "--weight", "cm", "-o", str(tmp_path / "cm.csv"))  # fmt: skip
    assert out.returncode == 2 and "no per-streamline 'cm'" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "cm.csv").exists()

    fa = tmp_path / "grad.nii.gz"
    img = nib.load(demo_dir / "mask.nii.gz")
    x = np.arange(img.shape[0], dtype=np.float32)
    nib.save(nib.Nifti1Image(np.broadcast_to(x[:, None, None], img.shape).copy(), img.affine), fa)
    profile = tmp_path / "profile.csv"
    out = run_cli("profile", str(demo_dir / "bundles.trk"), "--map", str(fa), "--points", "20", "-o", str(profile))
    assert out.returncode == 0, out.stderr
    rows = np.loadtxt(profile, delimiter=",", skiprows=1)
    assert rows.shape == (20, 8) and (rows[:, 4] == 65).all()

    out = run_cli("distance", str(demo_dir / "bundles.trk"), "--lesion", str(demo_dir / "lesion.nii.gz"),
                  "--margin", "5", "-o", str(tmp_path / "d.trk"), "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    from tractlens.app.io import load_tractogram

    tract = load_tractogram(tmp_path / "d.trk")
    per = tract.streamline_scalars[pipe.DISTANCE_STREAMLINE_SCALAR]
    assert summary["min_mm"] == pytest.approx(per.min(), abs=1e-4) and summary["within_margin"] == (per <= 5).sum()
    closest = tract.streamline_scalars["bundle"][np.argmin(per)]
    assert closest == 1  # the lesion sits beside crossing_lr
    assert 0 < summary["within_margin"] < 65


def test_cli_reports_bad_inputs_without_a_traceback(demo_dir, tmp_path):
    bad_lut = tmp_path / "lut.txt"
    bad_lut.write_text("one two\n")
    out = run_cli("connectome", str(demo_dir / "bundles.trk"), "--labels", str(demo_dir / "parcellation.nii.gz"),
                  "--lut", str(bad_lut), "-o", str(tmp_path / "m.csv"))  # fmt: skip
    assert out.returncode == 2 and "line 1 does not start with a label number" in out.stderr
    out = run_cli("connectome", str(demo_dir / "bundles.trk"), "--labels", str(demo_dir / "dwi.bval"),
                  "-o", str(tmp_path / "m.csv"))  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    empty = tmp_path / "empty.nii.gz"
    img = nib.load(demo_dir / "lesion.nii.gz")
    nib.save(nib.Nifti1Image(np.zeros(img.shape, np.uint8), img.affine), empty)
    out = run_cli("distance", str(demo_dir / "bundles.trk"), "--lesion", str(empty))
    assert out.returncode == 2 and "empty" in out.stderr
    out = run_cli("profile", str(demo_dir / "bundles.trk"), "--map", str(demo_dir / "dwi.nii.gz"), "-o",
                  str(tmp_path / "p.csv"))  # fmt: skip
    assert out.returncode == 2 and "3-D scalar image" in out.stderr
