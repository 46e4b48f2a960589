"""File formats: every read and write of TractLens goes through here.

Loaders validate and raise :class:`app.errors.InputError` with a message that
names the file, the problem and the fix; writers are atomic.
"""

from ..errors import InputError
from ._atomic import atomic_folder, atomic_path, split_suffix, write_text_atomic
from ._pages import release_pages
from .bedpostx import BedpostSamples, load_bedpostx
from .dwi import DWI, fsl_to_voxel_vectors, load_dwi, save_gradients
from .nifti import load_labels, load_mask, load_volume, save_volume
from .tensor import TENSOR_ORDERS, load_tensor, save_tensor
from .tractogram import load_tractogram, save_tractogram

__all__ = [
    "DWI",
    "TENSOR_ORDERS",
    "BedpostSamples",
    "InputError",
    "atomic_folder",
    "atomic_path",
    "fsl_to_voxel_vectors",
    "load_bedpostx",
    "load_dwi",
    "load_labels",
    "load_mask",
    "load_tensor",
    "load_tractogram",
    "load_volume",
    "release_pages",
    "save_gradients",
    "save_tensor",
    "save_tractogram",
    "save_volume",
    "split_suffix",
    "write_text_atomic",
]
