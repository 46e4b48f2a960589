"""Brain mask from the b=0 image, for fits run without a user mask.

Method (in the spirit of DIPY's ``median_otsu``):

1. mean of the b=0 volumes, NaN/Inf as 0;
2. two passes of a 3x3x3 median filter (suppresses noise and speckle);
3. Otsu's threshold on the filtered image's histogram (256 bins);
4. keep the largest 6-connected component (drops noise blobs outside the head);
5. fill holes slice-wise and in 3-D (ventricles, dark CSF at b=0 stay inside).

It is a convenience for well-behaved data; for surgery planning a checked mask
(e.g. FSL's bet) should be passed explicitly.
"""

from __future__ import annotations

import numpy as np


def otsu_threshold(values: np.ndarray, bins: int = 256) -> float:
    """Threshold maximising the between-class variance of ``values``."""
    values = np.asarray(values, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    if values.size == 0 or values.min() == values.max():
        return float(values.min()) if values.size else 0.0
    hist, edges = np.histogram(values, bins=bins)
    centres = 0.5 * (edges[:-1] + edges[1:])
    weight_lo = np.cumsum(hist)
    weight_hi = weight_lo[-1] - weight_lo
    mass_lo = np.cumsum(hist * centres)
    mean_lo = mass_lo / np.maximum(weight_lo, 1)
    mean_hi = (mass_lo[-1] - mass_lo) / np.maximum(weight_hi, 1)
    between = weight_lo * weight_hi * (mean_lo - mean_hi) ** 2
    return float(edges[int(np.argmax(between[:-1])) + 1])


#: Fewest planes of a slab of the median filter: thinner slabs would mostly filter their borrowed planes.
MEDIAN_SLAB_PLANES = 8


def median3(image: np.ndarray, threads: int | None = None) -> np.ndarray:
    """``scipy.ndimage.median_filter(image, size=3)`` of a 3-D image, computed in slabs along the
    last axis on ``threads`` threads (default: this process's share of the cores; SciPy filters
    without the GIL). Each slab borrows one plane from each neighbour and keeps only its own
    planes' values, so the result is the whole volume's to the bit: the volume's own edges are
    reflected as before, and a slab's borrowed planes are where its reflection would have been."""
    from concurrent.futures import ThreadPoolExecutor

    from scipy import ndimage

    from tractlens.gpu.host import host_threads

    depth = image.shape[-1]
    slabs = max(1, min(threads or host_threads(), depth // MEDIAN_SLAB_PLANES))
    if slabs == 1:
        return ndimage.median_filter(image, size=3)
    edges = np.linspace(0, depth, slabs + 1).astype(int)
    out = np.empty_like(image)

    def slab(k: int) -> None:
        first, last = edges[k], edges[k + 1]
        lo, hi = max(first - 1, 0), min(last + 1, depth)
        out[..., first:last] = ndimage.median_filter(image[..., lo:hi], size=3)[..., first - lo : last - lo]

    with ThreadPoolExecutor(max_workers=slabs) as pool:
        list(pool.map(slab, range(slabs)))
    return out


def brain_mask_from_b0(mean_b0: np.ndarray, median_passes: int = 2, backend=None) -> np.ndarray:
    """Boolean brain mask from the mean b=0 image (see module docstring). With a GPU ``backend``
    (:func:`tractlens.gpu.backend.get_backend`) the median filter runs there; the mask is the
    same to the voxel."""
    from scipy import ndimage  # here, not at import: fit-dti with --mask never needs it (0.2 s to import)

    image = np.nan_to_num(np.asarray(mean_b0, dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    if backend is not None and backend.is_gpu and median_passes:
        from tractlens.gpu.filters import median3_passes

        image = median3_passes(image, median_passes, backend)
    else:
        for _ in range(median_passes):
            image = median3(image)
    mask = image > otsu_threshold(image)
    labels, count = ndimage.label(mask)
    if count > 1:
        sizes = ndimage.sum_labels(mask, labels, index=np.arange(1, count + 1))
        mask = labels == (int(np.argmax(sizes)) + 1)
    for axis in range(3):
        mask = fill_holes_in_slices(mask, axis)
    return ndimage.binary_fill_holes(mask)


def fill_holes_in_slices(mask: np.ndarray, axis: int) -> np.ndarray:
    """``scipy.ndimage.binary_fill_holes`` of every 2-D slice of ``mask`` across ``axis``, in one
    pass over the volume instead of one call per slice: the background's 4-connected pieces of
    each slice (one 3-D labelling whose structure joins nothing across the axis) that touch no
    edge of their slice are holes. The same mask to the voxel as the slice-by-slice calls."""
    from scipy import ndimage

    mask = np.asarray(mask, dtype=bool)
    structure = np.zeros((3, 3, 3), bool)
    plane = [slice(None)] * 3
    plane[axis] = 1
    structure[tuple(plane)] = ndimage.generate_binary_structure(2, 1)
    labels, count = ndimage.label(~mask, structure=structure)
    outside = np.zeros(count + 1, bool)
    outside[0] = True  # the mask itself
    for edge_axis in (a for a in range(3) if a != axis):
        for end in (0, -1):
            edge = [slice(None)] * 3
            edge[edge_axis] = end
            outside[labels[tuple(edge)]] = True
    return mask | ~outside[labels]
