"""DIPY's registration modules imported without the convenience API that ``dipy.align`` imports.

``dipy/align/__init__.py`` defines three small names its own modules import (``floating``,
``Bunch``, ``VerbosityLevels``) and then imports ``dipy.align._public``: the workflow functions
(``affine_registration``, ``syn_registration``, ``register_dwi_series``...), which import
``dipy.io`` (pandas, h5py, trx), ``dipy.data`` and ``dipy.tracking``. That was half of the DIPY
import of ``tractlens register`` (0.28 of 0.52 s of CPU on the benchmark machine's neighbour);
TractLens uses four modules of the package (``imaffine``, ``imwarp``, ``metrics``, ``transforms``)
and none of that API.

:func:`import_align` makes the package module from its own spec, runs DIPY's ``__init__`` up to the
statement that imports ``dipy.align._public`` (DIPY's statements, read from its file and run in
their order), imports the four modules, and leaves the package in ``sys.modules`` as a module
whose first look-up of a name it lacks (``dipy.align.affine_registration``) runs the rest of that
``__init__``: whoever uses DIPY's API later in the process gets the whole package. When the file
has no such statement (another DIPY), when ``dipy.align`` is already imported, or when anything
fails on the way, it is the ordinary import. ``tests/test_dipy_start.py`` fails when the short
way is no longer taken (a DIPY release that moves these names).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import threading
import types

#: The modules of ``dipy.align`` that registration uses.
MODULES = ("imaffine", "imwarp", "metrics", "transforms")
PACKAGE = "dipy.align"
PUBLIC = "dipy.align._public"

_lock = threading.RLock()


class _DeferredAlign(types.ModuleType):
    """``dipy.align`` with its ``__init__`` run up to the import of ``_public``; the first look-up of
    a missing name runs the rest (after our modules are imported: before, a missing name is a
    submodule the import system is about to load)."""

    def __getattr__(self, name: str):
        rest = self.__dict__.get("_tractlens_rest")
        if rest is None or name.startswith("__") or self.__dict__.get("_tractlens_loading"):
            raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
        _complete(self)
        return getattr(self, name)


def _complete(module: types.ModuleType) -> None:
    """Run the rest of ``dipy/align/__init__.py`` in ``module`` (once)."""
    with _lock:
        rest = module.__dict__.pop("_tractlens_rest", None)
        module.__dict__.pop("_tractlens_loading", None)
        module.__class__ = types.ModuleType
        if rest is not None:
            exec(rest, module.__dict__)


def _split_init(spec) -> tuple[types.CodeType, types.CodeType] | None:
    """DIPY's ``__init__`` code before and from the statement importing ``dipy.align._public``."""
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return None
    source = spec.loader.get_source(PACKAGE) if hasattr(spec.loader, "get_source") else None
    if not source:
        return None
    tree = ast.parse(source, spec.origin)

    def imports_public(node) -> bool:
        if isinstance(node, ast.ImportFrom):
            return node.level == 0 and node.module == PUBLIC
        return isinstance(node, ast.Import) and any(alias.name == PUBLIC for alias in node.names)

    index = next((i for i, node in enumerate(tree.body) if imports_public(node)), None)
    if index is None:
        return None
    head = ast.Module(body=tree.body[:index], type_ignores=[])
    rest = ast.Module(body=tree.body[index:], type_ignores=[])
    return compile(head, spec.origin, "exec"), compile(rest, spec.origin, "exec")


def _short_way() -> bool:
    """Import :data:`MODULES` through a partly run package (see the module's docstring); False, with
    nothing left behind, when that cannot be done."""
    import dipy

    spec = importlib.util.find_spec(PACKAGE)
    parts = _split_init(spec)
    if parts is None:
        return False
    head, rest = parts
    before = set(sys.modules)
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _DeferredAlign
    module._tractlens_loading = True
    sys.modules[PACKAGE] = module
    try:
        exec(head, module.__dict__)
        dipy.align = module
        for name in MODULES:
            importlib.import_module(f"{PACKAGE}.{name}")
    except Exception:
        for name in set(sys.modules) - before:
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                del sys.modules[name]
        if getattr(dipy, "align", None) is module:
            delattr(dipy, "align")
        return False
    module._tractlens_rest = rest
    del module._tractlens_loading
    return True


def import_align() -> tuple[types.ModuleType, ...]:
    """``dipy.align``'s :data:`MODULES` (imaffine, imwarp, metrics, transforms), by the short way when it
    can (see the module's docstring), else by the ordinary import. Raises ImportError without DIPY."""
    with _lock:
        if PACKAGE not in sys.modules and importlib.util.find_spec("dipy") is not None:
            _short_way()
    return tuple(importlib.import_module(f"{PACKAGE}.{name}") for name in MODULES)
