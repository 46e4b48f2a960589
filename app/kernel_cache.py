"""Kernels compiled ahead of time, shipped with TractLens, installed into CuPy's kernel cache.

CuPy compiles every kernel with NVRTC at its first use (our ``gpu/kernels`` and its own
elementwise and reduction kernels alike) and keeps the result in its on-disk cache
(``CUPY_CACHE_DIR``, by default ``~/.cupy/kernel_cache``), one file per kernel named by the SHA-1
of a *key*: the source, the options, the GPU architecture, the NVRTC version, the NVRTC build's
own banner (the comment lines of an empty file's PTX) and CuPy's headers. The options hold
absolute paths (``-I``): CuPy's header folders, inside its package, and the folder of CUDA's
headers (``cuda_runtime.h``), wherever CuPy finds it (an NVIDIA wheel, conda, ``CUDA_PATH``,
``/usr/local/cuda``); every kernel, ours (``RawModule``) and CuPy's own, gets them. So a file
compiled on the build machine is named differently from the one a user's CuPy looks for.

``packaging/build_kernels.py`` (run on a build machine with a GPU) records each key with those
paths replaced by markers and ships the compiled files with the key templates
(``resources/kernel_cache/<tag>/``, :data:`MANIFEST`). At the first GPU use of a process
(:func:`tractlens.gpu.backend.on_cupy_import`), :func:`install` finds the build whose tag
matches the CuPy version, the NVRTC version and the GPU's architecture here (another CUDA
version's build is simply not used; nor is a build of another NVRTC release of the same version,
whose banner differs), fills the markers with this CuPy's folders, and puts every
kernel CuPy does not already have into CuPy's cache folder under the name CuPy will look for
(a hard link to the shipped file where the file system allows it, else a copy): the user's
folder, or the one ``CUPY_CACHE_DIR`` names. Nothing is written into the installation. A
stamp file in the cache folder makes later processes skip the work. CuPy checks each file's
own SHA-1 when it reads it, and an entry whose key does not match simply goes unused: the
worst a wrong entry costs is a compilation, as without shipped kernels.

``TRACTLENS_SHIPPED_KERNELS=0`` turns it off (``TRACTLENS_SHIPPED_KERNELS_DIR`` reads the builds from
another folder); so does ``CUPY_CACHE_IN_MEMORY=1`` (CuPy then
reads no files).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tractlens.gpu.cuda import cache_dir
from tractlens.resources import RESOURCES

from .timing import recorder

log = logging.getLogger(__name__)

#: The folder of the shipped builds (package data; read only).
SHIPPED_DIR = RESOURCES / "kernel_cache"
#: Names another folder of builds (a builder checking a build before shipping it).
ENV_SHIPPED = "TRACTLENS_SHIPPED_KERNELS_DIR"
#: Each build's key templates and file names (gzip JSON), beside the compiled files.
MANIFEST = "manifest.json.gz"
#: The manifest layout this module reads (2: CUDA's header folder has a marker of its own).
FORMAT = 2
#: Markers in the key templates, replaced by this machine's values.
CUPY_CORE_MARK = "\x00tractlens:cupy_core\x00"  # os.path.dirname(cupy._core.core.__file__)
#: The i-th ``-I`` folder CuPy adds outside its own package (CUDA's headers), by position.
INCLUDE_MARK = "\x00tractlens:include:{}\x00"
#: The environment variable that turns the installation off (``0``).
ENV_SWITCH = "TRACTLENS_SHIPPED_KERNELS"


@dataclass(frozen=True)
class Runtime:
    """What a CuPy cache key depends on here, besides the kernel itself."""

    cupy_version: str
    nvrtc: tuple[int, int]
    arch: str  # compute capability as CuPy writes it, e.g. "90"
    cupy_core_dir: str
    #: The ``-I`` folders CuPy adds to every kernel's options outside its own package, in
    #: order (CUDA's headers: :func:`cupy_include_dirs`).
    include_dirs: tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        """The name of the shipped build made for this runtime."""
        return build_tag(self.cupy_version, self.nvrtc, self.arch)

    @classmethod
    def of(cls, cupy) -> Runtime:
        """The runtime of the imported ``cupy`` module (its current device)."""
        from cupy._core import core  # the module whose folder CuPy's -I options name

        major, minor = cupy.cuda.nvrtc.getVersion()
        try:  # the architecture CuPy compiles for: the GPU's, capped at what this NVRTC knows
            from cupy.cuda.compiler import _get_arch

            arch = str(_get_arch())
        except (ImportError, AttributeError):
            arch = str(cupy.cuda.Device().compute_capability)
        return cls(
            cupy_version=str(cupy.__version__),
            nvrtc=(int(major), int(minor)),
            arch=arch,
            cupy_core_dir=os.path.dirname(os.path.abspath(core.__file__)),
            include_dirs=cupy_include_dirs(core),
        )


def cupy_include_dirs(core) -> tuple[str, ...]:
    """The ``-I`` folders CuPy's ``core`` adds to every kernel's options that lie outside its own
    package: CUDA's headers, found by ``cuda.pathfinder`` (CuPy 14) or under ``CUDA_PATH``. They are
    in every key, and they differ between machines independently of where CuPy is. Empty for a
    CuPy without ``assemble_cupy_compiler_options`` or when it finds no headers (then it cannot
    compile either)."""
    try:
        options = core.assemble_cupy_compiler_options(())
    except (AttributeError, RuntimeError, ImportError, OSError):
        return ()
    own = os.path.dirname(os.path.abspath(core.__file__))
    dirs = (o[2:] for o in options if isinstance(o, str) and o.startswith("-I"))
    return tuple(d for d in dirs if d != own and not d.startswith(own + os.sep))


def compiler_banner(arch: str) -> str | None:
    """What CuPy puts into every key to tell NVRTC builds apart: the comment lines of the PTX of an
    empty file (``cupy.cuda.compiler._preprocess``; "Cuda compilation tools, release 12.9,
    V12.9.86", the compiler's build id). ``None`` where it cannot be had (then it is not checked)."""
    try:
        from cupy.cuda import compiler

        return compiler._preprocess("", (), arch, "nvrtc")
    except Exception as exc:  # any failure only skips the check
        log.debug("the NVRTC banner could not be read: %s", exc)
        return None


def shipped_dir() -> Path:
    """The folder of the shipped builds (:data:`SHIPPED_DIR`, or the one :data:`ENV_SHIPPED` names)."""
    return Path(os.environ.get(ENV_SHIPPED) or SHIPPED_DIR)


def build_tag(cupy_version: str, nvrtc: tuple[int, int], arch: str) -> str:
    """``cupy<version>-nvrtc<major>.<minor>-sm<arch>``: one shipped build's folder name."""
    return f"cupy{cupy_version}-nvrtc{nvrtc[0]}.{nvrtc[1]}-sm{arch}"


def template(key_src: str, runtime: Runtime) -> str:
    """A key with this machine's paths replaced by markers (the build side): each of
    :attr:`Runtime.include_dirs` as a whole ``-I`` option of the key's option tuple, then CuPy's
    own folder wherever it appears (its header folders are under it)."""
    for i, folder in enumerate(runtime.include_dirs):
        key_src = key_src.replace(f"'-I{folder}'", f"'-I{INCLUDE_MARK.format(i)}'")
    return key_src.replace(runtime.cupy_core_dir, CUPY_CORE_MARK)


def fill(key_template: str, runtime: Runtime, blocks: dict[str, str]) -> str:
    """The key CuPy computes here for a shipped template."""
    for mark, text in blocks.items():
        key_template = key_template.replace(mark, text)
    for i, folder in enumerate(runtime.include_dirs):
        key_template = key_template.replace(INCLUDE_MARK.format(i), folder)
    return key_template.replace(CUPY_CORE_MARK, runtime.cupy_core_dir)


def _fill_paths(text: str, runtime: Runtime) -> str:
    """:func:`fill`'s replacements of this machine's folders alone (no blocks)."""
    for i, folder in enumerate(runtime.include_dirs):
        text = text.replace(INCLUDE_MARK.format(i), folder)
    return text.replace(CUPY_CORE_MARK, runtime.cupy_core_dir)


def cache_names(entries: list[dict], runtime: Runtime, blocks: dict[str, str]) -> list[str]:
    """``cache_name(fill(entry["key"], runtime, blocks), entry["suffix"])`` for every entry, the
    same names at a fraction of the cost: each key holds CuPy's header source (a block of about
    200 KB), which :func:`fill` copies and scans once per marker and entry (a quarter of a
    second for a build of 240 kernels, on the first GPU command's path); here each block is
    filled and encoded once, and each key is hashed piece by piece."""
    filled = {mark: _fill_paths(text, runtime).encode("utf-8") for mark, text in blocks.items()}
    split = re.compile("(" + "|".join(map(re.escape, filled)) + ")") if filled else None
    names = []
    for entry in entries:
        digest = hashlib.sha1(usedforsecurity=False)
        for piece in split.split(entry["key"]) if split else (entry["key"],):
            block = filled.get(piece)
            digest.update(block if block is not None else _fill_paths(piece, runtime).encode("utf-8"))
        names.append(digest.hexdigest() + entry["suffix"])
    return names


def build_paths(runtime: Runtime) -> list[str]:
    """Folders of the build machine that must not be left in a key template (:func:`leftovers`):
    the folder holding CuPy, CUDA's header folders and their parents, this Python's prefixes."""
    found = {os.path.dirname(os.path.dirname(runtime.cupy_core_dir)), sys.prefix, sys.base_prefix}
    for folder in runtime.include_dirs:
        found |= {folder, os.path.dirname(folder)}
    return sorted(p for p in found if p and p != os.sep and len(p) > 4)


def leftovers(key_template: str, paths: list[str]) -> list[str]:
    """The ``paths`` a key template still holds (each one a kernel a user's CuPy would not find
    when its folders differ)."""
    return [p for p in paths if p in key_template]


def cache_name(key: str, suffix: str) -> str:
    """CuPy's file name for a key (SHA-1 of its UTF-8 text, and ``.cubin``/``.ltoir``)."""
    return hashlib.sha1(key.encode("utf-8"), usedforsecurity=False).hexdigest() + suffix


def read_manifest(folder: Path) -> dict:
    """A shipped build's manifest; ``ValueError`` for a layout this module does not read."""
    with gzip.open(folder / MANIFEST, "rt", encoding="utf-8") as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{folder / MANIFEST}: format {manifest.get('format')!r}, expected {FORMAT}")
    return manifest


def enabled() -> bool:
    """Whether shipped kernels are installed (not turned off, and CuPy reads its cache from disk)."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "no", "false", "off"):
        return False
    return os.environ.get("CUPY_CACHE_IN_MEMORY", "0").strip().lower() not in ("1", "yes", "true", "on")


def _stamp(target: Path, folder: Path, runtime: Runtime) -> Path:
    """The file recording that ``folder`` was installed into ``target`` for this CuPy (and CUDA's headers)."""
    what = f"{folder.resolve()}|{(folder / MANIFEST).stat().st_size}|{runtime.cupy_core_dir}|{runtime.include_dirs}"
    digest = hashlib.sha1(what.encode(), usedforsecurity=False).hexdigest()[:16]
    return target / f".tractlens-shipped-{runtime.tag}-{digest}"


def _put(source: Path, dest: Path) -> None:
    """``source`` at ``dest``: a hard link where the file system allows one (no bytes copied;
    CuPy replaces a cache file by renaming, never writes into it), else an atomic copy (temp
    file and rename). An existing ``dest`` is kept."""
    try:
        os.link(source, dest)
        return
    except FileExistsError:
        return
    except OSError:  # another file system, links not allowed (protected_hardlinks), Windows
        pass
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(source.read_bytes())
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def install(
    runtime: Runtime,
    *,
    shipped: Path | None = None,
    target: Path | None = None,
    banner: Callable[[], str | None] | None = None,
) -> dict:
    """Copy the shipped build for ``runtime`` into CuPy's cache folder ``target`` (default: the one
    CuPy uses, :func:`tractlens.gpu.cuda.cache_dir`), each kernel under the name CuPy computes here.

    ``banner`` gives this NVRTC's banner (:func:`compiler_banner`; asked only when there is
    something to install): a build made by another NVRTC release is not installed, as CuPy
    would not find its files.

    Returns ``{"tag", "status", "installed", "present", "target", "reason"}`` (and ``seconds``
    the installation took, when it installed); status is ``installed``, ``already`` (a stamp
    says it was done), ``none`` (no build for this runtime; ``reason`` says why), or ``off``.
    Files CuPy already has are left alone; each kernel is a hard link to the shipped file where
    the file system allows it, else an atomic copy (temp file and rename)."""
    start = time.perf_counter()
    shipped = shipped_dir() if shipped is None else Path(shipped)
    target = cache_dir() if target is None else Path(target)
    result = {"tag": runtime.tag, "status": "none", "installed": 0, "present": 0, "target": str(target), "reason": ""}
    if not enabled():
        return {**result, "status": "off"}
    folder = shipped / runtime.tag
    if not (folder / MANIFEST).is_file():
        return {**result, "reason": f"no build {runtime.tag} is shipped"}
    stamp = _stamp(target, folder, runtime)
    if stamp.exists():
        return {**result, "status": "already"}
    manifest = read_manifest(folder)
    if manifest.get("include_dirs", 0) != len(runtime.include_dirs):
        reason = (
            f"the build's CuPy added {manifest.get('include_dirs', 0)} header folders outside its package, "
            f"this one adds {len(runtime.include_dirs)}"
        )
        return {**result, "reason": reason}
    built_with = manifest.get("compiler")
    here = banner() if (banner is not None and built_with) else None
    if built_with and here is not None and here != built_with:
        return {**result, "reason": f"another NVRTC release built it ({_release(built_with)}; here {_release(here)})"}
    target.mkdir(parents=True, exist_ok=True)
    entries = manifest["entries"]
    present = set(os.listdir(target))
    for entry, name in zip(entries, cache_names(entries, runtime, manifest.get("blocks", {}))):
        if name in present:
            result["present"] += 1
            continue
        _put(folder / entry["file"], target / name)
        result["installed"] += 1
    stamp.write_text(json.dumps({"tag": runtime.tag, "kernels": len(entries)}) + "\n")
    return {**result, "status": "installed", "seconds": round(time.perf_counter() - start, 4)}


def _release(banner: str) -> str:
    """The line of an NVRTC banner that names the release (for messages)."""
    lines = [line.strip("/ ") for line in banner.splitlines() if "release" in line or "Build ID" in line]
    return "; ".join(lines) or banner.strip()[:80]


def shipped_tags(shipped: Path | None = None) -> list[str]:
    """The builds shipped with this installation (``tractlens info`` lists them)."""
    shipped = shipped_dir() if shipped is None else Path(shipped)
    if not shipped.is_dir():
        return []
    return sorted(p.name for p in shipped.iterdir() if (p / MANIFEST).is_file())


_last: dict = {}


def install_for(cupy) -> None:
    """The hook :mod:`tractlens.app` registers with :func:`tractlens.gpu.backend.on_cupy_import`:
    :func:`install` for the imported CuPy; a failure is logged (the kernels then compile as usual)."""
    if not enabled():
        return
    try:
        runtime = Runtime.of(cupy)
        result = install(runtime, banner=lambda: compiler_banner(runtime.arch))
    except (OSError, ValueError, KeyError) as exc:
        log.warning("the shipped GPU kernels could not be installed into CuPy's cache: %s", exc)
        return
    _last.update(result)
    if "seconds" in result:  # in the command's timings (details_s), for the whole-command benchmark
        recorder().detail("gpu_warmup", {"shipped_kernels_install": result["seconds"]})
    if result["status"] == "installed":
        log.info("installed %d shipped GPU kernels (%s) into %s", result["installed"], result["tag"], result["target"])
    elif result["status"] == "none":
        log.info(
            "no shipped GPU kernels for %s (%s): kernels are compiled at first use", result["tag"], result["reason"]
        )


def last_result() -> dict:
    """What :func:`install_for` did in this process (empty before the first GPU use)."""
    return dict(_last)
