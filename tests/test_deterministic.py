"""Deterministic tensor tracking (gpu.deterministic): geometry, every stopping rule, engines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tractlens.gpu import sym3
from tractlens.gpu.deterministic import DeterministicParams, track_all
from tractlens.gpu.seeding import seeds_in_mask
from tractlens.gpu.streamlines import (
    LOW_FA,
    MAX_LENGTH,
    OUTSIDE_MASK,
    OUTSIDE_VOLUME,
    SHARP_ANGLE,
    STOP_REGION,
)

LAMBDAS = (1.7e-3, 3e-4, 3e-4)
VOXEL = (2.0, 2.0, 2.0)


def tensor_along(directions: np.ndarray, lambdas=LAMBDAS) -> np.ndarray:
    """Prolate tensors with main axis ``directions`` (..., 3) (unit)."""
    d = directions / np.linalg.norm(directions, axis=-1, keepdims=True)
    l1, l2, _ = lambdas
    matrix = l2 * np.eye(3) + (l1 - l2) * d[..., :, None] * d[..., None, :]
    return sym3.from_matrix(np, matrix)


def straight_field(shape=(40, 20, 10), axis=0) -> np.ndarray:
    direction = np.zeros(3)
    direction[axis] = 1.0
    return np.broadcast_to(tensor_along(direction), (*shape, 6)).copy()


def isotropic(shape) -> np.ndarray:
    t = np.zeros((*shape, 6))
    t[..., 0] = t[..., 3] = t[..., 5] = 7e-4
    return t


def run(field, seeds, device, **params):
    params.setdefault("min_length_mm", 0.0)
    kwargs = {k: params.pop(k) for k in ("mask", "stop", "voxel_size") if k in params}
    kwargs.setdefault("voxel_size", VOXEL)
    return track_all(field, np.asarray(seeds, float), DeterministicParams(**params), device=device, **kwargs)


def test_straight_bundle_is_followed_from_edge_to_edge(device):
    out = run(straight_field(), [[20.1, 10.0, 5.0], [7.3, 4.2, 2.6]], device)
    assert len(out) == 2
    for i, seed in enumerate([[20.1, 10.0, 5.0], [7.3, 4.2, 2.6]]):
        line = out[i]
        np.testing.assert_allclose(line[:, 1:], np.broadcast_to(seed[1:], (len(line), 2)), atol=1e-5)
        steps = np.diff(line[:, 0])
        np.testing.assert_allclose(steps, 0.25, atol=1e-5)  # 0.5 mm in 2 mm voxels
        assert line[0, 0] < -0.25 and line[-1, 0] > 39.25  # both ends reach the volume's border
        np.testing.assert_allclose(line[out.seed_point[i]], seed, atol=1e-6)
    assert (out.stop == OUTSIDE_VOLUME).all()


def test_anisotropic_voxels_keep_steps_in_millimetres(device):
    field = straight_field((20, 20, 20), axis=2)
    out = run(field, [[10.0, 10.0, 10.0]], device, voxel_size=(1.0, 1.0, 2.5))
    np.testing.assert_allclose(np.diff(out[0][:, 2]), 0.5 / 2.5, atol=1e-5)


def circle_field(shape=(40, 40, 5), centre=(19.5, 19.5), radii=(8.0, 16.0)) -> np.ndarray:
    x, y = np.meshgrid(np.arange(shape[0]) - centre[0], np.arange(shape[1]) - centre[1], indexing="ij")
    tangent = np.stack([-y, x, np.zeros_like(x)], -1)
    field = tensor_along(tangent + 1e-12)
    r = np.hypot(x, y)
    field[(r < radii[0]) | (r > radii[1])] = isotropic((1,))[0]
    return np.broadcast_to(field[:, :, None], (*shape, 6)).copy()


@pytest.mark.parametrize(("integrator", "tolerance"), [("rk4", 0.03), ("euler", 0.6)])
def test_circular_bundle_is_followed_around(device, integrator, tolerance):
    radius = 12.0
    seed = [19.5 + radius, 19.5, 2.0]
    # Three quarters of the circle in all (the length budget ends it).
    length_mm = 0.75 * 2 * math.pi * radius * VOXEL[0]
    out = run(circle_field(), [seed], device, integrator=integrator, max_length_mm=length_mm, max_angle_deg=30)
    line = out[0]
    r = np.hypot(line[:, 0] - 19.5, line[:, 1] - 19.5)
    assert np.abs(r - radius).max() < tolerance, (integrator, np.abs(r - radius).max())
    angles = np.unwrap(np.arctan2(line[:, 1] - 19.5, line[:, 0] - 19.5))
    # The arc covers the angle its length subtends (Euler spirals outward a little).
    assert angles.max() - angles.min() == pytest.approx(0.25 * (len(line) - 1) / r.mean(), rel=0.01)
    assert angles.max() - angles.min() > 0.95 * 1.5 * math.pi
    assert (out.stop == MAX_LENGTH).any()


def test_fa_threshold_stops_where_anisotropy_ends(device):
    field = straight_field()
    field[25:] = isotropic(field[25:].shape[:3])
    out = run(field, [[10.0, 10.0, 5.0]], device)
    line = out[0]
    assert out.stop[0, 1] == LOW_FA and out.stop[0, 0] == OUTSIDE_VOLUME
    assert 24.5 < line[-1, 0] <= 25.0  # FA of the blend falls below 0.15 only close to voxel 25
    fa_last = _fa_at(field, line[-1])
    fa_before = _fa_at(field, line[-2])
    assert fa_last < 0.15 <= fa_before


def _fa_at(field, point):
    from tractlens.gpu.interpolate import trilinear

    tensor = trilinear(np, field, np.asarray(point, float)[None])
    return float(sym3.fractional_anisotropy_from_invariants(np, tensor)[0])


def turning_field() -> np.ndarray:
    """Fibres along x that turn to y between x = 15 and x = 25 (about 2.3° per 0.5 mm step)."""
    theta = np.clip((np.arange(40) - 15) / 10, 0, 1) * np.pi / 2
    directions = np.stack([np.cos(theta), np.sin(theta), np.zeros(40)], -1)
    return np.broadcast_to(tensor_along(directions)[:, None, None], (40, 40, 6, 6)).copy()


def test_angle_threshold_stops_at_a_turn_sharper_than_allowed(device):
    seed = [10.0, 10.0, 3.0]
    sharp = run(turning_field(), [seed], device, max_angle_deg=1.5)
    assert sharp.stop[0, 1] == SHARP_ANGLE
    assert 14.5 < sharp[0][-1, 0] < 17.0
    wide = run(turning_field(), [seed], device, max_angle_deg=5)
    end = wide[0][-1]
    assert wide.stop[0, 1] == OUTSIDE_VOLUME
    assert end[1] > 39.0 and 15.0 < end[0] < 25.0  # turned and ran along y to the border


def test_mask_and_stop_region_end_streamlines(device):
    field = straight_field()
    mask = np.ones(field.shape[:3], bool)
    mask[30:] = False
    stop = np.zeros_like(mask)
    stop[5:7] = True
    out = run(field, [[15.0, 10.0, 5.0]], device, mask=mask, stop=stop)
    line = out[0]
    assert tuple(out.stop[0]) == (STOP_REGION, OUTSIDE_MASK)
    assert 29.0 <= line[-1, 0] < 29.5  # last point inside the mask's last voxel
    assert 5.5 <= line[0, 0] < 6.5  # first point inside the stop region (voxel 6 nearest)


def test_max_length_truncates_or_discards(device):
    seed = [[20.0, 10.0, 5.0]]
    out = run(straight_field(), seed, device, max_length_mm=10.0)
    assert len(out[0]) == 21  # 10 mm / 0.5 mm steps + the seed
    assert tuple(out.stop[0]) == (MAX_LENGTH, MAX_LENGTH)  # forward used the whole budget
    assert len(run(straight_field(), seed, device, max_length_mm=10.0, keep_truncated=False)) == 0


def test_min_length_filter(device):
    field = straight_field()
    field[25:] = isotropic(field[25:].shape[:3])
    kept = run(field, [[20.0, 10.0, 5.0]], device, min_length_mm=40.0)
    assert len(kept) == 1
    assert len(run(field, [[20.0, 10.0, 5.0]], device, min_length_mm=60.0)) == 0


def test_seeds_outside_volume_mask_or_low_fa_give_no_streamline(device):
    field = straight_field()
    mask = np.ones(field.shape[:3], bool)
    mask[:5] = False
    field[35:] = isotropic(field[35:].shape[:3])
    seeds = [[-3.0, 10.0, 5.0], [2.0, 10.0, 5.0], [37.0, 10.0, 5.0], [20.0, 10.0, 5.0]]
    out = run(field, seeds, device, mask=mask, min_length_mm=1.0)
    assert list(out.seed_index) == [3]


def test_nan_tensors_stop_tracking_like_empty_voxels(device):
    field = straight_field()
    field[30, :, :, 0] = np.nan
    out = run(field, [[10.0, 10.0, 5.0]], device)
    assert out.stop[0, 1] == LOW_FA
    assert 29.5 < out[0][-1, 0] <= 30.0  # a zeroed tensor scales the blend (same FA) until its centre
    assert any("NaN" in note for note in _notes(field))


def _notes(field):
    from tractlens.gpu.deterministic import prepare_field

    return prepare_field(field, VOXEL).notes


def crossing_field(shape=(40, 20, 6)) -> np.ndarray:
    """x-aligned fibres with a band where the tensor is oblate in the xy-plane, slightly
    favouring y: the eigenvector turns there, a tensorline goes straight through."""
    field = straight_field(shape)
    oblate = sym3.from_matrix(np, np.diag([1.0e-3, 1.02e-3, 2e-4]))
    field[18:22] = oblate
    return field


def test_tensorlines_pass_a_crossing_the_eigenvector_turns_at(device):
    seed = [[8.0, 10.0, 3.0]]
    eig = run(crossing_field(), seed, device, max_angle_deg=30, fa_threshold=0.1)
    tl = run(crossing_field(), seed, device, max_angle_deg=30, fa_threshold=0.1, method="tensorline")
    assert eig.stop[0, 1] == SHARP_ANGLE
    assert tl.stop[0, 1] == OUTSIDE_VOLUME and tl[0][-1, 0] > 39.0
    assert np.abs(tl[0][:, 1] - 10.0).max() < 1.0, np.abs(tl[0][:, 1] - 10.0).max()


def test_tensorline_equals_eigenvector_in_a_straight_field(device):
    seeds = [[20.0, 10.0, 5.0]]
    a = run(straight_field(), seeds, device)
    b = run(straight_field(), seeds, device, method="tensorline", tensorline_puncture=0.7)
    np.testing.assert_allclose(a.points, b.points, atol=1e-5)


@pytest.mark.parametrize(
    "bad",
    [
        {"step_mm": 0},
        {"fa_threshold": 1.2},
        {"max_angle_deg": 0},
        {"min_length_mm": 300},
        {"integrator": "rk2"},
        {"method": "fod"},
        {"max_length_mm": 0.1},
    ],
)
def test_bad_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        DeterministicParams(**bad)


# ------------------------------------------------------------------------ seeding
def test_seeds_per_voxel_random_and_grid():
    mask = np.zeros((5, 5, 5), bool)
    mask[1, 2, 3] = mask[4, 0, 0] = True
    random = seeds_in_mask(mask, 5, rng_seed=3)
    assert random.shape == (10, 3)
    np.testing.assert_array_equal(np.floor(random[:5] + 0.5), np.broadcast_to([1, 2, 3], (5, 3)))
    np.testing.assert_array_equal(random, seeds_in_mask(mask, 5, rng_seed=3))
    assert not np.array_equal(random, seeds_in_mask(mask, 5, rng_seed=4))
    grid = seeds_in_mask(mask, 8, placement="grid")
    np.testing.assert_allclose(np.unique(grid[:8, 0]), [0.75, 1.25])
    with pytest.raises(ValueError, match="not a cube"):
        seeds_in_mask(mask, 6, placement="grid")


def test_principal_eigenvector_matches_the_full_solver():
    rng = np.random.default_rng(7)
    matrices = rng.normal(size=(500, 3, 3))
    tensors = sym3.from_matrix(np, matrices @ matrices.transpose(0, 2, 1))
    prolate = tensor_along(rng.normal(size=(200, 3)))
    oblate = sym3.from_matrix(np, np.diag([1.0, 1.0 - 1e-9, 0.1]))[None]
    for t in (tensors, prolate, oblate):
        (l1, l2, l3), e1 = sym3.principal(np, t)
        evals, _evecs = sym3.eigh(np, t)
        np.testing.assert_allclose(np.stack([l1, l2, l3], -1), evals, rtol=1e-10, atol=1e-14)
        e1 = np.stack(e1, -1)
        residual = np.einsum("nij,nj->ni", sym3.to_matrix(np, t), e1) - evals[:, :1] * e1
        assert np.abs(residual).max() < 1e-8 * np.abs(evals).max()
        np.testing.assert_allclose(np.linalg.norm(e1, axis=1), 1.0, atol=1e-12)


# ------------------------------------------------------------------------ engines
def demo_tensor_field(demo_dir):
    from tractlens.app.pipelines.track import load_tensor_field

    return load_tensor_field(dwi=demo_dir / "dwi.nii.gz", device="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "options",
    [{}, {"integrator": "rk4"}, {"method": "tensorline"}, {"integrator": "rk4", "method": "tensorline"}],
    ids=["euler", "rk4", "tensorline", "tensorline-rk4"],
)
def test_kernel_reproduces_the_numpy_reference(demo_dir, options):
    """GPU float32 kernel vs NumPy float64 reference, same seeds: the same streamlines
    within 1e-3 voxel. A stopping decision can flip where a value sits on its threshold
    within float32 rounding; such streamlines are counted, must be rare, and still agree
    on their common part."""
    field = demo_tensor_field(demo_dir)
    seeds = seeds_in_mask(field.mask & (field.fa > 0.15), 1, rng_seed=11)
    params = DeterministicParams(min_length_mm=0, **options)
    kwargs = {"voxel_size": field.voxel_size, "mask": field.mask}
    ref = track_all(field.tensor, seeds, params, device="cpu", **kwargs)
    gpu = track_all(field.tensor, seeds, params, device="gpu", engine="kernel", **kwargs)
    arrays = track_all(field.tensor, seeds, params, device="gpu", engine="arrays", **kwargs)
    for other in (gpu, arrays):
        np.testing.assert_array_equal(ref.seed_index, other.seed_index)
        same_length = ref.counts == other.counts
        assert same_length.mean() > 0.995, same_length.mean()
        worst = 0.0
        for i in range(len(ref)):
            a, b = ref[i], other[i]
            if same_length[i]:
                worst = max(worst, float(np.abs(a - b).max()))
            else:  # align on the seed and compare the common part
                sa, sb = ref.seed_point[i], other.seed_point[i]
                back = min(sa, sb)
                fwd = min(len(a) - sa, len(b) - sb)
                worst = max(worst, float(np.abs(a[sa - back : sa + fwd] - b[sb - back : sb + fwd]).max()))
        assert worst < 1e-3, worst
        print(
            f"{options}: {len(ref)} streamlines, {same_length.mean():.4%} same length, max difference {worst:.2e} voxel"
        )


def test_streamlines_seeded_in_a_demo_bundle_stay_in_it(demo_dir):
    """Single-fibre bundles of the phantom (arc, kissing pair): report the fraction of
    streamline points inside the seeded bundle (labels dilated by one voxel)."""
    import nibabel as nib
    from scipy import ndimage

    from tractlens.app.pipelines.track import deterministic_pipeline

    field = demo_tensor_field(demo_dir)
    labels = np.asarray(nib.load(demo_dir / "labels.nii.gz").dataobj)
    names = {"arc": 3, "kissing_lower": 4, "kissing_upper": 5}
    for name, label in names.items():
        seed = np.asarray(nib.load(demo_dir / f"roi_{name}_seed.nii.gz").dataobj) > 0
        result = deterministic_pipeline(
            field,
            seed_mask=seed,
            params=DeterministicParams(integrator="rk4", min_length_mm=10),
            seeds_per_voxel=4,
            device="cpu",
        )
        points = result.tractogram.points
        own = ndimage.binary_dilation(labels == label)
        index = np.clip(np.floor(points + 0.5).astype(int), 0, np.array(labels.shape) - 1)
        fraction = own[tuple(index.T)].mean()
        print(f"{name}: {len(result.tractogram)} streamlines, {fraction:.1%} of points in the bundle")
        assert len(result.tractogram) >= 0.9 * 4 * seed.sum()
        assert fraction > 0.95, (name, fraction)


def test_tensor_field_notes_nan_and_non_positive_definite_voxels():
    from tractlens.app.pipelines.track import TensorField

    tensor = straight_field((10, 10, 4))
    tensor[1, 1, 1] = np.nan
    tensor[2, 2, 2] = sym3.from_matrix(np, np.diag([1e-3, 2e-4, -1e-4]))
    field = TensorField.from_tensor(tensor, np.diag([2.0, 2.0, 2.0, 1.0]), "test")
    assert any("1 voxels have NaN" in note for note in field.notes)
    assert any("1 voxels have tensors that are not positive definite" in note for note in field.notes)
    assert not field.mask[1, 1, 1] and field.mask[2, 2, 2]
    assert np.isfinite(field.fa).all() and (field.fa <= 1).all()
    np.testing.assert_allclose(field.voxel_size, 2.0)


# The CUDA source compiled for the host (a loop over threads; CUDA's intrinsics as plain
# functions: the shims of test_fod_tracking), so the kernel's steps are checked without a GPU.
HOST_DRIVER = """
extern "C" void run_all(const float4* field, const unsigned char* region, int nx, int ny, int nz,
    const double* seeds, int n, double hx, double hy, double hz, double fa_threshold, double cos_max, int m, int rk4,
    int tensorline, double puncture, float* buf, int* count, unsigned char* stop, unsigned char* valid) {
    blockDim.x = 1;
    for (int i = 0; i < n; ++i) {
        blockIdx.x = i;
        track_deterministic(field, region, nx, ny, nz, seeds, n, hx, hy, hz, fa_threshold, cos_max, m, rk4,
                            tensorline, puncture, buf, count, stop, valid);
    }
}
"""


@pytest.fixture(scope="module")
def kernel_on_the_host(tmp_path_factory):
    """kernels/deterministic.cu (with its headers) built by g++ as a shared library."""
    import ctypes
    import shutil
    import subprocess

    from tests.test_fod_tracking import HOST_SHIMS
    from tractlens.gpu import cuda, deterministic

    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed: the kernel's host build needs it")
    source = cuda.source("deterministic.cu", deterministic.KERNEL_HEADERS)
    first, _, rest = source.partition("\n")
    rest = rest.replace('extern "C" __global__ void track_deterministic', "void track_deterministic")
    folder = tmp_path_factory.mktemp("deterministic_kernel")
    (folder / "host.cpp").write_text(first + "\n" + HOST_SHIMS + rest + HOST_DRIVER)
    defines = [f"-D{k}={v}" for k, v in deterministic.KERNEL_DEFINES]
    subprocess.run(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", "-w", *defines, str(folder / "host.cpp"),
                    "-o", str(folder / "libdet.so")], check=True)  # fmt: skip
    return ctypes.CDLL(str(folder / "libdet.so"))


def _run_on_the_host(lib, field, seeds, params):
    """What ``deterministic._track_kernel`` launches (the same arguments), run by the host build,
    then compacted as the engine does."""
    import ctypes
    import math

    from tractlens.gpu.tracking import compact

    n, m = len(seeds), params.max_steps
    buf = np.zeros((n, 2 * m + 1, 3), np.float32)
    count, stop, valid = np.zeros((n, 2), np.int32), np.zeros((n, 2), np.uint8), np.zeros(n, np.uint8)
    arrays = [np.ascontiguousarray(a) for a in (field.tensor8, field.region, np.asarray(seeds, np.float64))]
    h = params.step_mm / field.voxel_size
    pointer = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    d, i = ctypes.c_double, ctypes.c_int
    lib.run_all(
        pointer(arrays[0]), pointer(arrays[1]), *(i(s) for s in field.region.shape), pointer(arrays[2]), i(n),
        *(d(x) for x in h), d(params.fa_threshold), d(math.cos(math.radians(params.max_angle_deg))), i(m),
        i(params.integrator == "rk4"), i(params.method == "tensorline"), d(params.tensorline_puncture),
        pointer(buf), pointer(count), pointer(stop), pointer(valid),
    )  # fmt: skip
    return compact(np, buf, count, stop, valid.astype(bool), 0, params)


@pytest.mark.parametrize(
    "options",
    [{}, {"integrator": "rk4"}, {"method": "tensorline"}, {"integrator": "rk4", "method": "tensorline"}],
    ids=["euler", "rk4", "tensorline", "tensorline-rk4"],
)
def test_kernel_source_built_for_the_host_reproduces_the_reference(kernel_on_the_host, options):
    """The CUDA source's steps (in double, as on the GPU) against the NumPy reference on the
    circular bundle with a stop slab and a mask edge: the same streamlines, stop
    codes and seeds, points within 1e-5 voxel."""
    from tractlens.gpu.deterministic import prepare_field

    tensor = np.concatenate([circle_field(), circle_field()[:, :, :1]], axis=2)
    mask = np.ones(tensor.shape[:3], bool)
    mask[:, :8] = False
    stop = np.zeros(tensor.shape[:3], bool)
    stop[30:32] = True
    field = prepare_field(tensor, (1.0, 1.2, 1.5), mask=mask, stop=stop)
    seeds = np.random.default_rng(4).uniform([0, 0, 0], [39, 39, 5], size=(300, 3))
    params = DeterministicParams(min_length_mm=0, step_mm=0.4, max_length_mm=40.0, **options)
    host = _run_on_the_host(kernel_on_the_host, field, seeds, params)
    ref = track_all(field, seeds, params, device="cpu", engine="arrays")
    assert len(ref) > 150 and len(set(ref.stop.ravel().tolist())) >= 3  # several ways to end occur
    np.testing.assert_array_equal(host.seed_index, ref.seed_index)
    np.testing.assert_array_equal(host.counts, ref.counts)
    np.testing.assert_array_equal(host.stop, ref.stop)
    np.testing.assert_allclose(host.points, ref.points, atol=1e-5)
