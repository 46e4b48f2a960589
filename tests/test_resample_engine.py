"""The engine's resampler through a voxel map (gpu.resample) against SciPy's map_coordinates, the
reference it replaces, on the CPU (threads over slabs) and the GPU (CuPy, marked ``gpu``).

Tolerances: trilinear values within 1e-5 of SciPy's (relative to the data's range: float64
coordinates on both sides, summed in another order); nearest labels equal except where a
coordinate falls on a rounding tie (at most 1 voxel in 10,000)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy import ndimage

from tractlens.gpu.resample import resample_volume


def _case(seed: int = 0, with_field: bool = True):
    rng = np.random.default_rng(seed)
    data = ndimage.gaussian_filter(rng.normal(size=(23, 19, 17)), 1.5).astype(np.float32)
    labels = rng.integers(0, 9, size=data.shape).astype(np.int16)
    out_shape = (21, 25, 14)
    rotation = np.linalg.qr(rng.normal(size=(3, 3)))[0] * 0.9
    linear = np.eye(4)
    linear[:3, :3] = rotation  # about the grids' centres, so most output voxels land inside the data
    linear[:3, 3] = (np.array(data.shape) - 1) / 2 - rotation @ ((np.array(out_shape) - 1) / 2) + [1.0, -1.5, 0.5]
    field = at = step = None
    if with_field:
        field = (2.5 * ndimage.gaussian_filter(rng.normal(size=(11, 12, 9, 3)), (2, 2, 2, 0))).astype(np.float32)
        field /= np.abs(field).max() / 2.0  # up to 2 mm
        at = np.diag([0.5, 0.45, 0.6, 1.0])
        at[:3, 3] = [-0.3, 0.2, 0.1]  # part of the output maps outside the field: it reads 0 there
        step = np.array([[0.9, 0.1, 0.0], [0.0, 1.1, 0.0], [0.05, 0.0, 0.8]])
    return data, labels, out_shape, linear, field, at, step


def _scipy(data, out_shape, linear, field, at, step, order, cval=0.0):
    """The reference: every output voxel's source coordinates in float64, then map_coordinates."""
    ijk = np.stack(np.meshgrid(*[np.arange(n, dtype=np.float64) for n in out_shape], indexing="ij"), 0).reshape(3, -1)
    src = linear[:3, :3] @ ijk + linear[:3, 3:4]
    if field is not None:
        where = at[:3, :3] @ ijk + at[:3, 3:4]
        w = np.stack(
            [ndimage.map_coordinates(field[..., c], where, order=1, mode="constant", cval=0.0) for c in range(3)]
        )
        src = src + step @ w
    values = ndimage.map_coordinates(data, src, order=order, mode="constant", cval=cval, prefilter=False)
    return values.reshape(out_shape)


@pytest.fixture(params=["compiled", "arrays"])
def cpu_engine(request, monkeypatch):
    """The CPU path with numba's compiled loop, and the NumPy array path it falls back on."""
    import tractlens.gpu.resample as engine

    if request.param == "arrays":
        monkeypatch.setattr(engine, "numba_module", lambda: None)
    elif engine.numba_module() is None:
        pytest.fail("numba (the cpu extra, in the test extra) is not installed")
    else:  # the test volumes are small: the loop would not be started for them (_compiled_pays)
        monkeypatch.setattr(engine, "COMPILED_START_SAMPLES", {0: 0, 1: 0})
    return request.param


@pytest.mark.parametrize("with_field", [False, True])
def test_trilinear_and_nearest_match_scipy(device, with_field, cpu_engine):
    data, labels, out_shape, linear, field, at, step = _case(1, with_field)
    ref = _scipy(data, out_shape, linear, field, at, step, 1)
    got = resample_volume(data, out_shape, linear, field, at, step, order=1, device=device, threads=3)
    assert got.dtype == np.float32 and got.shape == out_shape
    span = float(data.max() - data.min())
    assert np.abs(got - ref).max() <= 1e-5 * span
    assert (ref == 0).mean() > 0.05  # the case reaches outside the source: the edge rule is tested
    ref_labels = _scipy(labels, out_shape, linear, field, at, step, 0)
    got_labels = resample_volume(labels, out_shape, linear, field, at, step, order=0, device=device, threads=3)
    assert got_labels.dtype == np.int16
    assert (got_labels != ref_labels).mean() <= 1e-4


def test_channels_of_a_4d_image_are_resampled_alike(device, cpu_engine):
    data, _, out_shape, linear, field, at, step = _case(2)
    stack = np.stack([data, 2 * data, -data], -1)
    got = resample_volume(stack, out_shape, linear, field, at, step, order=1, device=device)
    one = resample_volume(data, out_shape, linear, field, at, step, order=1, device=device)
    assert got.shape == (*out_shape, 3)
    np.testing.assert_allclose(got[..., 1], 2 * one, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[..., 2], -one, rtol=1e-6, atol=1e-6)


def test_one_thread_and_many_give_the_same_bits(cpu_engine):
    data, _, out_shape, linear, field, at, step = _case(3)
    one = resample_volume(data, out_shape, linear, field, at, step, threads=1)
    many = resample_volume(data, out_shape, linear, field, at, step, threads=4)
    np.testing.assert_array_equal(one, many)


@pytest.mark.gpu
def test_the_gpu_gives_the_cpu_values():
    """CuPy against NumPy: the same float64 coordinates, trilinear within 1e-6 of the range
    (fused multiply-adds), nearest labels equal except on rounding ties (≤ 1 in 10,000)."""
    data, labels, out_shape, linear, field, at, step = _case(4)
    cpu = resample_volume(data, out_shape, linear, field, at, step, order=1, device="cpu")
    gpu = resample_volume(data, out_shape, linear, field, at, step, order=1, device="gpu")
    assert np.abs(cpu - gpu).max() <= 1e-6 * float(data.max() - data.min())
    cpu_l = resample_volume(labels, out_shape, linear, field, at, step, order=0, device="cpu")
    gpu_l = resample_volume(labels, out_shape, linear, field, at, step, order=0, device="gpu")
    assert (cpu_l != gpu_l).mean() <= 1e-4


def _both_paths(monkeypatch, *args, **kw):
    """The compiled loop's result and the NumPy path's, for the same call of resample_volume."""
    import tractlens.gpu.resample as engine

    if engine.numba_module() is None:
        pytest.fail("numba (the cpu extra, in the test extra) is not installed")
    with monkeypatch.context() as patch:
        patch.setattr(engine, "COMPILED_START_SAMPLES", {0: 0, 1: 0})
        compiled = resample_volume(*args, **kw)
    with monkeypatch.context() as patch:
        patch.setattr(engine, "numba_module", lambda: None)
        arrays = resample_volume(*args, **kw)
    return compiled, arrays


@pytest.mark.parametrize("order", [0, 1])
@pytest.mark.parametrize("with_field", [False, True])
@pytest.mark.parametrize("channels", [1, 3])
def test_the_numpy_path_gives_the_compiled_loop_s_bits(monkeypatch, order, with_field, channels):
    """The two CPU paths do the same float64 arithmetic in the same order: labels and trilinear
    values alike, bit for bit (a label image may be drawn by either, by size and threads)."""
    data, labels, out_shape, linear, field, at, step = _case(6, with_field)
    source = labels if order == 0 else data
    if channels > 1:
        source = np.stack([source, source[::-1], 2 * source], -1)
        if field is not None:  # a float64 field: both paths read it as float32
            field = field.astype(np.float64) + 1e-9
    compiled, arrays = _both_paths(
        monkeypatch, source, out_shape, linear, field, at, step, order=order, threads=2, cval=-3
    )
    assert compiled.dtype == arrays.dtype and compiled.shape == arrays.shape
    assert (compiled == -3).any() and (compiled != -3).any()  # both edges of the source are crossed
    np.testing.assert_array_equal(compiled.view(np.uint8), arrays.view(np.uint8))


def test_nearest_rounds_ties_half_up_on_both_paths(monkeypatch):
    """A shift of exactly half a voxel puts every coordinate on a tie: both paths take the upper
    voxel (floor(x + 0.5)), as SciPy's map_coordinates does, and read cval past the last voxel's centre."""
    labels = np.arange(6 * 5 * 4, dtype=np.int32).reshape(6, 5, 4)
    linear = np.eye(4)
    linear[:3, 3] = [0.5, -0.5, 0.0]
    for got in _both_paths(monkeypatch, labels, labels.shape, linear, order=0, cval=-1, threads=2):
        np.testing.assert_array_equal(got[:-1, 1:], labels[1:, 1:])  # i + 0.5 -> voxel i + 1, j - 0.5 -> voxel j
        assert (got[-1] == -1).all() and (got[:, 0] == -1).all()  # 5.5 > 5 and -0.5 < 0: outside


def test_voxels_the_field_brings_back_inside_are_sampled(monkeypatch):
    """The NumPy path skips the voxels that land outside whatever the field says (farther than its
    largest displacement): a shift of -2 voxels undone by a field of +2 mm must give every label back,
    the edge voxels included, on both paths."""
    labels = np.arange(9 * 7 * 6, dtype=np.int32).reshape(9, 7, 6)
    linear = np.eye(4)
    linear[0, 3] = -2.0  # the affine alone puts planes 0 and 1 outside
    field = np.zeros((9, 7, 6, 3), np.float32)
    field[..., 0] = 2.0
    for got in _both_paths(monkeypatch, labels, labels.shape, linear, field, np.eye(4), np.eye(3), order=0, cval=-1):
        np.testing.assert_array_equal(got, labels)
    field[..., 0] = 1.0  # now planes 0 lands at -1: outside, and the rest one plane lower
    for got in _both_paths(monkeypatch, labels, labels.shape, linear, field, np.eye(4), np.eye(3), order=0, cval=-1):
        assert (got[0] == -1).all()
        np.testing.assert_array_equal(got[1:], labels[:-1])


def test_cancelled_stops_between_slabs(cpu_engine):
    from tractlens.gpu.backend import Cancelled

    data, _, out_shape, linear, field, at, step = _case(5)
    with pytest.raises(Cancelled):
        resample_volume(data, out_shape, linear, field, at, step, cancelled=lambda: True, threads=2)


def test_a_field_with_nan_gives_the_fill_value_there(device, cpu_engine):
    """A damaged field (NaN) must not read outside the data: the voxels whose displacement is NaN get
    cval, the others SciPy's values."""
    data, labels, out_shape, linear, field, at, step = _case(7)
    field = field.copy()
    field[3:6, 3:6, 3:6] = np.nan
    got = resample_volume(data, out_shape, linear, field, at, step, order=1, device=device, cval=-1.0)
    got_labels = resample_volume(labels, out_shape, linear, field, at, step, order=0, device=device, cval=-1)
    ijk = np.stack(np.meshgrid(*[np.arange(n, dtype=np.float64) for n in out_shape], indexing="ij"), 0).reshape(3, -1)
    where = at[:3, :3] @ ijk + at[:3, 3:4]
    w = np.stack([ndimage.map_coordinates(field[..., c], where, order=1, mode="constant", cval=0.0) for c in range(3)])
    touched = np.isnan(w).any(0).reshape(out_shape)
    assert touched.any() and not touched.all()
    assert (got[touched] == -1.0).all() and (got_labels[touched] == -1).all()
    ref = _scipy(data, out_shape, linear, np.nan_to_num(field), at, step, 1, cval=-1.0)
    assert np.abs(got[~touched] - ref[~touched]).max() <= 1e-5 * float(data.max() - data.min())


def test_the_compiled_loop_is_started_only_where_it_pays(monkeypatch):
    """numba's start (import, loop from its cache, CPU target: 0.5-1.35 s) is paid only for more than
    COMPILED_START_SAMPLES samples a thread (at most NUMPY_THREADS counted), or when the loop is
    already loaded; a 1 mm atlas (labels) never starts it."""
    import tractlens.gpu.resample as engine

    if engine.numba_module() is None:
        pytest.fail("numba (the cpu extra, in the test extra) is not installed")
    loops = f"{engine.__package__}.resample_loops"
    monkeypatch.delitem(sys.modules, loops, raising=False)
    brain = 182 * 218 * 182
    for threads in (1, 2, 16):
        assert not engine._compiled_pays(brain, threads, 0)  # a 1 mm atlas: NumPy on any machine
        assert not engine._compiled_pays(brain, threads, 1)  # a 1 mm T1: NumPy too
    nearest, trilinear = engine.COMPILED_START_SAMPLES[0], engine.COMPILED_START_SAMPLES[1]
    assert engine._compiled_pays(trilinear * 2, 2, 1) and not engine._compiled_pays(trilinear * 2 - 1, 2, 1)
    assert engine._compiled_pays(nearest * 4, 4, 0) and not engine._compiled_pays(nearest * 4 - 1, 4, 0)
    cap = engine.NUMPY_THREADS
    assert engine._compiled_pays(trilinear * cap, 64, 1)  # threads past NUMPY_THREADS are not counted
    monkeypatch.setitem(sys.modules, loops, object())
    assert engine._compiled_pays(10, 16, 0)  # loaded already: always
    monkeypatch.setattr(engine, "numba_module", lambda: None)
    assert not engine._compiled_pays(trilinear * 100, 1, 1)  # without numba: never


def test_a_small_volume_and_a_label_image_do_not_start_numba():
    code = (
        "import sys, numpy as np\n"
        "from tractlens.gpu.resample import resample_volume\n"
        "out = resample_volume(np.ones((8, 8, 8), np.float32), (20, 20, 20), np.eye(4) * 0.4, threads=2)\n"
        "labels = resample_volume(np.ones((8, 8, 8), np.int16), (160, 160, 120), np.eye(4) * 0.04, order=0)\n"
        "print('numba' in sys.modules, float(out[0, 0, 0]), int(labels[-1, -1, -1]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "1.0", "1"]


def test_auto_takes_the_cpu_unless_cupy_already_runs(monkeypatch):
    """A fresh command resamples on the CPU whether numba is installed or not (NumPy draws as fast as
    CuPy starts); a process where CuPy already runs (the window) keeps the GPU."""
    import tractlens.gpu.resample as engine

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(engine, "numba_module", lambda: None)
    assert engine.resolve_device("auto").name == "cpu"
    assert engine.resolve_device("cpu").name == "cpu"
