"""The wheel: one top-level package, its data files, and a clean install beside packages named
``app``, ``gpu`` and ``widgets``.

Builds without the network (``--no-build-isolation``): the environment's setuptools builds it,
so the test extra asks for a setuptools that writes wheels by itself (>= 70.1).
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tractlens import resources

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "app", "gpu", "widgets", "resources", "tractlens")


def _setuptools_builds_wheels() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    major, minor = (int(part) for part in setuptools.__version__.split(".")[:2])
    if (major, minor) >= (70, 1):
        return True
    try:  # older setuptools needs the wheel package for bdist_wheel
        import wheel  # noqa: F401
    except ImportError:
        return False
    return True


needs_build = pytest.mark.skipif(
    not _setuptools_builds_wheels(), reason="building the wheel offline needs setuptools>=70.1: pip install -e .[test]"
)


@pytest.fixture(scope="module")
def wheel_path(tmp_path_factory) -> Path:
    """The project's wheel, built from a copy of the sources (the checkout stays clean)."""
    if not _setuptools_builds_wheels():
        pytest.skip("building the wheel offline needs setuptools>=70.1: pip install -e .[test]")
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", out, src],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("tractlens-*.whl")
    return wheel


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


@needs_build
def test_the_wheel_installs_only_the_tractlens_package(wheel_path):
    names = _names(wheel_path)
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"tractlens"}
    dist_info = next(name.split("/")[0] for name in names if name.split("/")[0].endswith(".dist-info"))
    assert [n for n in names if n.startswith(dist_info) and Path(n).name == "LICENSE"], "no LICENSE in dist-info"
    for sub in ("app", "app/io", "app/pipelines", "gpu", "widgets", "resources"):
        assert f"tractlens/{sub}/__init__.py" in names


@needs_build
def test_the_wheel_carries_the_kernels_and_the_resources(wheel_path):
    names = set(_names(wheel_path))
    kernels = [p.name for p in (ROOT / "gpu" / "kernels").iterdir() if p.suffix in (".cu", ".cuh")]
    assert kernels
    for kernel in kernels:
        assert f"tractlens/gpu/kernels/{kernel}" in names
    for shipped in resources.FILES:
        assert f"tractlens/resources/{shipped}" in names


def test_every_promised_resource_exists():
    for shipped in resources.FILES:
        assert resources.path(shipped).is_file(), shipped
        assert shipped in (resources.__doc__ or "") or shipped.startswith("icons/"), shipped
    for name in resources.TOOLBAR_ICONS:
        text = resources.icon_path(name).read_text()
        assert 'viewBox="0 0 24 24"' in text and 'stroke-width="2"' in text, name  # one grid, one stroke
    on_disk = {str(p.relative_to(resources.RESOURCES)) for p in resources.RESOURCES.rglob("*") if p.is_file()}
    on_disk = {p for p in on_disk if "__pycache__" not in p and p != "__init__.py"}
    assert on_disk == set(resources.FILES)  # nothing unlisted either
    with pytest.raises(FileNotFoundError, match="not a shipped resource"):
        resources.path("style.qss")
    with pytest.raises(FileNotFoundError, match="no tool-bar icon"):
        resources.icon_path("lasso")


def test_the_desktop_entry_parses_with_the_required_keys():
    entry = configparser.ConfigParser(interpolation=None)
    entry.optionxform = str  # keys are case-sensitive
    entry.read(resources.path(resources.DESKTOP_ENTRY), encoding="utf-8")
    section = entry["Desktop Entry"]
    assert section["Type"] == "Application"
    assert section["Name"] == "TractLens"
    assert section["Exec"].split()[0] == "tractlens" and "%F" in section["Exec"]
    assert section["Icon"] == Path(resources.APP_ICON).stem
    assert {"Science", "MedicalSoftware"} <= set(filter(None, section["Categories"].split(";")))
    assert section["Terminal"] == "false"


def _foreign_wheel(folder: Path) -> Path:
    """A wheel of a distribution that owns top-level ``app``, ``gpu`` and ``widgets``, zipped by hand."""
    wheel = folder / "generic_names-1.0-py3-none-any.whl"
    files = {
        "app/__init__.py": "raise ImportError('the generic app package was imported')\n",
        "gpu/__init__.py": "raise ImportError('the generic gpu package was imported')\n",
        "widgets/__init__.py": "raise ImportError('the generic widgets package was imported')\n",
        "generic_names-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: generic-names\nVersion: 1.0\n",
        "generic_names-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        "generic_names-1.0.dist-info/top_level.txt": "app\ngpu\nwidgets\n",
    }
    record = [f"{name},," for name in files] + ["generic_names-1.0.dist-info/RECORD,,"]
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("generic_names-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


def _dependency_dirs() -> list[str]:
    """Where this environment's packages are: its site-packages and what they add (as plain paths)."""
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return [p for p in sys.path if p in here or p.rstrip("/").endswith(("site-packages", "dist-packages"))]


@needs_build
@pytest.mark.slow
def test_the_wheel_runs_in_a_fresh_venv_beside_generic_top_level_packages(wheel_path, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index",
         wheel_path, _foreign_wheel(tmp_path)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    # Path lines, not site dirs: the .pth files there (an editable tractlens) are not processed.
    (Path(purelib) / "zz_test_dependencies.pth").write_text("\n".join(_dependency_dirs()) + "\n")

    work = tmp_path / "work"  # a user's folder with an app/ package and a gpu.py of its own
    (work / "app").mkdir(parents=True)
    (work / "app" / "__init__.py").write_text("raise ImportError('the local app folder was imported')\n")
    (work / "gpu.py").write_text("raise ImportError('the local gpu.py was imported')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["TRACTLENS_DISABLE_GPU"] = "1"

    def run(*args):
        result = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
        return result.stdout

    where = run(python, "-c", "import tractlens, tractlens.app, tractlens.gpu; print(tractlens.app.__file__)")
    assert Path(where.strip()).is_relative_to(venv), where
    assert "tractlens" in run(venv / "bin" / "tractlens", "info").lower()
    run(venv / "bin" / "tractlens", "demo-data", work / "demo")
    assert any((work / "demo").iterdir())
    assert "tractlens" in run(python, "-m", "tractlens", "info").lower()
