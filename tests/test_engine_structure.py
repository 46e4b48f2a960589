"""The engine's shape: no import cycles among its modules, no private names borrowed between
them, and the tensor and fODF trackers sharing one tracking core (gpu/tracking.py,
kernels/walk.cuh) instead of repeating it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "gpu"


def _module(path: Path) -> str:
    parts = path.relative_to(GPU).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__")


def _imports(path: Path) -> list[ast.ImportFrom]:
    """Every ``from`` import of a module, those inside functions included."""
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)]


def _engine_target(path: Path, node: ast.ImportFrom) -> str | None:
    """The gpu module a relative or ``tractlens.gpu`` import names, else None."""
    if node.level:
        package = list(path.relative_to(GPU).parts[:-1])
        package = package[: len(package) - node.level + 1]
        return ".".join([*package, *([node.module] if node.module else [])])
    if node.module and node.module.startswith("tractlens.gpu"):
        return node.module.removeprefix("tractlens.gpu").lstrip(".")
    return None


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in GPU.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for name, path in files.items():
        for node in _imports(path):
            target = _engine_target(path, node)
            if target is None:
                continue
            for candidate in [f"{target}.{a.name}".lstrip(".") for a in node.names] + [target]:
                if candidate in files and candidate != name:
                    graph[name].add(candidate)
                    break
    return graph


def test_the_engine_modules_import_no_cycle():
    """Deferred imports count: a cycle hidden inside a function is still a cycle."""
    graph = _graph()
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = [*trail[trail.index(target) :], target] if target in trail else [module, target]
                raise AssertionError(" -> ".join(cycle))
            if target not in state:
                visit(target, [*trail, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_no_engine_module_imports_another_ones_private_names():
    borrowed = [
        f"{path.relative_to(ROOT)}:{node.lineno} {alias.name}"
        for path in GPU.rglob("*.py")
        for node in _imports(path)
        if _engine_target(path, node) is not None
        for alias in node.names
        if alias.name.startswith("_") and alias.name != "__future__"
    ]
    assert not borrowed, "\n".join(borrowed)


def _body_lines(path: Path) -> list[str]:
    """The statements of every function body (signatures, docstrings and blank lines left out):
    the code, without the keyword lists the trackers share as one API."""
    text = path.read_text().splitlines()
    lines: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            if body:  # one function's lines; a marker keeps two functions from making one block
                lines += [text[i].strip() for i in range(body[0].lineno - 1, body[-1].end_lineno)]
                lines.append(f"<end of {path.name}:{node.lineno}>")
    return [line for line in lines if line and not line.startswith("#")]


def _kernel_lines(path: Path) -> list[str]:
    return [s for line in path.read_text().splitlines() if (s := line.strip()) and not s.startswith("//")]


def _repeated_blocks(a: list[str], b: list[str], size: int = 6) -> list[str]:
    seen = {tuple(b[i : i + size]) for i in range(len(b) - size + 1)}
    return ["\n".join(a[i : i + size]) for i in range(len(a) - size + 1) if tuple(a[i : i + size]) in seen]


def test_the_tensor_and_fodf_trackers_repeat_no_block_of_six_lines():
    python = _repeated_blocks(_body_lines(GPU / "deterministic.py"), _body_lines(GPU / "fod_tracking.py"))
    assert not python, "\n---\n".join(python)
    kernels = GPU / "kernels"
    cuda = _repeated_blocks(_kernel_lines(kernels / "deterministic.cu"), _kernel_lines(kernels / "fod_tracking.cu"))
    assert not cuda, "\n---\n".join(cuda)
