"""Benchmark: the whole commands of issue 30 on an HCP-sized synthetic subject, as a user runs them.

    python tests/benchmarks/bench_e2e.py --outdir /scratch/e2e --make-only          # the subject (< 2 min)
    python tests/benchmarks/bench_e2e.py --outdir /scratch/e2e --commands fit-dti,fit-ballstick
    python tests/benchmarks/bench_e2e.py --outdir /scratch/e2e --commands track-det,commit --sizes 1,0.5
    python tests/benchmarks/bench_e2e.py --quick --outdir /tmp/e2e-quick --device cpu  # a small check, anywhere

The subject (made once into ``--outdir`` and reused: ``subject.json`` records what was made)
is deterministic for a seed: 145×174×145 voxels of 1.25 mm, 288 volumes (18 b=0 spread through
the series, 90 directions each at b=1000, 2000 and 3000 s/mm² drawn from a fixed-seed uniform
sphere), float32 ``dwi.nii`` (``--gzip``: ``dwi.nii.gz``), an ellipsoidal brain ``mask.nii.gz`` of
about 1.02 M voxels, and three crossing bundles: left-right arcs in a central coronal band (as a
corpus callosum), anterior-posterior lines in the middle (cingulum-like), superior-inferior lines
laterally (corticospinal-like). Signal: ball & sticks (the bedpostX model), d = 1.5e-3 mm²/s,
S0 = 1000, Rician noise at SNR 25. Volumes are computed by a pool of threads and written one
after the other in the file's own order, so making the subject needs a few hundred MB.
``bedpostx/`` holds 50 posterior samples of the 3 true sticks (directions spread by ~3°,
fractions by 5 %), written the same streaming way; ``seed.nii.gz`` is a 6×6×6 (216-voxel) cube in
the arcs; ``mask_s<scale>.nii.gz`` a random subset of the brain holding that fraction of it.

Commands (``--commands``, default all), each a fresh ``python -m tractlens.app.cli`` process:

=============  ====================================================================================
fit-dti        ``fit-dti dwi.nii --mask MASK``
fit-ballstick  ``fit-ballstick dwi.nii --mask MASK`` (FSL's defaults; ``--quick``: fewer iterations)
track-prob     ``track probabilistic --samples bedpostx --seed seed.nii.gz --nsamples 5000×scale``
track-prob-wb  ``track probabilistic --samples bedpostx --seed MASK --nsamples 10`` (whole brain)
track-det      ``track deterministic --tensor <fit-dti output> --whole-brain --mask mask.nii.gz`` to
               ``.trx`` (below scale 1: ``--seed MASK`` instead of ``--whole-brain``)
commit         ``commit --dwi dwi.nii --tractogram <track-det's .trx of the same scale>``
=============  ====================================================================================

MASK is the whole brain at scale 1 and ``mask_s<scale>`` below it (``--sizes 1,0.5``), so two
sizes give the memory slope per voxel, streamline, point or segment. track-det needs fit-dti's
tensors (made at scale 1 first when missing) and commit needs track-det's tractogram.

Measured per command: wall time of the process; peak host memory of its process tree (RSS of
the process and its children, polled every 50 ms from /proc, and ``ru_maxrss`` from ``wait4``);
peak device memory (``nvidia-smi`` polled every 100 ms, minus the memory used before the start,
and CuPy's pool high-water mark that the command reports); the split into read / compute /
write that the command records (:mod:`tractlens.app.timing`, through ``$TRACTLENS_TIMINGS``);
the GPU work as the command's own summary gives it.

``--cold`` measures what the CUDA compiler costs a first use: before each command's first run the
kernel cache (``CUPY_CACHE_DIR``: ``--kernel-cache``, or ``<outdir>/cold/cupy``) is emptied, so that
run starts with only the kernels shipped with TractLens (``app/kernel_cache.py``;
``--no-shipped-kernels`` leaves those out too); the second run, warm, reuses what the first left.
``--cold-data`` also empties TractLens's own cache (``TRACTLENS_CACHE``, ``<outdir>/cold/tractlens``:
the bedpostX folder's cache that a first read builds), as on a fresh machine. Each row then gives
``cold_s``, ``warm_s``, their ratio, and how many kernels the cold run compiled (files CuPy added
to its cache beyond the shipped ones) and their names (the commands run with
``CUPY_CACHE_SAVE_CUDA_SOURCE=1``: CuPy keeps each compiled kernel's source beside it), and a table
of them is printed at the end; ``--first-run-summary FILE`` writes them as issue 43's result. Results
merge into ``<results>/e2e_<gpu>.json`` and ``.md`` (``--quick``: ``e2e_<gpu>_quick``; ``--small``:
``e2e_<gpu>_small``), so runs in parts add up. ``--small`` is a clinical-sized subject (48×56×48
voxels of 2 mm, 65 volumes) that no shipped kernel was built on, for a quick first-run check
(tests/benchmarks/first_run_on_gpu.sh quick).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(ROOT))
COMMANDS = ("fit-dti", "fit-ballstick", "track-prob", "track-prob-wb", "track-det", "commit")
SUBJECT_VERSION = 1
D_BALL = 1.5e-3  # mm²/s, the sticks' and the ball's diffusivity
S0, SNR = 1000.0, 25.0


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# ----------------------------------------------------------------------------- the subject
@dataclass(frozen=True)
class SubjectSpec:
    shape: tuple[int, int, int] = (145, 174, 145)
    voxel_mm: float = 1.25
    shells: tuple[float, ...] = (1000.0, 2000.0, 3000.0)
    per_shell: int = 90
    n_b0: int = 18
    semi_axes: tuple[float, float, float] = (60.0, 72.0, 56.4)  # voxels: 4/3·π·abc ≈ 1.02 M
    seed_side: int = 6  # the seed ROI: a cube of side³ voxels
    n_samples: int = 50  # bedpostX posterior samples
    seed: int = 20261124
    gzip: bool = False

    @property
    def n_volumes(self) -> int:
        return self.n_b0 + self.per_shell * len(self.shells)


QUICK = SubjectSpec(shape=(24, 28, 24), per_shell=10, n_b0=2, semi_axes=(10.0, 12.0, 9.5), seed_side=3, n_samples=10)
#: ``--small``: a clinical-sized scan unlike the subjects packaging/build_kernels.py builds its kernels
#: on (QUICK, its 182-volume twin) and the demo (56×56×24, 68 volumes): 48×56×48 voxels of 2 mm,
#: 65 volumes (5 b=0, 30 directions at b=1000 and 2000), about 38,000 brain voxels.
SMALL = SubjectSpec(
    shape=(48, 56, 48), voxel_mm=2.0, shells=(1000.0, 2000.0), per_shell=30, n_b0=5,
    semi_axes=(20.0, 24.0, 19.0), seed_side=4, n_samples=10,
)  # fmt: skip


def gradient_table(spec: SubjectSpec) -> tuple[np.ndarray, np.ndarray]:
    """bvals (n,), unit bvecs (n, 3): b=0 spread evenly through the series, each shell's
    directions uniform on the sphere (fixed seed)."""
    rng = np.random.default_rng([spec.seed, 1])
    weighted_b, weighted_g = [], []
    for b in spec.shells:
        g = rng.normal(size=(spec.per_shell, 3))
        weighted_g.append(g / np.linalg.norm(g, axis=1, keepdims=True))
        weighted_b.append(np.full(spec.per_shell, b))
    wb, wg = np.concatenate(weighted_b), np.concatenate(weighted_g)
    order = rng.permutation(len(wb))  # shells interleaved, as scanners acquire them
    wb, wg = wb[order], wg[order]
    n = spec.n_volumes
    b0_at = np.round(np.linspace(0, n - 1, spec.n_b0)).astype(int)
    bvals, bvecs = np.zeros(n), np.zeros((n, 3))
    rest = np.setdiff1d(np.arange(n), b0_at)
    bvals[rest], bvecs[rest] = wb, wg
    return bvals, bvecs


def affine(spec: SubjectSpec) -> np.ndarray:
    """LAS (det < 0, as FSL's standard space and HCP): FSL's bvec frame is the voxel frame."""
    a = np.diag([-spec.voxel_mm, spec.voxel_mm, spec.voxel_mm, 1.0])
    a[:3, 3] = [spec.voxel_mm * (spec.shape[0] - 1) / 2, *(-spec.voxel_mm * (np.array(spec.shape[1:]) - 1) / 2)]
    return a


def brain_mask(spec: SubjectSpec) -> np.ndarray:
    grid = np.ogrid[tuple(slice(0, s) for s in spec.shape)]
    centre = (np.array(spec.shape) - 1) / 2
    r2 = sum(((g - c) / a) ** 2 for g, c, a in zip(grid, centre, spec.semi_axes, strict=True))
    return r2 <= 1.0


def _unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)


def fibre_configuration(spec: SubjectSpec, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stick directions (n, 3 bundles, 3) in voxel axes and fractions (n, 3) of the brain's voxels
    (``np.nonzero(mask)`` order), the largest fraction first."""
    centre = (np.array(spec.shape) - 1) / 2
    p = np.stack(np.nonzero(mask), axis=1).astype(np.float64) - centre
    u = p / np.array(spec.semi_axes)  # -1..1 inside the brain
    z0 = -0.6 * spec.semi_axes[2]  # the arcs' axis: parallel to y, below the centre
    arcs = _unit(np.stack([-(p[:, 2] - z0), np.zeros(len(p)), p[:, 0]], axis=1))
    ap = _unit(np.stack([0.15 * np.sin(np.pi * u[:, 2]), np.ones(len(p)), 0.15 * np.sin(np.pi * u[:, 0])], axis=1))
    si = _unit(np.stack([0.2 * u[:, 0], 0.1 * np.ones(len(p)), np.ones(len(p))], axis=1))
    weights = np.stack(
        [
            np.exp(-((u[:, 1] / 0.45) ** 2)),  # arcs: a central coronal band
            0.6 * np.exp(-((u[:, 0] / 0.5) ** 2)),  # AP: the middle, beneath the arcs where they cross
            0.8 * np.exp(-(((np.abs(u[:, 0]) - 0.6) / 0.25) ** 2)),  # SI: laterally
        ],
        axis=1,
    )
    fractions = 0.7 * weights / (weights.sum(axis=1, keepdims=True) + 0.15)
    directions = np.stack([arcs, ap, si], axis=1)
    order = np.argsort(-fractions, axis=1, kind="stable")
    fractions = np.take_along_axis(fractions, order, axis=1).astype(np.float32)
    directions = np.take_along_axis(directions, order[..., None], axis=1)
    return directions, fractions


def _header(spec: SubjectSpec, shape: tuple[int, ...], dtype) -> bytes:
    """A single-file NIfTI-1 header and the 4-byte extension flag: data start at byte 352."""
    import nibabel as nib

    hdr = nib.Nifti1Header()
    hdr.set_data_shape(shape)
    hdr.set_data_dtype(dtype)
    hdr.set_zooms((spec.voxel_mm,) * 3 + (1.0,) * (len(shape) - 3))
    hdr.set_qform(affine(spec), code=1)
    hdr.set_sform(affine(spec), code=1)
    hdr.set_xyzt_units("mm", "sec")
    hdr.set_data_offset(352)
    return hdr.binaryblock + b"\0" * 4


class _StreamedVolume:
    """A NIfTI written volume after volume (the file's order: x fastest, the 4th axis slowest),
    to ``path + .part`` and renamed when complete; gzip streams carry no time stamp."""

    def __init__(self, path: Path, spec: SubjectSpec, shape: tuple[int, ...], dtype=np.float32):
        self.path, self.part = path, path.with_name(path.name + ".part")
        raw = open(self.part, "wb")
        self.raw = raw
        self.out = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) if path.suffix == ".gz" else raw
        self.out.write(_header(spec, shape, dtype))

    def write(self, flat_f_order: np.ndarray) -> None:
        self.out.write(memoryview(np.ascontiguousarray(flat_f_order)).cast("B"))

    def close(self) -> None:
        if self.out is not self.raw:
            self.out.close()
        self.raw.close()
        os.replace(self.part, self.path)


def _ordered_map(fn, items, workers: int):
    """``fn`` over ``items`` on a thread pool, results in order, at most 2 × workers in flight."""
    items = list(items)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        window = 2 * workers
        futures = [pool.submit(fn, i) for i in items[:window]]
        for k in range(len(items)):
            result = futures[k].result()
            futures[k] = None  # let the finished volume go
            if k + window < len(items):
                futures.append(pool.submit(fn, items[k + window]))
            yield result


def write_dwi(spec: SubjectSpec, mask: np.ndarray, folder: Path, workers: int) -> Path:
    bvals, bvecs = gradient_table(spec)
    directions, fractions = fibre_configuration(spec, mask)
    flat_index = np.ravel_multi_index(np.nonzero(mask), spec.shape, order="F")
    n_grid = int(np.prod(spec.shape))
    sigma = S0 / SNR
    ball = np.float32(1.0) - fractions.sum(axis=1)

    def volume(k: int) -> np.ndarray:
        rng = np.random.default_rng([spec.seed, 2, k])  # per volume: the same bytes for any thread count
        b, g = bvals[k], bvecs[k].astype(np.float32)
        signal = ball * np.float32(np.exp(-b * D_BALL))
        for i in range(directions.shape[1]):
            cos = directions[:, i] @ g
            signal += fractions[:, i] * np.exp(np.float32(-b * D_BALL) * cos * cos)
        signal *= np.float32(S0)
        noise = rng.standard_normal((2, len(signal)), dtype=np.float32) * np.float32(sigma)
        out = np.abs(rng.standard_normal(n_grid, dtype=np.float32)) * np.float32(sigma)  # background: Rayleigh-like
        out[flat_index] = np.sqrt((signal + noise[0]) ** 2 + noise[1] ** 2)  # Rician
        return out

    path = folder / ("dwi.nii.gz" if spec.gzip else "dwi.nii")
    stream = _StreamedVolume(path, spec, (*spec.shape, spec.n_volumes))
    for data in _ordered_map(volume, range(spec.n_volumes), workers):
        stream.write(data)
    stream.close()
    np.savetxt(folder / "dwi.bval", bvals[None], fmt="%g")
    np.savetxt(folder / "dwi.bvec", bvecs.T, fmt="%.8f")
    return path


def write_bedpostx(spec: SubjectSpec, mask: np.ndarray, folder: Path, workers: int) -> Path:
    """merged_{th,ph,f}{i}samples.nii.gz and nodif_brain_mask.nii.gz: the true sticks (FSL frame =
    voxel frame, the affine's determinant being negative), each sample's direction jittered by
    ~3° and fraction by 5 %."""
    from tractlens.gpu.ballstick import vectors_to_angles

    out = folder / "bedpostx"
    out.mkdir(parents=True, exist_ok=True)
    directions, fractions = fibre_configuration(spec, mask)
    flat_index = np.ravel_multi_index(np.nonzero(mask), spec.shape, order="F")
    n_grid = int(np.prod(spec.shape))

    def merged(job: tuple[int, str]) -> None:
        """One file: θ, φ or f of stick i, sample after sample (θ and φ draw the same jitter)."""
        i, key = job
        stream = _StreamedVolume(out / f"merged_{key}{i + 1}samples.nii.gz", spec, (*spec.shape, spec.n_samples))
        flat = np.zeros(n_grid, np.float32)
        for s in range(spec.n_samples):
            rng = np.random.default_rng([spec.seed, 3, i, s])
            jitter = rng.normal(scale=0.05, size=directions[:, i].shape).astype(np.float32)
            theta, phi = vectors_to_angles(np, directions[:, i] + jitter)
            f = fractions[:, i] * (1 + 0.05 * rng.standard_normal(len(jitter), dtype=np.float32))
            flat[flat_index] = {"th": theta, "ph": phi, "f": np.clip(f, 0, 1)}[key]
            stream.write(flat)
        stream.close()

    jobs = [(i, key) for i in range(directions.shape[1]) for key in ("th", "ph", "f")]
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
        list(pool.map(merged, jobs))  # gzip dominates, and zlib releases the GIL: one file a thread
    _save_mask(spec, mask, out / "nodif_brain_mask.nii.gz")
    return out


def _save_mask(spec: SubjectSpec, mask: np.ndarray, path: Path) -> None:
    stream = _StreamedVolume(path, spec, spec.shape, np.uint8)
    stream.write(mask.astype(np.uint8).ravel(order="F"))
    stream.close()


def scaled_mask(spec: SubjectSpec, mask: np.ndarray, scale: float) -> np.ndarray:
    """A random subset of the brain with ``scale`` of its voxels (the same for a seed and scale)."""
    if scale >= 1:
        return mask
    rng = np.random.default_rng([spec.seed, 4, round(scale * 1e6)])
    return mask & (rng.random(spec.shape, dtype=np.float32) < scale)


def seed_roi(spec: SubjectSpec) -> np.ndarray:
    """A cube of seed_side³ voxels inside the arcs, above the centre and off the midline."""
    centre = (np.array(spec.shape) - 1) / 2
    offset = np.array([0.35 * spec.semi_axes[0], 0.0, 0.3 * spec.semi_axes[2]])
    corner = np.round(centre + offset).astype(int)
    roi = np.zeros(spec.shape, bool)
    side = spec.seed_side
    roi[corner[0] : corner[0] + side, corner[1] : corner[1] + side, corner[2] : corner[2] + side] = True
    return roi


def make_subject(spec: SubjectSpec, folder: Path, scales, workers: int) -> dict:
    """Make what is missing of the subject in ``folder``; returns its manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / "subject.json"
    identity = {k: v for k, v in asdict(spec).items() if k != "gzip"}  # dwi.nii and dwi.nii.gz may coexist
    wanted = json.loads(json.dumps({"version": SUBJECT_VERSION, **identity}))
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if {k: manifest.get(k) for k in wanted} != wanted:  # another subject, or none: make it all again
        manifest = {**wanted, "made_s": {}}
        shutil.rmtree(folder / "bedpostx", ignore_errors=True)
        shutil.rmtree(folder / "runs", ignore_errors=True)
        for stale in folder.glob("*.nii*"):
            stale.unlink()
    mask = brain_mask(spec)
    dwi = folder / ("dwi.nii.gz" if spec.gzip else "dwi.nii")
    manifest.update(brain_voxels=int(mask.sum()), dwi=dwi.name)
    manifest_path.write_text(json.dumps(manifest, indent=2))  # a call cut short resumes from here
    steps = [
        ("dwi", dwi, lambda: write_dwi(spec, mask, folder, workers)),
        (
            "bedpostx",
            folder / "bedpostx" / "nodif_brain_mask.nii.gz",
            lambda: write_bedpostx(spec, mask, folder, workers),
        ),
        ("mask", folder / "mask.nii.gz", lambda: _save_mask(spec, mask, folder / "mask.nii.gz")),
        ("seed", folder / "seed.nii.gz", lambda: _save_mask(spec, seed_roi(spec) & mask, folder / "seed.nii.gz")),
    ]
    for scale in scales:
        if scale < 1:
            path = folder / f"mask_s{scale:g}.nii.gz"
            steps.append((path.name, path, lambda p=path, s=scale: _save_mask(spec, scaled_mask(spec, mask, s), p)))
    for name, path, make in steps:
        if path.exists():
            continue
        start = time.perf_counter()
        make()
        manifest["made_s"][name] = round(time.perf_counter() - start, 2)
        log(f"made {name} in {manifest['made_s'][name]:.1f} s")
        manifest_path.write_text(json.dumps(manifest, indent=2))
    return manifest


# ----------------------------------------------------------------------------- measuring a process
def _children(pid: int) -> list[int]:
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                kids.extend(int(k) for k in fh.read().split())
    except OSError:
        pass
    return kids


def _rss_bytes(pid: int) -> tuple[int, int]:
    """(resident, resident less file-backed pages: the anonymous memory the process made)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            fields = fh.read().split()
        page = os.sysconf("SC_PAGE_SIZE")
        return int(fields[1]) * page, (int(fields[1]) - int(fields[2])) * page
    except (OSError, ValueError, IndexError):
        return 0, 0


class TreeMemory(threading.Thread):
    """Polls the summed RSS of a process and its descendants; ``peak`` is the largest sum seen."""

    def __init__(self, pid: int, interval_s: float = 0.05):
        super().__init__(daemon=True)
        self.pid, self.interval_s, self.peak, self.peak_anon = pid, interval_s, 0, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            pids, stack = [], [self.pid]
            while stack:
                pid = stack.pop()
                pids.append(pid)
                stack.extend(_children(pid))
            sizes = [_rss_bytes(p) for p in pids]
            self.peak = max(self.peak, sum(s[0] for s in sizes))
            self.peak_anon = max(self.peak_anon, sum(s[1] for s in sizes))
            self.done.wait(self.interval_s)


class GpuMemory:
    """``nvidia-smi`` polled every 100 ms for the device's used memory; ``peak`` minus ``baseline``
    is what the command added (the device is assumed to be the benchmark's alone)."""

    def __init__(self, index: int = 0):
        self.index, self.peak, self.baseline, self.proc = index, None, None, None
        if shutil.which("nvidia-smi") is None:
            return
        query = ["nvidia-smi", f"--id={index}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        done = subprocess.run(query, capture_output=True, text=True)
        if done.returncode:
            return
        self.baseline = int(float(done.stdout.split()[0])) << 20
        self.proc = subprocess.Popen([*query, "-lms", "100"], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                used = int(float(line.strip())) << 20
            except ValueError:
                continue
            self.peak = used if self.peak is None else max(self.peak, used)

    def stop(self) -> int | None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
        return None if self.peak is None else max(0, self.peak - self.baseline)


def run_measured(argv: list[str], env: dict, logs: Path, timeout_s: float) -> dict:
    """Run ``python -m tractlens.app.cli ARGV`` and measure it (see the module's docstring)."""
    timings_file = logs.with_suffix(".timings.json")
    timings_file.unlink(missing_ok=True)
    env = {**env, "TRACTLENS_TIMINGS": str(timings_file)}
    cmd = [sys.executable, "-m", "tractlens.app.cli", *argv, "--json", "--quiet"]
    gpu = GpuMemory()
    with open(logs.with_suffix(".out"), "w") as out, open(logs.with_suffix(".err"), "w") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT, start_new_session=True)
        tree = TreeMemory(proc.pid)
        tree.start()
        status, usage, timed_out = None, None, False
        while status is None:
            pid, raw, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status, usage = os.waitstatus_to_exitcode(raw), ru
            elif time.perf_counter() - start > timeout_s:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                time.sleep(0.02)
        wall = time.perf_counter() - start
        proc.returncode = status  # reaped by wait4 above
        tree.done.set()
        tree.join()
    device_smi = gpu.stop()
    summary = None
    try:
        summary = json.loads(logs.with_suffix(".out").read_text())
    except ValueError:
        pass
    timings = json.loads(timings_file.read_text()) if timings_file.exists() else None
    row = {
        "argv": ["tractlens", *argv],
        "exit_status": status,
        "timed_out": timed_out,
        "wall_s": round(wall, 3),
        "host_peak_tree_bytes": tree.peak,
        "host_peak_anon_bytes": tree.peak_anon,  # without pages of mapped files (the page cache's)
        "host_maxrss_bytes": usage.ru_maxrss * 1024,  # KiB on Linux
        "device_peak_smi_bytes": device_smi,
        "device_pool_peak_bytes": (timings or {}).get("device_pool_peak_bytes"),
        "timings": timings,
        "summary": summary,
    }
    row["host_peak_bytes"] = max(row["host_peak_tree_bytes"], row["host_maxrss_bytes"])
    if status != 0:
        row["stderr_tail"] = logs.with_suffix(".err").read_text()[-2000:]
    return row


# ----------------------------------------------------------------------------- the commands
def fresh_caches(env: dict, keys: tuple[str, ...]) -> None:
    """Empty the folders of ``keys`` in ``env``: those the run chose (the kernel cache, and
    TractLens's cache with --cold-data), never a folder the environment handed down (a test
    session's own cache)."""
    for key in keys:
        if key not in env:
            continue
        shutil.rmtree(env[key], ignore_errors=True)
        Path(env[key]).mkdir(parents=True)


def kernels_compiled(cache: Path) -> int:
    """Kernels CuPy compiled into an emptied ``cache``: its files beyond those the app installed
    from the shipped build (the stamp file it writes counts them)."""
    files = len([p for p in cache.iterdir() if p.suffix in (".cubin", ".ltoir", ".hsaco")]) if cache.is_dir() else 0
    installed = sum(json.loads(p.read_text())["kernels"] for p in cache.glob(".tractlens-shipped-*"))
    return files - installed


_KERNEL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)")


def compiled_kernel_names(cache: Path) -> list[str]:
    """The kernels CuPy compiled into ``cache``, by name: with ``CUPY_CACHE_SAVE_CUDA_SOURCE=1``
    CuPy writes each compiled kernel's source beside its file (``<file>.cu``); those the app
    installed from the shipped build have none."""
    if not cache.is_dir():
        return []
    names = []
    for source in sorted(cache.glob("*.cu")):
        found = _KERNEL.findall(source.read_text(errors="replace"))
        names.append(found[-1] if found else source.name)
    return names


COLD_LIMIT = 1.2  # issue 43's target: cold <= 1.2 x warm for every whole command


def _where_the_time_went(run: dict) -> dict:
    """A run's start-up seconds, phases and GPU warm-up stages (``timings`` of its command)."""
    timings = run.get("timings") or {}
    if not timings:
        return {}
    return {
        "startup_s": round(run["wall_s"] - timings["total_s"], 3),
        "phases_s": {k: round(v, 3) for k, v in timings.get("phases_s", {}).items()},
        "gpu_warmup_s": {k: round(v, 3) for k, v in timings.get("details_s", {}).get("gpu_warmup", {}).items()},
    }


def first_run_summary(results: dict, keys, env: dict) -> dict:
    """Issue 43's first-run result: per command (``keys`` of ``results["runs"]``) the command line
    behind the numbers, cold and warm wall seconds, their ratio and whether it meets
    :data:`COLD_LIMIT`, and the kernels the cold run compiled; with the subject, the device and
    the shipped build the cold runs started from."""
    shipped = env.get("TRACTLENS_SHIPPED_KERNELS_DIR")
    commands = {}
    for key in sorted(keys):
        row = results["runs"][key]
        if "cold_s" not in row:
            continue
        commands[key] = {
            "command_line": "tractlens " + " ".join(row["argv"][1:]) + " --json --quiet",
            "exit_status": row["exit_status"],
            "cold_s": round(row["cold_s"], 3),
            "warm_s": round(row["warm_s"], 3),
            "cold_over_warm": round(row["cold_over_warm"], 3),
            "within_target": row["cold_over_warm"] <= COLD_LIMIT,
            "kernels_compiled_cold": row["kernels_compiled_cold"],
            "kernels_compiled_cold_names": row.get("kernels_compiled_cold_names", []),
            # where the seconds went, cold and warm: start-up (wall minus the command's own
            # total), the phases, and the GPU warm-up thread's stages (gpu_status: CuPy's import,
            # the shipped kernels' installation and the probe; waited: what the command waited)
            "cold_vs_warm": {
                side: _where_the_time_went(run) for side, run in (("cold", row.get("first_run") or {}), ("warm", row))
            },
        }
    return {
        "target": f"cold <= {COLD_LIMIT} x warm for every whole command (issue 43)",
        "met": bool(commands) and all(c["within_target"] and c["exit_status"] == 0 for c in commands.values()),
        "device": results.get("device"),
        "subject": results.get("subject_summary"),
        "cold": "each command's first run starts from an emptied CUPY_CACHE_DIR holding only the kernels the app "
        "installs from the shipped build; its second run (warm) reuses what the first left",
        "kernel_cache": env.get("CUPY_CACHE_DIR"),
        "home": env.get("HOME"),  # first_run_on_gpu.sh quick: a fresh one (no user-level cache)
        "shipped_kernels": None if env.get("TRACTLENS_SHIPPED_KERNELS") == "0" else (shipped or "the package's"),
        "shipped_builds": sorted(p.name for p in Path(shipped).iterdir()) if shipped and Path(shipped).is_dir() else [],
        "commands": commands,
    }


def cold_table(runs: dict, keys) -> str:
    lines = [
        f"{'command':<22}{'cold s':>9}{'warm s':>9}{'cold/warm':>11}{'compiled':>10}  target ≤ {COLD_LIMIT}",
    ]
    for key in sorted(keys):
        row = runs[key]
        if "cold_s" not in row:
            continue
        verdict = "ok" if row["cold_over_warm"] <= COLD_LIMIT else "ABOVE"
        lines.append(
            f"{key:<22}{row['cold_s']:>9.1f}{row['warm_s']:>9.1f}{row['cold_over_warm']:>11.2f}"
            f"{row['kernels_compiled_cold']:>10}  {verdict}"
        )
    return "\n".join(lines)


def _scale_name(scale: float) -> str:
    return f"s{scale:g}"


def command_plan(name: str, scale: float, subject: Path, runs: Path, quick: bool, device: str):
    """(argv, output path, the (command, scale) it needs first, or None)."""
    mask = subject / ("mask.nii.gz" if scale >= 1 else f"mask_{_scale_name(scale)}.nii.gz")
    dwi = str(subject / json.loads((subject / "subject.json").read_text())["dwi"])
    out = runs / f"{name}_{_scale_name(scale)}"
    common = ["--device", device]
    if name == "fit-dti":
        return ["fit-dti", dwi, "--mask", str(mask), "-o", str(out), *common], out, None
    if name == "fit-ballstick":
        fewer = ["--burnin", "10", "--njumps", "40", "--sampleevery", "4"] if quick else []
        return ["fit-ballstick", dwi, "--mask", str(mask), "-o", str(out), *fewer, *common], out, None
    if name in ("track-prob", "track-prob-wb"):
        if name == "track-prob":
            seed, n = subject / "seed.nii.gz", max(1, round((200 if quick else 5000) * scale))
        else:
            seed, n = mask, 10
        argv = ["track", "probabilistic", "--samples", str(subject / "bedpostx"), "--seed", str(seed)]
        return [*argv, "--nsamples", str(n), "-o", str(out), *common], out, None
    if name == "track-det":
        tensor = runs / f"fit-dti_{_scale_name(1)}"
        seeding = ["--whole-brain"] if scale >= 1 else ["--seed", str(mask)]
        argv = ["track", "deterministic", "--tensor", str(tensor), *seeding, "--mask", str(subject / "mask.nii.gz")]
        return [*argv, "-o", str(out / "tracks.trx"), *common], out, ("fit-dti", 1.0)
    if name == "commit":
        tracks = runs / f"track-det_{_scale_name(scale)}" / "tracks.trx"
        return ["commit", "--dwi", dwi, "--tractogram", str(tracks), "-o", str(out), *common], out, ("track-det", scale)
    raise ValueError(f"unknown command {name!r}: one of {', '.join(COMMANDS)}")


#: What a command's summary calls its own compute time (the engine's), and its output unit.
GPU_WORK_KEYS = {
    "fit-dti": ("compute_s", "total_s"),  # the engine's fit; total_s adds gathering the signal
    "fit-ballstick": ("total_s",),  # tensor start, Levenberg-Marquardt, MCMC, transfers
    "track-prob": ("tracking_s",),
    "track-prob-wb": ("tracking_s",),
    "track-det": ("tracking_s",),
    "commit": ("fit_s",),
}
UNIT_KEYS = {
    "fit-dti": ("voxels", ("voxels_fitted",)),
    "fit-ballstick": ("voxels", ("voxels_fitted",)),
    "track-prob": ("streamlines", ("streamlines",)),
    "track-prob-wb": ("streamlines", ("streamlines",)),
    "track-det": ("points", ("points", "n_points")),
    "commit": ("segments", ("segments", "n_segments")),
}


def _first_key(summary: dict | None, keys) -> float | None:
    for key in keys:
        if summary and isinstance(summary.get(key), int | float):
            return summary[key]
    return None


def describe(name: str, row: dict) -> dict:
    """The table's derived numbers of one run."""
    phases = (row.get("timings") or {}).get("phases_s", {})
    unit, keys = UNIT_KEYS[name]
    accounted = sum(phases.get(k, 0.0) for k in ("read", "compute", "write"))
    return {
        "gpu_work_s": _first_key(row.get("summary"), GPU_WORK_KEYS[name]),
        "read_s": phases.get("read"),
        "compute_s": phases.get("compute"),
        "write_s": phases.get("write"),
        "other_s": round(row["wall_s"] - accounted, 3),  # start-up, imports, argument checks
        "startup_s": round(row["wall_s"] - row["timings"]["total_s"], 3) if row.get("timings") else None,
        "unit": unit,
        "units": _first_key(row.get("summary"), keys),
    }


# ----------------------------------------------------------------------------- results
def gpu_tag() -> str:
    """``h100``, ``h200``, … from nvidia-smi; ``cpu`` without a GPU."""
    if shutil.which("nvidia-smi") is None:
        return "cpu"
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    name = done.stdout.splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    match = re.search(r"\b([A-Z]+\d{2,4}[A-Z]?)\b", name)
    return match.group(1).lower() if match else (re.sub(r"\W+", "_", name).strip("_").lower() or "cpu")


def slopes(runs: dict) -> dict:
    """Host bytes per output unit between the largest and smallest scale of each command."""
    out = {}
    for name in COMMANDS:
        rows = sorted(
            (r for r in runs.values() if r["command"] == name and r["exit_status"] == 0 and r["units"]),
            key=lambda r: r["scale"],
        )
        if len(rows) >= 2 and rows[-1]["units"] != rows[0]["units"]:
            small, large = rows[0], rows[-1]
            out[name] = {
                "unit": large["unit"],
                "bytes_per_unit": round(
                    (large["host_peak_bytes"] - small["host_peak_bytes"]) / (large["units"] - small["units"]), 1
                ),
                "between_scales": [small["scale"], large["scale"]],
            }
    return out


def _gb(value) -> str:
    return "–" if value is None else f"{value / 1e9:.2f} GB"


def _s(value) -> str:
    return "–" if value is None else f"{value:.2f} s"


def markdown(results: dict) -> str:
    slope = results["slopes"]
    lines = [
        f"Whole commands on the synthetic subject ({results['subject_summary']}), results `{results['device']}`, "
        f"`--device {results['device_argument']}`; made by tests/benchmarks/bench_e2e.py. "
        "GPU work: the engine's own seconds as the command's summary gives them (on the device it ran on); "
        "read / compute / write: the command's own phases (exclusive); other: start-up, imports, checks. "
        "Peak host: the process tree's RSS (in brackets: without the pages of memory-mapped files, "
        "which the page cache holds and can drop); peak device: nvidia-smi (CuPy pool high-water mark).",
        "",
        "| command | scale | whole | GPU work | read | compute | write | other | peak host | peak device (pool) "
        "| output | host bytes per unit (slope) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in sorted(
        results["runs"], key=lambda k: (COMMANDS.index(results["runs"][k]["command"]), -results["runs"][k]["scale"])
    ):
        r = results["runs"][key]
        if r["exit_status"] != 0:
            lines.append(
                f"| {r['command']} | {r['scale']:g} | failed ({'timed out' if r['timed_out'] else r['exit_status']}) |"
                + " |" * 9
            )
            continue
        per = f"{r['host_peak_bytes'] / r['units']:.0f} / {r['unit'][:-1]}" if r["units"] else "–"
        if r["command"] in slope:
            per += f" ({slope[r['command']]['bytes_per_unit']:.0f})"
        device = _gb(r["device_peak_smi_bytes"]) + (
            f" ({_gb(r['device_pool_peak_bytes'])})" if r["device_pool_peak_bytes"] else ""
        )
        units = f"{r['units']:,.0f} {r['unit']}" if r["units"] else "–"
        anon = f" ({_gb(r['host_peak_anon_bytes'])})" if r.get("host_peak_anon_bytes") else ""
        first = f" (first run {_s(r['first_run']['wall_s'])})" if r.get("first_run") else ""
        lines.append(
            f"| {r['command']} | {r['scale']:g} | {_s(r['wall_s'])}{first} | {_s(r['gpu_work_s'])} | {_s(r['read_s'])} "
            f"| {_s(r['compute_s'])} | {_s(r['write_s'])} | {_s(r['other_s'])} | {_gb(r['host_peak_bytes'])}{anon} "
            f"| {device} | {units} | {per} |"
        )
    return "\n".join(lines) + "\n"


def save_results(path: Path, results: dict) -> None:
    results["slopes"] = slopes(results["runs"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str))
    path.with_suffix(".md").write_text(markdown(results))


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--outdir", type=Path, default=Path("/tmp/tractlens-e2e"), help="subject and outputs (kept, reused)")
    p.add_argument("--commands", default=",".join(COMMANDS), help=f"comma-separated, of {', '.join(COMMANDS)}")
    p.add_argument("--sizes", default="1", help="scales of the work, comma-separated (e.g. 1,0.5)")
    p.add_argument("--make-only", action="store_true", help="make the subject and stop")
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--quick", action="store_true", help="a small subject (24×28×24, 32 volumes) for checking the script"
    )
    size.add_argument(
        "--small",
        action="store_true",
        help="a clinical-sized subject (48×56×48 voxels of 2 mm, 65 volumes), unlike those the shipped kernels are "
        "built on; commands take --quick's shorter settings",
    )
    p.add_argument("--gzip", action="store_true", help="write dwi.nii.gz instead of dwi.nii")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"), help="the commands' --device")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="threads making the subject")
    p.add_argument("--timeout", type=float, default=580.0, help="seconds a command may run")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each command; the table gives the last, and the first's wall time beside it "
        "(2: what a first use costs, compiling kernels and building caches, against a later run)",
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="each command runs twice: first with an empty kernel cache (and the shipped kernels), then warm; "
        "prints cold/warm per command (implies --repeat 2)",
    )
    p.add_argument(
        "--cold-data",
        action="store_true",
        help="with --cold: TractLens's own cache is emptied too (a fresh machine)",
    )
    p.add_argument(
        "--cold-pairs",
        type=int,
        default=1,
        help="with --cold: this many (cold, warm) pairs per command, each cold run from emptied caches; cold and "
        "warm are then the medians (a 2-3 s command varies by ~0.5 s between fresh processes)",
    )
    p.add_argument(
        "--kernel-cache", type=Path, help="CUPY_CACHE_DIR of the commands (--cold: default <outdir>/cold/cupy)"
    )
    p.add_argument(
        "--no-shipped-kernels",
        action="store_true",
        help="TRACTLENS_SHIPPED_KERNELS=0: the kernels shipped with TractLens are not installed (a cold run compiles all)",
    )
    p.add_argument("--results", type=Path, default=RESULTS, help="folder of e2e_<gpu>.json/.md")
    p.add_argument("--tag", help="name of the results (default: the GPU's, e.g. h100; cpu without one)")
    p.add_argument(
        "--first-run-summary",
        type=Path,
        help="with --cold: also write this JSON, per command its command line, cold and warm seconds, their "
        "ratio against the target and the kernels the cold run compiled (issue 43's first run)",
    )
    args = p.parse_args(argv)
    args.short = args.quick or args.small  # the commands' shorter settings (fewer MCMC iterations, samples)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    spec = QUICK if args.quick else SMALL if args.small else SubjectSpec()
    if args.gzip:
        spec = SubjectSpec(**{**asdict(spec), "gzip": True})
    scales = sorted({float(s) for s in args.sizes.split(",") if s.strip()}, reverse=True)
    commands = [c.strip() for c in args.commands.split(",") if c.strip()]
    if unknown := set(commands) - set(COMMANDS):
        raise SystemExit(f"unknown command(s) {', '.join(sorted(unknown))}: give some of {', '.join(COMMANDS)}")
    if any(not 0 < s <= 1 for s in scales):
        raise SystemExit("--sizes are fractions of the full work, in (0, 1]")
    start = time.perf_counter()
    manifest = make_subject(spec, args.outdir, scales, args.workers)
    log(
        f"subject ready in {args.outdir} ({manifest['brain_voxels']:,} brain voxels, {time.perf_counter() - start:.1f} s)"
    )
    if args.make_only:
        return 0
    tag = args.tag or gpu_tag() + ("_quick" if args.quick else "_small" if args.small else "")
    target = args.results / f"e2e_{tag}"
    results = json.loads(target.with_suffix(".json").read_text()) if target.with_suffix(".json").exists() else {}
    results.setdefault("runs", {})
    results.update(
        device=tag,
        device_argument=args.device,
        subject_summary=f"{'×'.join(map(str, spec.shape))} voxels of {spec.voxel_mm} mm, {spec.n_volumes} volumes, "
        f"{manifest['brain_voxels']:,} brain voxels, {manifest['dwi']}",
        subject=manifest,
    )
    runs, logs = args.outdir / "runs", args.outdir / "logs"
    runs.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if args.cold:
        args.repeat = max(args.repeat, 2)
        args.kernel_cache = args.kernel_cache or args.outdir / "cold" / "cupy"
        if args.cold_data:
            env["TRACTLENS_CACHE"] = str(args.outdir / "cold" / "tractlens")
    if args.kernel_cache:
        env["CUPY_CACHE_DIR"] = str(args.kernel_cache)
    if args.cold:  # CuPy keeps the source of each kernel it compiles beside it: the cold runs name them
        env["CUPY_CACHE_SAVE_CUDA_SOURCE"] = "1"
    if args.no_shipped_kernels:
        env["TRACTLENS_SHIPPED_KERNELS"] = "0"
    failed = 0

    def run(name: str, scale: float) -> dict:
        argv, out, needs = command_plan(name, scale, args.outdir, runs, args.short, args.device)
        if needs is not None and f"{needs[0]}@{needs[1]:g}" not in done_here:
            _, needed_out, _ = command_plan(*needs, args.outdir, runs, args.short, args.device)
            if not needed_out.exists():
                log(f"{name} at scale {scale:g} needs {needs[0]} at scale {needs[1]:g} first")
                run(*needs)
        shutil.rmtree(out, ignore_errors=True)
        if argv[0] == "track":
            out.mkdir(parents=True)  # the tractogram's folder
        log(f"{name} at scale {scale:g}: {' '.join(argv)}")
        pairs = []  # --cold: (cold, warm) runs, each cold one from emptied caches
        for _pair in range(args.cold_pairs if args.cold else 1):
            first = None
            if args.cold:
                fresh_caches(env, ("CUPY_CACHE_DIR", *(("TRACTLENS_CACHE",) if args.cold_data else ())))
            for _ in range(args.repeat - 1):  # earlier runs: what a first use costs (compiling, caches)
                first = first or run_measured(argv, env, logs / f"{name}_{_scale_name(scale)}", args.timeout)
                if args.cold and "kernels_compiled" not in first:
                    first["kernels_compiled"] = kernels_compiled(Path(env["CUPY_CACHE_DIR"]))
                    first["kernels_compiled_names"] = compiled_kernel_names(Path(env["CUPY_CACHE_DIR"]))
                shutil.rmtree(out, ignore_errors=True)
                if argv[0] == "track":
                    out.mkdir(parents=True)
            row = run_measured(argv, env, logs / f"{name}_{_scale_name(scale)}", args.timeout)
            pairs.append((first, row))
        if len(pairs) > 1:  # the pair of median cold time stands for the command; every pair recorded
            pairs.sort(key=lambda pair: pair[0]["wall_s"])
            first, row = pairs[len(pairs) // 2]
            row["cold_pairs_s"] = [[round(c["wall_s"], 3), round(w["wall_s"], 3)] for c, w in pairs]
            row["wall_s"] = statistics.median(w["wall_s"] for _, w in pairs)
        if first is not None:
            row["first_run"] = {k: first[k] for k in ("wall_s", "exit_status", "host_peak_bytes")}
            row["first_run"]["timings"] = first.get("timings")  # its phases and GPU start-up (cold vs warm)
        if args.cold and first is not None:
            row.update(
                cold_s=first["wall_s"],
                warm_s=row["wall_s"],
                cold_over_warm=first["wall_s"] / row["wall_s"],
                kernels_compiled_cold=first["kernels_compiled"],
                kernels_compiled_cold_names=first["kernels_compiled_names"],
                shipped_kernels=not args.no_shipped_kernels,
                cold_data=args.cold_data,
            )
        if row["exit_status"] != 0:
            shutil.rmtree(out, ignore_errors=True)  # no half output for a later command to take
        row.update(command=name, scale=scale, **describe(name, row))
        key = f"{name}@{scale:g}"
        results["runs"][key] = row
        done_here.add(key)
        save_results(target, results)
        log(
            f"  {'ok' if row['exit_status'] == 0 else 'FAILED'}: {row['wall_s']:.1f} s, host {_gb(row['host_peak_bytes'])}, "
            f"read {_s(row['read_s'])}, compute {_s(row['compute_s'])}, write {_s(row['write_s'])}"
        )
        if row["exit_status"] != 0:
            log(row.get("stderr_tail", "")[-800:])
        return row

    done_here: set[str] = set()
    for name in commands:
        for scale in scales:
            failed += run(name, scale)["exit_status"] != 0
    save_results(target, results)
    if args.cold:
        print(cold_table(results["runs"], done_here))
        if args.first_run_summary:
            summary = first_run_summary(results, done_here, env)
            args.first_run_summary.parent.mkdir(parents=True, exist_ok=True)
            args.first_run_summary.write_text(json.dumps(summary, indent=2) + "\n")
            log(f"first-run summary in {args.first_run_summary}")
    log(f"results in {target.with_suffix('.json')} and .md")
    print(target.with_suffix(".md").read_text())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
