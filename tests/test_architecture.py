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
