"""nibabel imported without importing pydicom.

nibabel's ``nifti1`` module imports pydicom when it is installed (``optional_package("pydicom")``,
for the rare NIfTI header extension that holds a DICOM dataset), and pydicom brings Pillow and
``requests``: a third of a second or more on every ``tractlens`` command of a user with the dicom
extra. While nibabel is first imported, ``pydicom`` is a stand-in module whose first attribute
lookup imports the real pydicom (nibabel looks one up only when it meets a DICOM extension; the
``Dataset`` it names at import as a type is a stand-in class that asks the real one); the
stand-in leaves ``sys.modules`` as soon as nibabel is imported, so every ``import pydicom`` after
that, ours included, gets the real package.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def _real_pydicom():
    return importlib.import_module("pydicom")


class _DatasetType(type):
    """isinstance and issubclass against the stand-in's ``Dataset`` ask the real ``pydicom.Dataset``."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _real_pydicom().Dataset)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, _real_pydicom().Dataset)


class _Dataset(metaclass=_DatasetType):
    """What ``pydicom.Dataset`` is while nibabel imports: nibabel names it at import time only as a
    type (``DicomDataset``, its DICOM extension's type parameter and annotations)."""


class _DeferredPydicom(types.ModuleType):
    """Stands in for pydicom in nibabel; any attribute but ``Dataset`` imports the real one."""

    Dataset = _Dataset

    def __getattr__(self, name: str):
        if sys.modules.get("pydicom") is self:  # asked before nibabel finished importing
            del sys.modules["pydicom"]
        return getattr(_real_pydicom(), name)


def import_nibabel() -> None:
    """Import nibabel (once), pydicom deferred as the module's docstring says."""
    if "nibabel" in sys.modules or "pydicom" in sys.modules or importlib.util.find_spec("pydicom") is None:
        import nibabel

        return
    stand_in = _DeferredPydicom("pydicom", "pydicom, imported when nibabel first uses it")
    sys.modules["pydicom"] = stand_in
    try:
        import nibabel  # noqa: F401
    finally:
        if sys.modules.get("pydicom") is stand_in:
            del sys.modules["pydicom"]
