"""TractLens application core: data model, file formats, pipelines, command line. No widgets."""

from tractlens import __version__
from tractlens.gpu import backend as _backend

from . import kernel_cache as _kernel_cache

# The kernels compiled ahead of time go into CuPy's cache before its first kernel (app.kernel_cache).
_backend.on_cupy_import(_kernel_cache.install_for)

__all__ = ["__version__"]
