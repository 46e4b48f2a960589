"""A rehearsal of the GPU commands on the built-in demo, so CuPy's own kernels are compiled too.

:func:`tractlens.gpu.warmup.compile_all` compiles the engine's kernels (``gpu/kernels``), but the
commands also run CuPy's elementwise, reduction and ufunc kernels (``cupy.sum``, arithmetic,
sorting, random numbers...), each compiled by NVRTC at its first use. Where no kernels shipped
with TractLens match the machine (:mod:`app.kernel_cache`), :func:`rehearse` runs each GPU command
once on the demo phantom, in a process of its own, as a user would (``tractlens fit-dti ...
--device gpu``), so CuPy's cache holds them before the user's first command. Some of CuPy's
kernels depend on the size or shape of the data as well; the engine avoids them: its ``nonzero``
goes through :mod:`tractlens.gpu.indices` (CuPy's own takes other kernels for 512 elements or
fewer, and per number of dimensions), the tracking view is in C order whatever the file's
handedness, and CuPy's CUB block reductions, sized by the data, are turned off
(:func:`tractlens.gpu.backend.gpu_status`). Deterministic tracking still runs both from the whole
brain and from a small seed ROI, the sizes users meet; arrays over 2 GiB take
64-bit indexing, which the demo never reaches (the shipped build covers them: packaging/build_kernels.py). The window's
first-start warm-up and ``tractlens info --compile`` call it; a stamp in CuPy's cache folder
records it was done for this TractLens, CuPy and GPU, so it runs once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tractlens import __version__
from tractlens.gpu.cuda import cache_dir

log = logging.getLogger(__name__)

#: Bumped when the commands below change (a new stamp: the rehearsal runs again).
REHEARSAL_VERSION = 2


def commands(demo: Path, work: Path, device: str = "gpu") -> list[tuple[str, list[str]]]:
    """(label, argv) of every GPU command, on the demo in ``demo``, writing under ``work``."""
    dwi, mask, seed = str(demo / "dwi.nii.gz"), str(demo / "mask.nii.gz"), str(demo / "roi_arc_seed.nii.gz")
    dti, bs, csd, det = str(work / "dti"), str(work / "bedpostx"), str(work / "csd"), str(work / "det.trk")
    d = ["--device", device, "--quiet"]
    few = ["--burnin", "10", "--njumps", "40", "--sampleevery", "4"]
    return [
        ("fit-dti", ["fit-dti", dwi, "--mask", mask, "-o", dti, *d]),
        ("track deterministic", ["track", "deterministic", "--tensor", dti, "--whole-brain", "--mask", mask, "-o", det, *d]),
        # a seed ROI of 40 voxels: the small size users meet (CuPy's nonzero would switch kernels there)
        ("track deterministic (seed ROI)", ["track", "deterministic", "--tensor", dti, "--seed", seed, "-o", str(work / "roi.trk"), *d]),
        ("commit", ["commit", "--dwi", dwi, "--tractogram", det, "-o", str(work / "commit"), *d]),
        ("fit-ballstick", ["fit-ballstick", dwi, "--mask", seed, "-o", bs, *few, *d]),  # a few voxels: kernels, not maps
        ("track probabilistic", ["track", "probabilistic", "--samples", bs, "--seed", seed, "--nsamples", "20", "-o", str(work / "prob"), *d]),
        ("track geodesic", ["track", "geodesic", "--tensor", dti, "--seed", seed, "-o", str(work / "geo.trk"), *d]),
        ("fit-csd", ["fit-csd", dwi, "--mask", seed, "-o", csd, *d]),
        ("track fod-probabilistic", ["track", "fod-probabilistic", "--fod", csd, "--seed", seed, "-o", str(work / "fod.trk"), *d]),
    ]  # fmt: skip


def program() -> list[str]:
    """How to start ``tractlens`` here: the bundle's own program, or this Python with the CLI module."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "tractlens.app.cli"]


def stamp(gpu: str) -> Path:
    """The file recording a finished rehearsal for this TractLens, CuPy and ``gpu`` (its name)."""
    cupy = sys.modules.get("cupy")
    what = f"{REHEARSAL_VERSION}|{__version__}|{getattr(cupy, '__version__', '?')}|{gpu}"
    return cache_dir() / f".tractlens-rehearsed-{hashlib.sha1(what.encode()).hexdigest()[:16]}"


def rehearse(
    gpu: str,
    progress: Callable[[int, int, str], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    *,
    device: str = "gpu",
    run: Callable[[list[str]], subprocess.Popen] | None = None,
) -> dict:
    """Run :func:`commands` once each (skipped when :func:`stamp` exists). Returns ``{"ran": [...],
    "failed": [...], "seconds": s, "skipped": bool, "cancelled": bool}``. A failing command is
    logged and the rest go on (the user's own command then meets it). ``run`` replaces
    starting the process (tests)."""
    done = stamp(gpu)
    result = {"ran": [], "failed": [], "seconds": 0.0, "skipped": done.exists(), "cancelled": False}
    if result["skipped"]:
        return result
    from .demo import demo_path

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tractlens-rehearsal-") as work:
        errors = Path(work) / "stderr.txt"

        def start_process(argv: list[str]) -> subprocess.Popen:
            with open(errors, "wb") as err:  # a file, not a pipe: a chatty command cannot block on it
                return subprocess.Popen([*program(), *argv], stdout=subprocess.DEVNULL, stderr=err)

        run = run or start_process
        plan = commands(demo_path(), Path(work), device)
        for i, (label, argv) in enumerate(plan):
            if cancelled is not None and cancelled():
                result["cancelled"] = True
                break
            proc = run(argv)
            while proc.poll() is None:
                if cancelled is not None and cancelled():
                    proc.terminate()
                    proc.wait()
                    result["cancelled"] = True
                    break
                time.sleep(0.1)
            if result["cancelled"]:
                break
            if proc.returncode == 0:
                result["ran"].append(label)
            else:
                err = errors.read_text(errors="replace")[-400:] if errors.exists() else ""
                log.warning("GPU rehearsal: %s failed (%s): %s", label, proc.returncode, err)
                result["failed"].append(label)
            if progress is not None:
                progress(i + 1, len(plan), label)
    result["seconds"] = time.perf_counter() - start
    if not result["cancelled"]:
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(f"{result['ran']}\n")
    log.info("GPU rehearsal: %d commands in %.1f s", len(result["ran"]), result["seconds"])
    return result


def needed() -> bool:
    """Whether a rehearsal is worth it here: no shipped build matched this machine (then the
    user's cache already holds every kernel the commands use), and not turned off
    (``TRACTLENS_REHEARSAL=0``)."""
    from .kernel_cache import last_result

    if os.environ.get("TRACTLENS_REHEARSAL", "1").strip().lower() in ("0", "no", "false", "off"):
        return False
    return last_result().get("status") not in ("installed", "already")
