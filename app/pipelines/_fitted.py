"""The one check every fit makes on its outcome: some voxel of the mask was fitted.

A series that is zero or not a number wherever the mask is (a failed conversion, the wrong mask)
is fitted voxel by voxel into flags "not fitted"; written out, it looked like a success (exit 0,
"fitted N voxels", every map empty). Such a fit is refused, with the reason, before anything is
written.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError


def require_fitted(flags: np.ndarray, not_fitted: int, what: str, path: str) -> None:
    """:class:`InputError` when no voxel was fitted (every voxel has a bit of ``not_fitted`` in
    its flags)."""
    flags = np.asarray(flags)
    if flags.size and not np.any((flags & not_fitted) == 0):
        raise InputError(
            f"none of the {flags.size} voxels of the mask could be fitted: the series has no usable signal there "
            "(zero, or not a number)",
            path=path or None,
            fix=f"Check the image (a failed conversion?) and the mask given to {what}",
        )
