"""The lanes of ../shared/docs/architecture.md hold, and the code passes ruff."""

import ast
import os
import shutil
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
        "shiboken6",
        "vtk",
        "vtkmodules",
        "pyvista",
        "pyvistaqt",
        "nibabel",
        "trx",
    },
    # app is Qt-free: no PySide6 at all (QtCore included); the Qt job runner lives in widgets.
    "app": {"tractlens.widgets", "vtk", "vtkmodules", "pyvista", "pyvistaqt", "PySide6", "shiboken6"},
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


# ------------------------------------------------------------------ contracts and import cycles
def installed_layout(target: Path) -> Path:
    """The package's Python sources laid out as the wheel installs them (``tractlens/app``, …)
    under ``target``: import-linter finds a package's modules in its folder, and in a checkout
    ``app/``, ``gpu/`` and ``widgets/`` sit beside ``tractlens/``, not inside it."""
    package = target / "tractlens"
    package.mkdir(parents=True)
    shutil.copy2(ROOT / "tractlens" / "__init__.py", package / "__init__.py")
    for folder in ("app", "gpu", "widgets"):
        for path in python_files(folder):
            copy = package / path.relative_to(ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, copy)
    return target


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    tool = installed_tool("lint-imports")
    assert tool, "import-linter is part of the test extra"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([tool, str(ROOT / "pyproject.toml")], capture_output=True, text=True, cwd=tree, env=env)


def test_import_linter_contracts_hold(tmp_path):
    """The lanes of pyproject.toml's [tool.importlinter]: widgets → app → gpu; app and gpu import
    no Qt, VTK or pyvista; gpu no file formats, file I/O or argparse."""
    out = lint_imports(installed_layout(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 kept, 0 broken" in out.stdout, out.stdout


@pytest.mark.parametrize(
    "module, line, contract",
    [
        ("app/grid.py", "from tractlens.widgets import render", "widgets -> app -> gpu"),
        ("gpu/sh.py", "from PySide6 import QtCore", "app and gpu know no Qt"),
        ("gpu/sh.py", "import nibabel", "gpu reads and writes no files"),
    ],
)
def test_import_linter_names_a_breach(tmp_path, module, line, contract):
    """The contracts can fail: one import across a lane, added to a copy of the sources, breaks one."""
    tree = installed_layout(tmp_path)
    copy = tree / "tractlens" / module
    copy.write_text(copy.read_text() + f"\n{line}  # noqa\n")
    out = lint_imports(tree)
    assert out.returncode != 0 and "1 broken" in out.stdout, out.stdout
    broken = [line for line in out.stdout.splitlines() if line.endswith(" BROKEN")]
    assert len(broken) == 1 and broken[0].startswith(contract), out.stdout


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module → the package's modules it imports, read from the sources: every import, at module
    top or deferred inside a function (a deferred import is still a dependency); only what sits
    under ``if TYPE_CHECKING:`` is left out (a type checker's, not the program's)."""
    files = {module_name(p): p for folder in ("app", "gpu", "widgets", "tractlens") for p in python_files(folder)}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
            for n in ast.walk(node)
        }
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in typing_only or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph[module].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), leaving out those made
    only of a package and its own submodules (an ``__init__`` that re-exports them)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)

    def nested(component: list[str]) -> bool:
        return all(
            any(o != m and (o.startswith(m + ".") or m.startswith(o + ".")) for o in component) for m in component
        )

    return [c for c in found if not nested(c)]


def test_no_import_cycles_in_the_package():
    """No module imports one that imports it back, through any chain and counting deferred
    imports: a cycle is a design bug, not something to hide inside a function."""
    cycles = import_cycles(import_graph())
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_deferred_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "p": {"p.x"}, "p.x": {"p"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


# ------------------------------------------------------------------ use cases live in app
def pipeline_entry_points_imported(source: str, package: str = "tractlens.widgets") -> list[str]:
    """The pipeline entry points a widget module imports: names ending in ``_pipeline`` taken from
    ``tractlens.app.pipelines`` (the computations a use case chains: ``fit_csd_pipeline``,
    ``commit_pipeline``, …), or a whole pipeline module whose entry points it could call."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
        if base == "tractlens.app.pipelines":
            found += [f"{base}.{alias.name}" for alias in node.names]  # a pipeline module itself
        elif base.startswith("tractlens.app.pipelines."):
            found += [f"{base}.{alias.name}" for alias in node.names if alias.name.endswith("_pipeline")]
    return found


def test_widgets_hold_no_use_case():
    """0 use-case functions in widgets, in the sense this can check: no widget imports a pipeline's
    entry point (a ``*_pipeline`` function of ``app.pipelines``, or a pipeline module whole), so a
    panel cannot chain checks, a pipeline and its result layers itself; it calls one function of
    ``app`` per action (``app.usecases``: ``filter_with_commit``, ``fit_ballstick``, …, or a
    pipeline's ``*_from_regions``/``compute_*`` function that is a whole action) and shows what
    comes back. What it cannot see: a panel chaining several such app functions itself (the
    probabilistic panel's regions → prepare → run today, which is being moved into app)."""
    bad = []
    for path in python_files("widgets"):
        package = module_name(path).rpartition(".")[0] if path.name != "__init__.py" else module_name(path)
        bad += [
            f"{path.relative_to(ROOT)} imports {m}" for m in pipeline_entry_points_imported(path.read_text(), package)
        ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "source, found",
    [
        (
            "from tractlens.app.pipelines.csd import CSDParams, fit_csd_pipeline",
            ["tractlens.app.pipelines.csd.fit_csd_pipeline"],
        ),
        ("from ..app.pipelines.commit import commit_pipeline", ["tractlens.app.pipelines.commit.commit_pipeline"]),
        ("from tractlens.app.pipelines import track", ["tractlens.app.pipelines.track"]),
        ("from tractlens.app.pipelines.track import deterministic_from_regions", []),
        ("from tractlens.app.usecases.commit import filter_with_commit", []),
    ],
)
def test_the_use_case_rule_names_each_breach(source, found):
    assert pipeline_entry_points_imported(source) == found
