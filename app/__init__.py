"""TractLens application core: data model, file formats, pipelines, command line. No widgets."""

from tractlens import __version__
from tractlens.gpu import backend as _backend

from . import kernel_cache as _kernel_cache
from ._nibabel_start import import_nibabel as _import_nibabel
from ._numba_start import numba_cache_fallback as _numba_cache_fallback

_import_nibabel()  # before any module of the core imports nibabel: pydicom is not imported with it
_numba_cache_fallback()  # before numba's import: a cache folder where a read-only install has none

# The kernels compiled ahead of time go into CuPy's cache before its first kernel (app.kernel_cache).
_backend.on_cupy_import(_kernel_cache.install_for)

__all__ = ["__version__"]
