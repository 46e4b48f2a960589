"""An fODF volume summarised where it is tracked (gpu.fod_tracking.summarise, largest_amplitudes,
FodVolume.from_sh with a device) and large device → host copies (gpu.transfer): the same
mask, generalized FA, seed amplitudes, streamlines and bytes as the host path."""

from __future__ import annotations

import numpy as np
import pytest

from tractlens.app.pipelines import track_fod
from tractlens.app.pipelines.track_fod import FodVolume, fod_tracking_pipeline
from tractlens.gpu import fod_tracking, transfer
from tractlens.gpu.fod_params import FodDeterministicParams, FodProbabilisticParams

from .test_fod_tracking import crossing_phantom

AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])
DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def dirty_phantom():
    """The crossing phantom with empty voxels, NaN and infinite coefficients."""
    fod, in_a, in_b = crossing_phantom(90.0, shape=(40, 40, 3))
    fod = fod.copy()
    fod[0, 0, 0, 3] = np.nan
    fod[5, 30, 1, 0] = np.inf
    return fod, in_a, in_b


@pytest.mark.parametrize("device", DEVICES)
def test_the_summary_is_the_host_volumes_mask_and_generalized_fa(device):
    fod, _, _ = dirty_phantom()
    host = FodVolume.from_sh(fod, AFFINE, "host", device="cpu")
    summary = fod_tracking.summarise(fod, device, chunk=1000)  # several chunks
    np.testing.assert_array_equal(summary.mask, host.mask)
    np.testing.assert_allclose(summary.gfa, host.fa, rtol=0, atol=2e-7)  # float64 sums in another order
    assert summary.nonfinite == 2
    if device == "gpu":
        np.testing.assert_array_equal(summary.coefficients.get(), host.sh)  # the cleaned coefficients
    else:
        assert summary.coefficients is None


@pytest.mark.parametrize("device", DEVICES)
def test_seed_amplitudes_on_a_device_are_the_hosts(device):
    fod, in_a, in_b = crossing_phantom(60.0, shape=(30, 30, 3))
    host = FodVolume.from_sh(fod, AFFINE, "host", device="cpu")
    region = in_a | in_b
    expected = host.largest_amplitude(region)
    coefficients = fod if device == "cpu" else fod_tracking.summarise(fod, "gpu").coefficients
    got = fod_tracking.largest_amplitudes(coefficients, np.flatnonzero(region), 8, device, chunk=100)
    np.testing.assert_allclose(got, expected.reshape(-1)[np.flatnonzero(region)], rtol=1e-5, atol=1e-6)


def test_small_grids_and_cpu_runs_are_summarised_on_the_host(monkeypatch):
    fod, _, _ = crossing_phantom(90.0, shape=(20, 20, 3))
    assert track_fod._summary_backend("auto", fod) is None  # below DEVICE_SUMMARY_VOXELS
    monkeypatch.setattr(track_fod, "DEVICE_SUMMARY_VOXELS", 1)
    assert track_fod._summary_backend("cpu", fod) is None
    assert FodVolume.from_sh(fod, AFFINE, device="cpu").device_sh is None


@pytest.mark.gpu
@pytest.mark.parametrize("params", [FodDeterministicParams(), FodProbabilisticParams()], ids=["det", "prob"])
def test_a_volume_summarised_on_the_gpu_tracks_as_the_host_one(monkeypatch, params):
    fod, _, _ = dirty_phantom()
    host = FodVolume.from_sh(fod, AFFINE, "phantom", device="cpu")
    monkeypatch.setattr(track_fod, "DEVICE_SUMMARY_VOXELS", 1)
    device = FodVolume.from_sh(fod, AFFINE, "phantom", device="gpu")
    assert device.device_sh is not None and device.notes == host.notes
    runs = [fod_tracking_pipeline(v, whole_brain=True, params=params, device="gpu") for v in (host, device)]
    assert device.device_sh is None  # given up once the field was made
    a, b = (r.tractogram for r in runs)
    assert runs[0].provenance["seeds"] == runs[1].provenance["seeds"]
    np.testing.assert_array_equal(a.offsets, b.offsets)
    np.testing.assert_array_equal(a.points, b.points)
    np.testing.assert_allclose(a.point_scalars["fa"], b.point_scalars["fa"], atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((10,), np.float32),
        ((3 * (1 << 22) + 7, 3), np.float32),
        (((1 << 25) + 13,), np.float64),
        ((20000, 4001), np.uint8),
    ],
    ids=["small", "points", "not-a-stage-multiple", "bytes"],
)
def test_staged_copies_give_the_bytes_asnumpy_gives(shape, dtype):
    import cupy

    rng = cupy.random.default_rng(0)
    array = (rng.random(shape) * 1000).astype(dtype)
    np.testing.assert_array_equal(transfer.to_host(array), cupy.asnumpy(array))
    strided = array[::2]  # not contiguous: copied contiguous on the device first
    np.testing.assert_array_equal(transfer.to_host(strided), cupy.asnumpy(strided))
    assert transfer.to_host(array[:0]).shape == (0, *shape[1:])


def test_host_arrays_pass_through_the_copy():
    a = np.arange(10.0)
    assert transfer.to_host(a) is a


@pytest.mark.gpu
@pytest.mark.parametrize("shape, dtype", [((3, 4), np.float32), ((0,), np.uint32), ((1000, 3), np.int16)])
def test_pinned_arrays_are_numpy_arrays_of_the_shape_asked(shape, dtype):
    out = transfer.empty_pinned(shape, dtype)
    assert isinstance(out, np.ndarray) and out.shape == shape and out.dtype == dtype
    out[...] = 7
    assert (out == 7).all()


@pytest.mark.gpu
def test_pinned_arrays_do_not_import_cupyx():
    """``import cupyx`` imports cupyx.scipy: 0.3 s of a command's start."""
    import subprocess
    import sys

    code = ("import sys; from tractlens.gpu.transfer import empty_pinned; empty_pinned((4,), 'f4'); "
            "assert 'cupyx.scipy' not in sys.modules, 'cupyx.scipy imported'")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape, dtype",
    [((10,), np.float32), ((3 * (1 << 22) + 7, 3), np.float32), (((1 << 25) + 13,), np.float64)],
    ids=["small", "points", "not-a-stage-multiple"],
)
def test_staged_uploads_give_the_array_asarray_gives(tmp_path, shape, dtype):
    """From plain memory and from a memory-mapped file (the bedpostX cache's case)."""
    import cupy

    host = (np.random.default_rng(1).random(shape) * 1000).astype(dtype)
    np.save(tmp_path / "a.npy", host)
    mapped = np.load(tmp_path / "a.npy", mmap_mode="c")
    for source in (host, mapped, host[::3]):
        got = transfer.to_device(source)
        assert isinstance(got, cupy.ndarray) and got.dtype == source.dtype and got.shape == source.shape
        np.testing.assert_array_equal(got.get(), np.asarray(source))


def test_a_summary_without_room_on_the_device_is_made_on_the_host(monkeypatch):
    """Out of device memory while summarising: the host path's volume, no device copy."""
    from tractlens.gpu.backend import Backend

    fod, _, _ = dirty_phantom()
    fake = Backend("gpu", np, "a full GPU")

    class DeviceFull(MemoryError):
        pass

    def full(*args, **kwargs):
        raise DeviceFull("out of memory allocating 660 MB")

    monkeypatch.setattr(track_fod, "_summary_backend", lambda device, sh: fake)
    monkeypatch.setattr(fod_tracking, "summarise", full)
    monkeypatch.setattr(Backend, "free_cached_memory", lambda self: None)
    volume = FodVolume.from_sh(fod, AFFINE, "phantom", device="gpu")
    host = FodVolume.from_sh(fod, AFFINE, "phantom", device="cpu")
    assert volume.device_sh is None and volume.notes == host.notes
    np.testing.assert_array_equal(volume.fa, host.fa)
    np.testing.assert_array_equal(volume.mask, host.mask)
