"""The lanes of ../shared/docs/architecture.md hold, and the code passes ruff."""

import ast
import subprocess
from pathlib import Path

import pytest

from tests.conftest import installed_tool

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "gpu": {"app", "widgets", "PySide6", "vtk", "vtkmodules", "pyvista", "pyvistaqt", "nibabel", "trx"},
    "app": {"widgets", "vtk", "vtkmodules", "pyvista", "pyvistaqt", "PySide6.QtWidgets", "PySide6.QtGui"},
}


def imported_modules(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


@pytest.mark.parametrize("package", FORBIDDEN)
def test_dependencies_point_one_way(package):
    bad = []
    for path in (ROOT / package).rglob("*.py"):
        for module in imported_modules(path):
            if any(module == f or module.startswith(f + ".") for f in FORBIDDEN[package]):
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
    line = re.search(r"^gpu\s*=\s*\[(.*)\]", section, re.M)
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
    "app/cli.py": ("fix",),  # option errors there concern no file
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
