"""Image filters on the GPU: the brain mask's 3x3x3 median.

SciPy's median filter is a sort of 27 values per voxel on the host: two passes over an
HCP-sized b=0 image are 3-4 CPU-seconds, which a batch of fits without a mask pays per subject
on cores its workers share. CuPy's ``cupyx.scipy.ndimage.median_filter`` selects the same
value per voxel with the same edge rule (``reflect``), so the result is SciPy's to the bit (a
median picks one of the image's values; nothing is summed).
"""

from __future__ import annotations

import numpy as np

from .backend import Backend, OutOfDeviceMemory


def median3_passes(image: np.ndarray, passes: int, backend: Backend) -> np.ndarray:
    """``passes`` rounds of ``scipy.ndimage.median_filter(image, size=3)`` (edges reflected) of a
    3-D image on ``backend``'s GPU, the image kept there between the rounds; a host array back.
    The CPU's filter (in slabs on threads) is :func:`tractlens.app.masking.median3`."""
    if not backend.is_gpu:
        raise ValueError("median3_passes runs on a GPU backend; the host's filter is app.masking.median3")
    from cupyx.scipy import ndimage

    try:
        with backend.activate():
            values = backend.asarray(np.ascontiguousarray(image))
            for _ in range(passes):
                values = ndimage.median_filter(values, size=3, mode="reflect")
            return backend.to_host(values)
    except Exception as exc:
        if not backend.is_out_of_memory(exc):
            raise
        raise OutOfDeviceMemory(
            f"{backend.device_name} ran out of memory for the 3x3x3 median of a {'x'.join(map(str, image.shape))} "
            f"image (about {3 * np.asarray(image).nbytes / 2**20:.1f} MiB needed)"
        ) from exc
