"""The lanes of ../shared/docs/architecture.md hold, and the code passes ruff."""

import ast
import subprocess
from pathlib import Path

import pytest

from tests.conftest import installed_tool

ROOT = Path(__file__).resolve().parents[1]
#: The repository's folders that are installed as subpackages of ``tractlens``.
SUBPACKAGES = ("app", "gpu", "widgets", "resources")
FORBIDDEN = {
    "gpu": {
        "tractlens.app",
        "tractlens.widgets",
        "PySide6",
        "vtk",
        "vtkmodules",
        "pyvista",
        "pyvistaqt",
        "nibabel",
        "trx",
    },
    "app": {"tractlens.widgets", "vtk", "vtkmodules", "pyvista", "pyvistaqt", "PySide6.QtWidgets", "PySide6.QtGui"},
}


def module_name(path: Path) -> str:
    """The dotted name a file of the repository has once installed (``app/io/dwi.py`` ->
    ``tractlens.app.io.dwi``; ``tests/x.py`` -> ``tests.x``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts and parts[0] in SUBPACKAGES:
        parts = ["tractlens", *parts]
    return ".".join(parts)


def imported_modules(path: Path):
    """Absolute names of the modules a file imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.module
                continue
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            yield ".".join([*base, node.module] if node.module else base)


def python_files(*folders: str):
    for folder in folders:
        yield from (p for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts)


@pytest.mark.parametrize("package", FORBIDDEN)
def test_dependencies_point_one_way(package):
    bad = []
    for path in python_files(package):
        for module in imported_modules(path):
            if any(module == f or module.startswith(f + ".") for f in FORBIDDEN[package]):
                bad.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not bad, "\n".join(bad)


#: Known breaches of the widgets rule below, in files being split elsewhere (to be fixed at merge).
def _private(name: str) -> bool:
    """``_atomic`` is private; ``__version__`` (a dunder) is not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def widget_import_breaches(source: str, package: str = "tractlens.widgets") -> list[str]:
    """What a widget module's ``source`` imports that widgets must not: ``tractlens.gpu`` (or
    any module of it), or a module of ``tractlens.app`` whose last dotted part starts with
    ``_`` (also when imported as a name: ``from tractlens.app.io import _atomic``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*base, node.module] if node.module else base)
            else:
                base = node.module
            modules = [base, *(f"{base}.{alias.name}" for alias in node.names if _private(alias.name))]
        else:
            continue
        for module in modules:
            engine = module == "tractlens.gpu" or module.startswith("tractlens.gpu.")
            private = module.startswith("tractlens.app.") and _private(module.rpartition(".")[2])
            if engine or private:
                found.append(module)
    return found


def test_widgets_reach_the_engine_only_through_app_public_modules():
    """Widgets show and edit; the engine (``tractlens.gpu``) is reached through ``app`` (its
    pipelines and the derived data it owns), and only through ``app``'s public modules: a
    module whose last dotted part starts with ``_`` is an implementation detail of ``app``."""
    bad = []
    for path in python_files("widgets"):
        package = module_name(path).rpartition(".")[0] if path.name != "__init__.py" else module_name(path)
        bad += [f"{path.relative_to(ROOT)} imports {m}" for m in widget_import_breaches(path.read_text(), package)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "source, breaches",
    [
        ("from tractlens.gpu import dti", ["tractlens.gpu"]),
        ("import tractlens.gpu.backend", ["tractlens.gpu.backend"]),
        ("from ..gpu.sym3 import eigh", ["tractlens.gpu.sym3"]),
        ("from tractlens.app.io._atomic import split_suffix", ["tractlens.app.io._atomic"]),
        ("from ..app.pipelines import _fallback", ["tractlens.app.pipelines._fallback"]),
        ("from tractlens.app.io import split_suffix", []),
        ("from tractlens.app import __version__", []),
        ("from tractlens.app.pipelines.track import TensorField", []),
        ("from . import fiber_display", []),
    ],
)
def test_widgets_rule_names_each_breach(source, breaches):
    assert widget_import_breaches(source) == breaches


def test_code_imports_tractlens_never_bare_app_or_gpu():
    """Installed, the folders are ``tractlens.app`` etc.: a bare ``import app`` would pick up
    whatever other distribution (or the user's working directory) owns a top-level ``app``."""
    bad = []
    for path in python_files(*SUBPACKAGES, "tractlens", "tests"):
        for module in imported_modules(path):
            if module.split(".")[0] in SUBPACKAGES:
                bad.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not bad, "\n".join(bad)


def test_packaging_folder_is_not_a_package():
    assert (ROOT / "packaging").is_dir() and not (ROOT / "packaging" / "__init__.py").exists()


def test_ruff_is_clean():
    ruff = installed_tool("ruff")
    assert ruff, "ruff is part of the test extra"
    out = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_kernel_file_is_package_data():
    """A non-editable install ships only what package-data names: the CUDA sources and the
    headers they #include must all be there, or the GPU kernels fail to compile."""
    import fnmatch
    import re

    # tomllib is Python >= 3.11 and we support 3.10: read the one line by hand.
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    line = re.search(r'^"tractlens\.gpu"\s*=\s*\[(.*)\]', section, re.M)
    assert line, "pyproject.toml has no package-data for gpu"
    patterns = re.findall(r'"([^"]+)"', line.group(1))
    kernels = [p for p in (ROOT / "gpu" / "kernels").iterdir() if p.is_file()]
    assert {p.suffix for p in kernels} >= {".cu", ".cuh"}
    missing = [
        p.name
        for p in kernels
        if not any(fnmatch.fnmatch(p.relative_to(ROOT / "gpu").as_posix(), pattern) for pattern in patterns)
    ]
    assert not missing, f"gpu/kernels files not in [tool.setuptools.package-data] gpu: {missing}"


#: Modules whose InputErrors must say what to do (``fix=``) and, where a file is involved, name it.
ERROR_MODULES = {
    **{f"app/io/{p.name}": ("path", "fix") for p in (ROOT / "app" / "io").glob("*.py")},
    "app/pipelines/dti.py": ("path", "fix"),
    **{f"app/cli/{p.name}": ("fix",) for p in (ROOT / "app" / "cli").glob("*.py")},  # option errors: no file
}


@pytest.mark.parametrize("module", sorted(ERROR_MODULES))
def test_input_errors_name_the_file_and_the_fix(module):
    """Every ``InputError(...)``/``SaveError(...)`` raised by the loaders says what to do about it:
    a message naming the problem alone leaves a clinician stuck."""
    tree = ast.parse((ROOT / module).read_text(), module)
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) in ("InputError", "SaveError")
    ]
    lacking = []
    for call in calls:
        given = {k.arg for k in call.keywords}
        if None in given:  # **kwargs: cannot tell statically
            continue
        missing = [k for k in ERROR_MODULES[module] if k not in given]
        if missing:
            lacking.append(f"{module}:{call.lineno} lacks {', '.join(k + '=' for k in missing)}")
    assert not lacking, "\n".join(lacking)


def test_every_subpackage_folder_is_installed():
    """pyproject.toml lists the packages by hand (the package-dir mapping needs it): a new
    folder with an ``__init__.py`` that is not listed is missing from the wheel, and the
    installed ``tractlens`` fails to import it."""
    import re

    text = (ROOT / "pyproject.toml").read_text()
    block = text.split("[tool.setuptools]", 1)[1].split("\n[", 1)[0]
    listed = set(re.findall(r'"(tractlens[\w.]*)"', block.split("packages", 1)[1]))
    on_disk = {
        module_name(init.parent / "__init__.py")
        for folder in (*SUBPACKAGES, "tractlens")
        for init in (ROOT / folder).rglob("__init__.py")
        if ".venv" not in init.parts
    }
    assert listed == on_disk, f"missing: {sorted(on_disk - listed)}; not a folder: {sorted(listed - on_disk)}"


@pytest.mark.parametrize("package", ["gpu", "app", "widgets"])
def test_no_module_is_a_god_module(package):
    """One job per module: none of ``gpu``, ``app`` or ``widgets`` grows past 600 lines."""
    long = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in python_files(package)
        if (n := len(p.read_text().splitlines())) > 600
    ]
    assert not long, "\n".join(long)
