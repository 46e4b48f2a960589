"""The brain mask from b=0 (app.masking): its median filter in slabs on threads gives the whole
volume's filter to the bit, so a fit without a mask fits the same voxels on any number of cores."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from tractlens.app import masking


@pytest.mark.parametrize(
    ("shape", "threads"),
    [((20, 17, 64), 4), ((20, 17, 64), 7), ((9, 11, 33), 16), ((12, 12, 17), 3), ((6, 5, 7), 4)],
)
def test_the_median_in_slabs_is_the_whole_volumes(shape, threads):
    rng = np.random.default_rng(sum(shape) + threads)
    image = rng.random(shape).astype(np.float32)
    image[rng.random(shape) < 0.05] = 0.0  # ties, as masked backgrounds have
    whole = ndimage.median_filter(image, size=3)
    np.testing.assert_array_equal(masking.median3(image, threads), whole)


def test_thin_volumes_are_filtered_whole(monkeypatch):
    """A slab keeps MEDIAN_SLAB_PLANES planes at least: a volume thinner than two is one slab."""
    calls = []
    real = ndimage.median_filter
    monkeypatch.setattr(
        ndimage, "median_filter", lambda image, size: calls.append(image.shape) or real(image, size=size)
    )
    masking.median3(np.ones((5, 5, 2 * masking.MEDIAN_SLAB_PLANES - 1), np.float32), threads=8)
    assert calls == [(5, 5, 2 * masking.MEDIAN_SLAB_PLANES - 1)]
    calls.clear()
    masking.median3(np.ones((5, 5, 4 * masking.MEDIAN_SLAB_PLANES), np.float32), threads=8)
    assert len(calls) == 4 and all(s[2] <= masking.MEDIAN_SLAB_PLANES + 2 for s in calls)


def test_the_brain_mask_is_the_same_on_one_thread_and_on_many(monkeypatch):
    shape = (40, 44, 36)
    g = np.indices(shape).astype(np.float32)
    radius = np.sqrt(((g[0] - 20) / 15) ** 2 + ((g[1] - 22) / 17) ** 2 + ((g[2] - 18) / 14) ** 2)
    rng = np.random.default_rng(0)
    b0 = np.where(radius < 1, 900 + 100 * rng.random(shape), 30 * rng.random(shape)).astype(np.float32)
    b0[18:22, 20:24, 16:20] = 50  # a dark ventricle, filled
    many = masking.brain_mask_from_b0(b0)
    monkeypatch.setattr(masking, "median3", lambda image: ndimage.median_filter(image, size=3))
    one = masking.brain_mask_from_b0(b0)
    np.testing.assert_array_equal(many, one)
    assert 0.2 < many.mean() < 0.5 and many[20, 22, 18]


def _slice_by_slice(mask: np.ndarray, axis: int) -> np.ndarray:
    out = mask.copy()
    for i in range(out.shape[axis]):
        index = [slice(None)] * 3
        index[axis] = i
        out[tuple(index)] = ndimage.binary_fill_holes(out[tuple(index)])
    return out


@pytest.mark.parametrize("seed", range(12))
def test_holes_filled_in_one_pass_are_the_slice_by_slice_holes(seed):
    """The brain mask's 2-D hole filling across each axis, done in one labelling of the volume,
    equals SciPy's ``binary_fill_holes`` called on every slice: random masks of many densities and
    shapes (thin ones, one-voxel edges), some dilated to close rings around holes."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(1, 24, 3))
    mask = rng.random(shape) < rng.uniform(0.2, 0.95)
    if seed % 2:
        mask = ndimage.binary_dilation(mask)
    for axis in range(3):
        expected = _slice_by_slice(mask, axis)
        got = masking.fill_holes_in_slices(mask, axis)
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == bool and not np.shares_memory(got, mask)


def test_a_hole_inside_a_slice_is_filled_and_a_notch_open_to_its_outside_is_not():
    mask = np.zeros((3, 9, 9), bool)
    mask[1, 2:7, 2:7] = True
    mask[1, 4, 4] = False  # a hole: no path within the slice leads from it to the slice's edge
    mask[1, 4, 6] = False  # a notch in the square's side: (1, 4, 7) beside it is outside
    filled = masking.fill_holes_in_slices(mask, axis=0)
    assert filled[1, 4, 4] and not filled[1, 4, 6]
    across = masking.fill_holes_in_slices(mask, axis=1)  # in the slices across axis 1 it is open
    assert not across[1, 4, 4]


def test_a_cpu_backend_filters_on_the_host(monkeypatch):
    from tractlens.gpu import filters
    from tractlens.gpu.backend import get_backend

    cpu = get_backend("cpu")
    b0 = np.random.default_rng(3).random((12, 13, 20)).astype(np.float32)
    with pytest.raises(ValueError, match="GPU backend"):
        filters.median3_passes(b0, 2, cpu)
    monkeypatch.setattr(filters, "median3_passes", lambda *a: pytest.fail("the GPU's filter was called"))
    np.testing.assert_array_equal(masking.brain_mask_from_b0(b0, backend=cpu), masking.brain_mask_from_b0(b0))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(145, 174, 145), (20, 17, 64), (6, 5, 7), (1, 9, 4)])
def test_the_gpu_median_is_scipys_to_the_bit(shape):
    """Two passes of the 3x3x3 median on the GPU equal SciPy's on the host (a median selects a
    value; the edges are reflected alike), ties and zeros included."""
    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.filters import median3_passes

    rng = np.random.default_rng(sum(shape))
    image = (rng.random(shape) * 1000).astype(np.float32)
    image[rng.random(shape) < 0.2] = 0.0
    image[rng.random(shape) < 0.1] = 500.0
    expected = ndimage.median_filter(ndimage.median_filter(image, size=3), size=3)
    got = median3_passes(image, 2, get_backend("gpu"))
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)


@pytest.mark.gpu
def test_the_automatic_mask_is_the_same_on_the_gpu(demo_dir):
    from tractlens.app.io import load_dwi
    from tractlens.app.pipelines.dti import resolve_mask

    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    on_cpu, _ = resolve_mask(dwi, None, "cpu")
    notes: list[str] = []
    on_gpu, _ = resolve_mask(dwi, None, "gpu", notes)
    np.testing.assert_array_equal(on_gpu, on_cpu)
    assert notes == [] and on_cpu.any()
