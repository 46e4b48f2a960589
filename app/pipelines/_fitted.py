"""The one check every fit makes on its outcome: some voxel of the mask was fitted.

A series that is zero or not a number wherever the mask is (a failed conversion, the wrong mask)
is fitted voxel by voxel into flags "not fitted"; written out, it looked like a success (exit 0,
"fitted N voxels", every map empty). Such a fit is refused, with the reason, before anything is
written.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError


def require_fitted(flags: np.ndarray, not_fitted: int, what: str, path: str) -> int:
    """The number of voxels fitted (no bit of ``not_fitted`` in their flags); :class:`InputError`
    when there is none."""
    flags = np.asarray(flags)
    fitted = int(np.count_nonzero((flags & not_fitted) == 0))
    if flags.size and fitted == 0:
        raise InputError(
            f"none of the {flags.size} voxels of the mask could be fitted: the series has no usable signal there "
            "(zero, or not a number)",
            path=path or None,
            fix=f"Check the image (a failed conversion?) and the mask given to {what}",
        )
    return fitted
