"""TractLens: GPU diffusion MRI tractography.

One installed package with four parts: ``tractlens.gpu`` (the compute engine: arrays in,
arrays out, on CuPy or NumPy), ``tractlens.app`` (data model, file formats, pipelines,
command line; no widgets), ``tractlens.widgets`` (the Qt window) and
``tractlens.resources`` (icons and other shipped files).

The names below are the public Python API; they are imported on first use, so
``import tractlens`` stays fast and needs neither Qt nor a GPU::

    import tractlens
    dwi = tractlens.load_dwi("dwi.nii.gz")
    result = tractlens.fit_dti_pipeline(dwi)
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    __version__ = version("tractlens")
except PackageNotFoundError:  # a source checkout that was never installed
    __version__ = "0.0.0+source"

# In a source checkout the subpackages are the repository's top-level folders (app/, gpu/,
# widgets/, resources/) beside this one; an installed wheel has them inside this folder.
# Searching the parent folder too makes ``tractlens.app`` resolve in both layouts (a checkout
# run without installing, a git worktree, a benchmark script started from the repository).
_HERE = Path(__file__).resolve().parent
if not (_HERE / "app").is_dir() and (_HERE.parent / "app" / "__init__.py").is_file():
    __path__.append(str(_HERE.parent))  # type: ignore[name-defined]

# public name -> module that defines it
_API = {
    "load_dwi": "tractlens.app.io",
    "load_volume": "tractlens.app.io",
    "load_mask": "tractlens.app.io",
    "load_labels": "tractlens.app.io",
    "load_tractogram": "tractlens.app.io",
    "save_tractogram": "tractlens.app.io",
    "load_bedpostx": "tractlens.app.io",
    "InputError": "tractlens.app.errors",
    "Grid": "tractlens.app.grid",
    "fit_dti_pipeline": "tractlens.app.pipelines.dti",
    "write_dti_outputs": "tractlens.app.pipelines.dti",
    "fit_ballstick_pipeline": "tractlens.app.pipelines.ballstick",
    "load_tensor_field": "tractlens.app.pipelines.track",
    "deterministic_pipeline": "tractlens.app.pipelines.track",
    "geodesic_pipeline": "tractlens.app.pipelines.track",
    "prepare_probabilistic": "tractlens.app.pipelines.probabilistic",
    "commit_from_files": "tractlens.app.usecases.commit",
    "select_pipeline": "tractlens.app.pipelines.select",
    "compute_connectome": "tractlens.app.pipelines.connectivity",
    "compute_profile": "tractlens.app.pipelines.connectivity",
    "compute_lesion_distance": "tractlens.app.pipelines.connectivity",
    "write_demo": "tractlens.app.demo",
    "open_window": "tractlens.widgets.api",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    try:
        module = _API[name]
    except KeyError:
        raise AttributeError(f"module 'tractlens' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
