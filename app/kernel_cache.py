"""Kernels compiled ahead of time, shipped with TractLens, installed into CuPy's kernel cache.

CuPy compiles every kernel with NVRTC at its first use (our ``gpu/kernels`` and its own
elementwise and reduction kernels alike) and keeps the result in its on-disk cache
(``CUPY_CACHE_DIR``, by default ``~/.cupy/kernel_cache``), one file per kernel named by the SHA-1
of a *key*: the source, the options, the GPU architecture, the NVRTC version and CuPy's headers.
The key also holds the absolute path of CuPy's header folder (an ``-I`` option), so a file
compiled on the build machine is named differently from the one a user's CuPy looks for.

``packaging/build_kernels.py`` (run on a build machine with a GPU) records each key with that
path replaced by a marker and ships the compiled files with the key templates
(``resources/kernel_cache/<tag>/``, :data:`MANIFEST`). At the first GPU use of a process
(:func:`tractlens.gpu.backend.on_cupy_import`), :func:`install` finds the build whose tag
matches the CuPy version, the NVRTC version and the GPU's architecture here (another CUDA
version's build is simply not used), fills the markers with this CuPy's path, and copies every
kernel CuPy does not already have into CuPy's cache folder under the name CuPy will look for:
the user's folder, or the one ``CUPY_CACHE_DIR`` names. Nothing is written into the
installation. A stamp file in the cache folder makes later processes skip the work. CuPy checks
each file's own SHA-1 when it reads it, and an entry whose key does not match simply goes
unused: the worst a wrong entry costs is a compilation, as without shipped kernels.

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
from dataclasses import dataclass
from pathlib import Path

from tractlens.gpu.cuda import cache_dir
from tractlens.resources import RESOURCES

log = logging.getLogger(__name__)

#: The folder of the shipped builds (package data; read only).
SHIPPED_DIR = RESOURCES / "kernel_cache"
#: Names another folder of builds (a builder checking a build before shipping it).
ENV_SHIPPED = "TRACTLENS_SHIPPED_KERNELS_DIR"
#: Each build's key templates and file names (gzip JSON), beside the compiled files.
MANIFEST = "manifest.json.gz"
#: The manifest layout this module reads.
FORMAT = 1
#: Markers in the key templates, replaced by this machine's values.
CUPY_CORE_MARK = "\x00tractlens:cupy_core\x00"  # os.path.dirname(cupy._core.core.__file__)
SITE_MARK = "\x00tractlens:site\x00"  # the folder holding the cupy package
#: The environment variable that turns the installation off (``0``).
ENV_SWITCH = "TRACTLENS_SHIPPED_KERNELS"


@dataclass(frozen=True)
class Runtime:
    """What a CuPy cache key depends on here, besides the kernel itself."""

    cupy_version: str
    nvrtc: tuple[int, int]
    arch: str  # compute capability as CuPy writes it, e.g. "90"
    cupy_core_dir: str

    @property
    def tag(self) -> str:
        """The name of the shipped build made for this runtime."""
        return build_tag(self.cupy_version, self.nvrtc, self.arch)

    @property
    def site_dir(self) -> str:
        return os.path.dirname(os.path.dirname(self.cupy_core_dir))

    @classmethod
    def of(cls, cupy) -> Runtime:
        """The runtime of the imported ``cupy`` module (its current device)."""
        from cupy._core import core  # the module whose folder CuPy's -I option names

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
        )


def shipped_dir() -> Path:
    """The folder of the shipped builds (:data:`SHIPPED_DIR`, or the one :data:`ENV_SHIPPED` names)."""
    return Path(os.environ.get(ENV_SHIPPED) or SHIPPED_DIR)


def build_tag(cupy_version: str, nvrtc: tuple[int, int], arch: str) -> str:
    """``cupy<version>-nvrtc<major>.<minor>-sm<arch>``: one shipped build's folder name."""
    return f"cupy{cupy_version}-nvrtc{nvrtc[0]}.{nvrtc[1]}-sm{arch}"


def template(key_src: str, cupy_core_dir: str) -> str:
    """A key with this machine's CuPy paths replaced by markers (the build side)."""
    site = os.path.dirname(os.path.dirname(cupy_core_dir))
    return key_src.replace(cupy_core_dir, CUPY_CORE_MARK).replace(site, SITE_MARK)


def fill(key_template: str, runtime: Runtime, blocks: dict[str, str]) -> str:
    """The key CuPy computes here for a shipped template."""
    for mark, text in blocks.items():
        key_template = key_template.replace(mark, text)
    return key_template.replace(CUPY_CORE_MARK, runtime.cupy_core_dir).replace(SITE_MARK, runtime.site_dir)


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
    """The file recording that ``folder`` was installed into ``target`` for this CuPy."""
    what = f"{folder.resolve()}|{(folder / MANIFEST).stat().st_size}|{runtime.cupy_core_dir}"
    digest = hashlib.sha1(what.encode(), usedforsecurity=False).hexdigest()[:16]
    return target / f".tractlens-shipped-{runtime.tag}-{digest}"


def _copy_atomic(source: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(source.read_bytes())
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def install(runtime: Runtime, *, shipped: Path | None = None, target: Path | None = None) -> dict:
    """Copy the shipped build for ``runtime`` into CuPy's cache folder ``target`` (default: the one
    CuPy uses, :func:`tractlens.gpu.cuda.cache_dir`), each kernel under the name CuPy computes here.

    Returns ``{"tag", "status", "installed", "present", "target"}``; status is ``installed``,
    ``already`` (a stamp says it was done), ``none`` (no build for this runtime), or ``off``.
    Files CuPy already has are left alone; writes are atomic (temp file and rename)."""
    shipped = shipped_dir() if shipped is None else Path(shipped)
    target = cache_dir() if target is None else Path(target)
    result = {"tag": runtime.tag, "status": "none", "installed": 0, "present": 0, "target": str(target)}
    if not enabled():
        return {**result, "status": "off"}
    folder = shipped / runtime.tag
    if not (folder / MANIFEST).is_file():
        return result
    stamp = _stamp(target, folder, runtime)
    if stamp.exists():
        return {**result, "status": "already"}
    manifest = read_manifest(folder)
    target.mkdir(parents=True, exist_ok=True)
    blocks = manifest.get("blocks", {})
    for entry in manifest["entries"]:
        dest = target / cache_name(fill(entry["key"], runtime, blocks), entry["suffix"])
        if dest.exists():
            result["present"] += 1
            continue
        _copy_atomic(folder / entry["file"], dest)
        result["installed"] += 1
    stamp.write_text(json.dumps({"tag": runtime.tag, "kernels": len(manifest["entries"])}) + "\n")
    return {**result, "status": "installed"}


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
        result = install(Runtime.of(cupy))
    except (OSError, ValueError, KeyError) as exc:
        log.warning("the shipped GPU kernels could not be installed into CuPy's cache: %s", exc)
        return
    _last.update(result)
    if result["status"] == "installed":
        log.info("installed %d shipped GPU kernels (%s) into %s", result["installed"], result["tag"], result["target"])
    elif result["status"] == "none":
        log.info("no shipped GPU kernels for %s: kernels are compiled at first use", result["tag"])


def last_result() -> dict:
    """What :func:`install_for` did in this process (empty before the first GPU use)."""
    return dict(_last)
