"""Shipped GPU kernels (app/kernel_cache.py, packaging/build_kernels.py) without a GPU: a build
recorded on one machine is installed into another machine's CuPy cache under the names CuPy
computes there, for its own CuPy/NVRTC/architecture only, into the folder CuPy reads (the user's
CUPY_CACHE_DIR when set), never into the installation. A stand-in of CuPy's compiler (its cache
key and files, as CuPy 14 makes them) is what the build's capture wraps."""

from __future__ import annotations

import atexit
import gzip
import hashlib
import importlib.util
import json
import logging
import stat
import sys
import types
from pathlib import Path

import pytest

from tractlens.app import kernel_cache as kc
from tractlens.gpu import backend

ROOT = Path(__file__).resolve().parents[1]
BUILD_CORE = "/build/env/lib/python3.12/site-packages/cupy/_core"
USER_CORE = "/home/ana/.venv/lib/python3.12/site-packages/cupy/_core"
HEADERS = "// cupy/carray.cuh\n" + "template <typename T> struct CArray { T* data; };\n" * 80  # a long block


@pytest.fixture(scope="module")
def build_kernels():
    spec = importlib.util.spec_from_file_location("build_kernels", ROOT / "packaging" / "build_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class StandInCuPy:
    """CuPy's compiler as far as its cache is concerned (cupy/cuda/compiler.py of CuPy 14): the key is
    the environment (architecture, options with the -I of CuPy's headers by absolute path, NVRTC
    version), the source, CuPy's headers, and its file is SHA-1(key).cubin holding SHA-1(payload) +
    payload, written to CUPY_CACHE_DIR. ``compile`` is what CuPy's own kernels go through."""

    def __init__(self, core_dir: str, cache: Path, arch: str):
        self.core_dir, self.cache, self.arch = core_dir, cache, arch
        self.compiler = types.ModuleType("cupy.cuda.compiler")
        self.compiler._hash_hexdigest = lambda value: hashlib.sha1(value).hexdigest()
        self.compiler._compile_with_cache_cuda = self._compile_with_cache_cuda
        core = types.ModuleType("cupy._core.core")
        core.__file__ = f"{core_dir}/core.cpython-312-x86_64-linux-gnu.so"
        cupy = types.ModuleType("cupy")
        cupy.__version__ = "14.2.0"
        cupy.cuda = types.SimpleNamespace(
            nvrtc=types.SimpleNamespace(getVersion=lambda: (12, 9)), compiler=self.compiler
        )
        self.modules = {
            "cupy": cupy,
            "cupy.cuda": cupy.cuda,
            "cupy.cuda.compiler": self.compiler,
            "cupy._core": types.SimpleNamespace(core=core),
            "cupy._core.core": core,
        }

    def options(self) -> tuple:
        return (f"-I{self.core_dir}/include", f"-I{self.core_dir}/include/cupy/_cccl/libcudacxx")

    def _compile_with_cache_cuda(self, source, options, arch, extra_source=None, backend="nvrtc", *args):
        env = (arch, (*options, "-ftz=true"), (12, 9), backend, f"-arch=sm_{arch}", "cubin")
        key_src = f"{env} //ptx-of-empty {source} {extra_source} 0a1b2c".encode()
        name = self.compiler._hash_hexdigest(key_src) + ".cubin"  # looked up in the module, as CuPy does
        payload = f"cubin of {source[:20]} for sm_{arch}".encode()
        (self.cache / name).write_bytes(hashlib.sha1(payload).hexdigest().encode() + payload)
        return name

    def compile(self, source: str, own: bool) -> str:
        """A kernel: CuPy's own (its headers and -I options) or ours (a RawModule: options only)."""
        options, extra = (self.options(), HEADERS) if own else (("--std=c++17",), None)
        return self.compiler._compile_with_cache_cuda(source, options, self.arch, extra, "nvrtc", False, ("k",))


def cupy_name(core: str, arch: str, label: str) -> str:
    """The file name CuPy at ``core`` computes for one of :data:`SOURCES` (the stand-in's formula, on any machine)."""
    own = label == "elementwise"
    options = (f"-I{core}/include", f"-I{core}/include/cupy/_cccl/libcudacxx") if own else ("--std=c++17",)
    env = (arch, (*options, "-ftz=true"), (12, 9), "nvrtc", f"-arch=sm_{arch}", "cubin")
    key_src = f"{env} //ptx-of-empty {SOURCES[label]} {HEADERS if own else None} 0a1b2c"
    return hashlib.sha1(key_src.encode()).hexdigest() + ".cubin"


SOURCES = {
    "elementwise": "extern C __global__ void cupy_add(...) {}",
    "raw": "typedef float real; __global__ void f() {}",
}


@pytest.fixture
def shipped(tmp_path, build_kernels, monkeypatch) -> Path:
    """A build as build_kernels.py makes it: the capture wraps the (stand-in) compiler of the
    build machine (BUILD_CORE) while two kernels compile for sm_90 and, replayed, one for sm_80;
    then assemble() writes the shipped folders."""
    records, cache, out = tmp_path / "records", tmp_path / "build-cache", tmp_path / "shipped"
    records.mkdir()
    cache.mkdir()
    for arch, labels in (("90", ("elementwise", "raw")), ("80", ("raw",))):
        stand_in = StandInCuPy(BUILD_CORE, cache, arch)
        with monkeypatch.context() as m:
            for name, module in stand_in.modules.items():
                m.setitem(sys.modules, name, module)
            save = build_kernels._install_capture(records)
            atexit.unregister(save)
            for label in labels:
                stand_in.compile(SOURCES[label], own=label == "elementwise")
            save()
    summary = build_kernels.assemble(records, cache, out)
    assert {tag: s["kernels"] for tag, s in summary.items()} == {
        "cupy14.2.0-nvrtc12.9-sm80": 1,
        "cupy14.2.0-nvrtc12.9-sm90": 2,
    }
    return out


def user(arch: str = "90", nvrtc=(12, 9), version: str = "14.2.0") -> kc.Runtime:
    return kc.Runtime(cupy_version=version, nvrtc=nvrtc, arch=arch, cupy_core_dir=USER_CORE)


def test_the_manifest_holds_no_build_path_and_the_long_headers_once(shipped):
    folder = shipped / "cupy14.2.0-nvrtc12.9-sm90"
    raw = gzip.decompress((folder / kc.MANIFEST).read_bytes()).decode()
    assert "/build/env" not in raw
    assert raw.count("struct CArray") == 80  # the block, stored once for both kernels
    assert kc.shipped_tags(shipped) == ["cupy14.2.0-nvrtc12.9-sm80", "cupy14.2.0-nvrtc12.9-sm90"]


def test_installed_kernels_carry_the_names_cupy_computes_on_the_users_machine(shipped, tmp_path):
    target = tmp_path / "user-cache"
    result = kc.install(user("90"), shipped=shipped, target=target)
    assert result["status"] == "installed" and result["installed"] == 2 and result["present"] == 0
    for label in ("elementwise", "raw"):
        payload = (target / cupy_name(USER_CORE, "90", label)).read_bytes()  # under CuPy's name there
        assert payload.endswith(f"cubin of {SOURCES[label][:20]} for sm_90".encode())
        assert payload[:40] == hashlib.sha1(payload[40:]).hexdigest().encode()  # CuPy's own check passes
    # CuPy's own kernel's key names its headers' folder: the build machine's name is not the user's
    assert cupy_name(BUILD_CORE, "90", "elementwise") != cupy_name(USER_CORE, "90", "elementwise")
    assert not (target / cupy_name(BUILD_CORE, "90", "elementwise")).exists()


def test_another_cuda_cupy_or_architecture_gets_nothing(shipped, tmp_path):
    for runtime in (user("90", nvrtc=(12, 4)), user("90", version="13.6.0"), user("89"), user("120", nvrtc=(13, 0))):
        target = tmp_path / runtime.tag
        result = kc.install(runtime, shipped=shipped, target=target)
        assert result["status"] == "none" and result["installed"] == 0
        assert not target.exists()
    assert kc.install(user("80"), shipped=shipped, target=tmp_path / "a100")["installed"] == 1


def test_the_users_cache_folder_is_respected_and_the_installation_is_not_written(shipped, tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "mine"))
    for path in [shipped, *shipped.rglob("*")]:  # an installation the user cannot write to
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before = {p: p.stat().st_mtime_ns for p in shipped.rglob("*")}
    try:
        result = kc.install(user(), shipped=shipped)
    finally:
        for path in [shipped, *shipped.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    assert result["target"] == str(tmp_path / "mine") and result["installed"] == 2
    assert len(list((tmp_path / "mine").glob("*.cubin"))) == 2
    assert {p: p.stat().st_mtime_ns for p in shipped.rglob("*")} == before

    monkeypatch.delenv("CUPY_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert kc.install(user(), shipped=shipped)["target"] == str(tmp_path / "home" / ".cupy" / "kernel_cache")


def test_kernels_cupy_has_are_kept_and_a_second_process_only_sees_the_stamp(shipped, tmp_path):
    target = tmp_path / "user-cache"
    target.mkdir()
    own = target / cupy_name(USER_CORE, "90", "raw")
    own.write_bytes(b"compiled here")
    result = kc.install(user(), shipped=shipped, target=target)
    assert result["installed"] == 1 and result["present"] == 1 and own.read_bytes() == b"compiled here"
    assert kc.install(user(), shipped=shipped, target=target)["status"] == "already"
    assert not list(target.glob(".*.tmp"))  # atomic writes leave no temporary files


@pytest.mark.parametrize("variable, value", [("TRACTLENS_SHIPPED_KERNELS", "0"), ("CUPY_CACHE_IN_MEMORY", "1")])
def test_turned_off_or_a_cupy_that_reads_no_files_installs_nothing(shipped, tmp_path, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    result = kc.install(user(), shipped=shipped, target=tmp_path / "user-cache")
    assert result["status"] == "off" and not (tmp_path / "user-cache").exists()


def test_a_manifest_of_another_layout_is_refused_by_name(shipped, tmp_path):
    folder = shipped / "cupy14.2.0-nvrtc12.9-sm90"
    manifest = json.loads(gzip.decompress((folder / kc.MANIFEST).read_bytes()))
    (folder / kc.MANIFEST).write_bytes(gzip.compress(json.dumps({**manifest, "format": 99}).encode()))
    with pytest.raises(ValueError, match="format 99, expected 1"):
        kc.install(user(), shipped=shipped, target=tmp_path / "user-cache")


def test_the_app_installs_before_cupys_first_kernel_and_a_failing_hook_is_only_logged(monkeypatch, caplog):
    assert kc.install_for in backend._cupy_import_hooks  # registered by importing tractlens.app
    seen = []
    monkeypatch.setattr(backend, "_cupy_import_hooks", [lambda cupy: seen.append(cupy), lambda cupy: 1 / 0])
    with caplog.at_level(logging.WARNING):
        backend._run_cupy_import_hooks("cupy-module")
    assert seen == ["cupy-module"] and "GPU start-up hook" in caplog.text and "division by zero" in caplog.text


def test_the_hook_logs_a_runtime_without_shipped_kernels(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(kc.Runtime, "of", classmethod(lambda cls, cupy: user("75")))
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "c"))
    with caplog.at_level(logging.INFO, logger="tractlens.app.kernel_cache"):
        kc.install_for(object())
    assert "no shipped GPU kernels for cupy14.2.0-nvrtc12.9-sm75" in caplog.text
    assert kc.last_result()["status"] == "none"


def test_the_wheel_ships_the_kernel_cache_folder():
    """The builds lie under resources/kernel_cache/<tag>/ and the wheel's package data takes them."""
    import fnmatch

    text = (ROOT / "pyproject.toml").read_text()
    line = next(x for x in text.splitlines() if x.startswith('"tractlens.resources" = ['))
    patterns = json.loads(line.split("=", 1)[1])
    assert kc.SHIPPED_DIR == ROOT / "resources" / "kernel_cache"
    for name in (kc.MANIFEST, "0123abcd.cubin"):
        assert any(fnmatch.fnmatch(f"kernel_cache/cupy14.2.0-nvrtc12.9-sm90/{name}", p) for p in patterns)
