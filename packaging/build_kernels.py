"""Compile every GPU kernel TractLens's commands use, ahead of time, into resources/kernel_cache/.

Run on a build machine with an NVIDIA GPU and CuPy, from the repository root, before building the
wheel or the bundle:

    python packaging/build_kernels.py                       # this GPU's architecture
    python packaging/build_kernels.py --archs 80,86,89         # and these architectures too
    python packaging/build_kernels.py --large-subject DIR      # and the kernels of HCP-sized data

What is compiled: (1) the engine's kernel catalogue (``tractlens info --compile``) for each
count of measurements in ``--measurements`` (COMMIT's and ball & sticks' kernels are compiled
per 32 measurements: the default covers up to 320); (2) CuPy's own kernels (elementwise,
reduction, ufuncs, random numbers, ...) as the whole commands use them: each command of
tests/benchmarks/bench_e2e.py, plus geodesic tracking, is run on a small synthetic subject on the
GPU, and CSD (single-shell and multi-tissue) and fODF tracking on the same subject with 60
directions per shell, one fresh process each, as a user would run it. CuPy specialises some
kernels by array size too: its nonzero for 512 elements or fewer (the engine avoids it with
``gpu/indices.py``; deterministic tracking still also runs from the subject's 27-voxel seed, to
catch any other), and 64-bit indexing past 2 GiB (``--large-subject`` runs fit-dti,
deterministic tracking and COMMIT on a full-sized subject as well); the commands whose kernels
depend on the count of measurements also run on the twin's 182 volumes. (CuPy's CUB block
reductions, sized by the data, are off in the engine: ``gpu.backend._one_kernel_per_reduction``.) Each process records, for every kernel CuPy compiles, its cache key
(:mod:`tractlens.app.kernel_cache`), and the log names the kernels each command added; the compiled
files and the key templates are written to ``<out>/<tag>/`` (tag: CuPy version, NVRTC version,
architecture), where ``tractlens`` finds them at run time and installs them into the user's
CuPy cache.

Architectures other than this GPU's (``--archs 80,86,...``; this GPU's is always built) are compiled by NVRTC from the same
calls replayed with that architecture (CuPy cannot load them here; the files are kept).

The result depends on the CuPy and CUDA (NVRTC) versions of this machine: a user whose CuPy or
CUDA differs gets no shipped kernels (they are compiled at first use, as without them), so
build with the versions you ship (the bundle's CuPy, or the version pinned for the wheel).
"""

from __future__ import annotations

import argparse
import atexit
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "resources" / "kernel_cache"
#: Counts of measurements the data-dependent kernels are compiled for: one per 32 (MPL 1..10).
DEFAULT_MEASUREMENTS = "32,64,96,128,160,192,224,256,288,320"
BLOCK_MIN_CHARS = 1000  # a key part this long that recurs is stored once (CuPy's headers)


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# ----------------------------------------------------------------- inside each captured process
def _install_capture(record_dir: Path):
    """Wrap CuPy's compiler so that every compilation leaves its cache key (the text hashed into
    the file's name) and its call (replayed for other architectures) in ``record_dir``."""
    from cupy.cuda import compiler

    if not hasattr(compiler, "_compile_with_cache_cuda") or not hasattr(compiler, "_hash_hexdigest"):
        raise SystemExit(
            "build_kernels.py: this CuPy's compiler has no _compile_with_cache_cuda/_hash_hexdigest; "
            "its cache keys cannot be recorded (update the capture for this CuPy version)"
        )
    keys: dict[str, str] = {}
    calls: list[dict] = []
    blocks: dict[str, str] = {}
    banners: set[str] = set()  # NVRTC's banner, as CuPy puts it into every key
    real_hash, real_compile = compiler._hash_hexdigest, compiler._compile_with_cache_cuda
    real_preprocess = getattr(compiler, "_preprocess", None)

    def shrink(text: str) -> str:
        """CuPy's headers (the long ``extra_source`` of every kernel of its own) as a marker."""
        for bid, block in blocks.items():
            text = text.replace(block, f"\x00tractlens:block:{bid}\x00")
        return text

    def plain(value):
        """A call's argument as JSON keeps it (tuples as lists; a log stream as None)."""
        if isinstance(value, tuple):
            value = list(value)
        return value if isinstance(value, (bool, int, type(None), list, str)) else None

    def hash_hexdigest(value):
        digest = real_hash(value)
        keys[digest] = shrink(value.decode("utf-8") if isinstance(value, bytes) else value)
        return digest

    def compile_with_cache_cuda(source, options, arch, extra_source=None, backend="nvrtc", *args, **kwargs):
        if extra_source and len(extra_source) >= BLOCK_MIN_CHARS:
            blocks.setdefault(hashlib.sha1(extra_source.encode()).hexdigest()[:16], extra_source)
        calls.append(
            {
                "source": source,
                "options": list(options),
                "arch": arch,
                "extra_source": shrink(extra_source) if extra_source else extra_source,
                "backend": backend,
                "args": [plain(a) for a in args],
                "kwargs": {k: plain(v) for k, v in kwargs.items()},
            }
        )
        return real_compile(source, options, arch, extra_source, backend, *args, **kwargs)

    def preprocess(source, options, arch, backend):
        out = real_preprocess(source, options, arch, backend)
        if source == "" and isinstance(out, str):
            banners.add(out)
        return out

    compiler._hash_hexdigest = hash_hexdigest
    compiler._compile_with_cache_cuda = compile_with_cache_cuda
    if real_preprocess is not None:
        compiler._preprocess = preprocess

    def save():
        from cupy._core import core

        sys.path.insert(0, str(ROOT))
        from tractlens.app.kernel_cache import cupy_include_dirs

        record = {
            "cupy_version": __import__("cupy").__version__,
            "nvrtc": list(__import__("cupy").cuda.nvrtc.getVersion()),
            "cupy_core_dir": os.path.dirname(os.path.abspath(core.__file__)),
            "include_dirs": list(cupy_include_dirs(core)) if keys else None,  # None: nothing compiled, not asked
            "banners": sorted(banners),
            "keys": keys,
            "calls": calls,
            "blocks": blocks,
        }
        path = record_dir / f"{os.getpid()}-{time.time_ns()}.json.gz"
        with gzip.open(path, "wt", encoding="utf-8") as f:
            json.dump(record, f)

    atexit.register(save)
    return save


def _captured(argv: list[str]) -> int:
    """``--capture DIR -- <what>``: record, then run a tractlens command, the kernel catalogue
    (``--catalogue N,M,...``) or a replay for another architecture (``--replay ARCH RECORDS...``)."""
    record_dir, what = Path(argv[0]), argv[1:]
    sys.path.insert(0, str(ROOT))
    _install_capture(record_dir)
    if what[0] == "--catalogue":
        from tractlens.gpu import backend, warmup

        ok, detail = backend.gpu_status()
        if not ok:
            raise SystemExit(f"build_kernels.py: no usable GPU: {detail}")
        builds = {b: None for n in what[1].split(",") for b in warmup.catalogue(int(n))}  # in order, once each
        warmup.compile_all(builds=tuple(builds))
        return 0
    if what[0] == "--replay":
        return _replay(what[1], [Path(p) for p in what[2:]])
    from tractlens.app.cli import main

    return main(what)


def _replay(arch: str, records: list[Path]) -> int:
    """Compile every recorded call again for ``arch`` (the files land in CuPy's cache; loading
    them on this GPU fails when the architecture is not its own, which is expected)."""
    from cupy.cuda import compiler

    done = failed = 0
    for path in records:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            record = json.load(f)
        for call in record["calls"]:
            extra = call["extra_source"]
            for bid, block in record["blocks"].items():
                extra = extra.replace(f"\x00tractlens:block:{bid}\x00", block) if extra else extra
            try:
                compiler._compile_with_cache_cuda(
                    call["source"],
                    tuple(call["options"]),
                    arch,
                    extra,
                    call["backend"],
                    *call["args"],
                    **call["kwargs"],
                )
            except Exception as exc:  # loading fails on this GPU (CUDA_ERROR_NO_BINARY_FOR_GPU): the file is saved
                if failed == 0:
                    print(f"replay for sm_{arch}, e.g.: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
                failed += 1
            done += 1
    print(f"replayed {done} compilations for sm_{arch} ({failed} not loadable here)", file=sys.stderr)
    return 0


# ----------------------------------------------------------------- the driver
#: Directions per shell of the CSD subject: 45 are needed for CSD at its default lmax 8 without
#: super-resolution, and the benchmark's quick subject has 10.
CSD_DIRECTIONS = 60


def _subject(work: Path, large: Path | None = None) -> tuple[Path, list[tuple[str, list[str]]]]:
    """Small synthetic subjects (tests/benchmarks/bench_e2e.py's quick one, and the same with
    :data:`CSD_DIRECTIONS` directions per shell for CSD) and the commands run on them: every
    command of the benchmark, plus geodesic tracking, CSD (single-shell and multi-tissue) and fODF
    tracking. With ``large`` (a subject made by ``bench_e2e.py --make-only``, 145×174×145 voxels
    of 288 volumes), deterministic tracking and COMMIT run on it too: CuPy compiles other kernels
    for arrays over 2 GiB (64-bit indexing) and other CUB block sizes for long reductions, which
    a small subject never reaches."""
    import dataclasses

    sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
    import bench_e2e as bench

    subject, runs = work / "subject", work / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    workers = os.cpu_count() or 1
    bench.make_subject(bench.QUICK, subject, [1.0], workers=workers)
    commands = []
    tensor = runs / "fit-dti_s1"
    seed, gpu = str(subject / "seed.nii.gz"), ["--device", "gpu"]
    for name in bench.COMMANDS:
        argv, out, _needs = bench.command_plan(name, 1.0, subject, runs, True, "gpu")
        if argv[0] == "track":
            out.mkdir(parents=True, exist_ok=True)
        commands.append((name, argv))
        if name == "track-det":  # from the 27-voxel seed too: the small size users meet
            roi = ["track", "deterministic", "--tensor", str(tensor), "--seed", seed]
            commands.append(("track-det-roi", [*roi, "-o", str(runs / "track-det-roi.trk"), *gpu]))
    geodesic = ["track", "geodesic", "--tensor", str(tensor), "--seed", seed, "-o", str(runs / "geodesic.trk")]
    commands.append(("track-geodesic", [*geodesic, *gpu]))

    csd_subject = work / "subject-csd"
    bench.make_subject(dataclasses.replace(bench.QUICK, per_shell=CSD_DIRECTIONS), csd_subject, [1.0], workers)
    _add_grey_matter_and_csf(csd_subject / "dwi.nii", csd_subject / "mask.nii.gz")
    dwi, mask = str(csd_subject / "dwi.nii"), str(csd_subject / "mask.nii.gz")
    csd, msmt = runs / "fit-csd", runs / "fit-csd-msmt"
    fod = ["track", "fod-probabilistic", "--fod", str(csd), "--seed", str(csd_subject / "seed.nii.gz")]
    commands += [
        ("fit-csd", ["fit-csd", dwi, "--mask", mask, "-o", str(csd), *gpu]),
        ("fit-csd-msmt", ["fit-csd", dwi, "--mask", mask, "--msmt", "-o", str(msmt), *gpu]),
        ("track-fod", [*fod, "-o", str(runs / "fod.trk"), *gpu]),
    ]
    # the commands whose kernels depend on the count of measurements (COMMIT's and ball & sticks'
    # per 32) run on the twin's 182 too; CuPy's CUB block reductions, which took a block size from
    # the length of the reduced axis, are off in the engine (gpu.backend._one_kernel_per_reduction)
    mid = work / "runs-mid"
    for name in ("fit-dti", "fit-ballstick", "track-det", "commit"):
        argv, out, _needs = bench.command_plan(name, 1.0, csd_subject, mid, True, "gpu")
        if argv[0] == "track":
            out.mkdir(parents=True, exist_ok=True)
        commands.append((f"{name}-mid", argv))
    if large is not None:
        big = work / "runs-large"
        for name in ("fit-dti", "track-det", "commit"):
            argv, out, _needs = bench.command_plan(name, 1.0, large, big, False, "gpu")
            if argv[0] == "track":
                out.mkdir(parents=True, exist_ok=True)
            commands.append((f"{name}-large", argv))
    return subject, commands


#: Isotropic diffusivities (mm²/s) written into the CSD subject: multi-tissue CSD estimates the
#: grey-matter and CSF responses from voxels of low FA and low or high MD.
GM_D, CSF_D, TISSUE_VOXELS = 0.0008, 0.003, 300


def _add_grey_matter_and_csf(dwi: Path, mask: Path) -> None:
    """Make the first :data:`TISSUE_VOXELS` brain voxels CSF and the next as many grey matter
    (isotropic signals with noise, SNR 25 on b=0), so ``fit-csd --msmt`` finds its three tissues.
    Done once (a marker file beside the image)."""
    import nibabel as nib
    import numpy as np

    done = dwi.with_name(".tissues")
    if done.exists():
        return
    image = nib.load(dwi)
    data = np.asarray(image.dataobj, dtype=np.float32)
    bvals = np.loadtxt(dwi.with_name("dwi.bval")).ravel()
    inside = np.flatnonzero(np.asarray(nib.load(mask).dataobj).ravel() > 0)
    flat = data.reshape(-1, data.shape[-1])
    rng = np.random.default_rng(43)
    s0 = float(flat[inside][:, bvals < 50].mean())
    for diffusivity, voxels in ((CSF_D, inside[:TISSUE_VOXELS]), (GM_D, inside[TISSUE_VOXELS : 2 * TISSUE_VOXELS])):
        clean = s0 * np.exp(-bvals * diffusivity)
        noisy = (
            clean
            + rng.normal(0, s0 / 25, (len(voxels), len(bvals)))
            + 1j * rng.normal(0, s0 / 25, (len(voxels), len(bvals)))
        )
        flat[voxels] = np.abs(noisy)
    tmp = dwi.with_name(f".{dwi.name}.tmp.nii")
    nib.save(nib.Nifti1Image(flat.reshape(data.shape), image.affine, image.header), tmp)
    os.replace(tmp, dwi)
    done.write_text("grey matter and CSF voxels added\n")


def kernel_names(calls: list[dict]) -> list[str]:
    """The kernels' names in recorded compilations (``__global__ void NAME``), for the log."""
    names = []
    for call in calls:
        found = _KERNEL.findall(call.get("source") or "")
        names.append(found[-1] if found else "?")
    return names


_KERNEL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)")


def _run_captured(record_dir: Path, cache: Path, what: list[str], logs: Path, label: str) -> bool:
    env = {
        **os.environ,
        "CUPY_CACHE_DIR": str(cache),
        "TRACTLENS_SHIPPED_KERNELS": "0",  # record what the commands compile, not what was shipped before
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    start = time.perf_counter()
    before = set(record_dir.glob("*.json.gz"))
    with open(logs / f"{label}.log", "w") as out:
        done = subprocess.run(
            [sys.executable, __file__, "--capture", str(record_dir), "--", *what],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    calls = []
    for path in sorted(set(record_dir.glob("*.json.gz")) - before):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            calls += json.load(f)["calls"]
    names = kernel_names(calls)
    shown = ", ".join(f"{n}×{names.count(n)}" if names.count(n) > 1 else n for n in dict.fromkeys(names))
    state = "ok" if done.returncode == 0 else f"FAILED ({done.returncode})"
    log(f"  {label}: {state} in {time.perf_counter() - start:.1f} s, {len(calls)} new kernels: {shown[:1500]}")
    if done.returncode != 0:
        print((logs / f"{label}.log").read_text()[-1500:], file=sys.stderr)
    return done.returncode == 0


_ARCH = re.compile(r"^\('(\w+)'")


def assemble(record_dir: Path, cache: Path, out: Path) -> dict[str, dict]:
    """Write one ``<out>/<tag>/`` per architecture: the compiled files and the key templates."""
    sys.path.insert(0, str(ROOT))
    from tractlens.app import kernel_cache as kc

    keys: dict[str, str] = {}
    blocks: dict[str, str] = {}
    banners: set[str] = set()
    meta = include_dirs = None
    for path in sorted(record_dir.glob("*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            record = json.load(f)
        keys.update(record["keys"])
        blocks.update(record["blocks"])
        banners.update(record.get("banners", ()))
        here = (record["cupy_version"], tuple(record["nvrtc"]), record["cupy_core_dir"])
        dirs = record.get("include_dirs")
        if (meta is not None and meta != here) or (dirs is not None and include_dirs not in (None, dirs)):
            raise SystemExit(
                f"build_kernels.py: the captured processes saw different CuPy installations: "
                f"{meta} {include_dirs} / {here} {dirs}"
            )
        meta, include_dirs = here, dirs if dirs is not None else include_dirs
    if meta is None:
        raise SystemExit("build_kernels.py: nothing was recorded")
    cupy_version, nvrtc, core_dir = meta
    built = kc.Runtime(cupy_version, nvrtc, "", core_dir, tuple(include_dirs or ()))
    marks = {f"\x00tractlens:block:{bid}\x00": kc.template(text, built) for bid, text in blocks.items()}
    paths = kc.build_paths(built)
    stuck: dict[str, list[str]] = {}
    by_tag: dict[str, list[dict]] = {}
    missing = 0
    for file in sorted(cache.iterdir()):
        if file.suffix not in (".cubin", ".ltoir"):
            continue
        key = keys.get(file.stem)
        if key is None:  # compiled by something the capture did not see (should not happen)
            missing += 1
            continue
        arch = _ARCH.match(key).group(1)  # the key's blocks are markers already (shrink)
        entry = {"file": file.name, "suffix": file.suffix, "key": kc.template(key, built)}
        for path in kc.leftovers(entry["key"], paths):
            stuck.setdefault(path, []).append(file.name)
        by_tag.setdefault(kc.build_tag(cupy_version, nvrtc, arch), []).append(entry)
    for path, files in stuck.items():  # a user whose folders differ would compile these
        log(f"warning: {len(files)} key templates still name {path} (e.g. {files[0]}): not relocatable")
    summary = {}
    for tag, entries in sorted(by_tag.items()):
        arch = tag.rsplit("-sm", 1)[1]
        runtime = kc.Runtime(cupy_version, nvrtc, arch, core_dir, built.include_dirs)
        for entry in entries:  # the templates give back the names CuPy computed here
            name = kc.cache_name(kc.fill(entry["key"], runtime, marks), entry["suffix"])
            if name != entry["file"]:
                raise SystemExit(f"build_kernels.py: the key template of {entry['file']} does not give its name back")
        folder = out / tag
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for entry in entries:
            shutil.copyfile(cache / entry["file"], folder / entry["file"])
        manifest = {
            "format": kc.FORMAT,
            "cupy": cupy_version,
            "nvrtc": list(nvrtc),
            "arch": arch,
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "include_dirs": len(built.include_dirs),  # how many; their paths are the user's
            "compiler": next(iter(banners)) if len(banners) == 1 else None,  # NVRTC's banner, checked at install
            "blocks": marks,
            "entries": entries,
        }
        with gzip.open(folder / kc.MANIFEST, "wt", encoding="utf-8", compresslevel=9) as f:
            json.dump(manifest, f)
        size = sum(p.stat().st_size for p in folder.iterdir())
        fixed = {name for files in stuck.values() for name in files}
        summary[tag] = {
            "kernels": len(entries),
            "bytes": size,
            "not_relocatable": sum(e["file"] in fixed for e in entries),
        }
        log(f"{folder}: {len(entries)} kernels, {size / 2**20:.1f} MiB")
    if missing:
        log(f"warning: {missing} cached files had no recorded key and were left out")
    return summary


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--capture":
        return _captured([argv[1], *argv[argv.index("--") + 1 :]])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the builds go (default resources/kernel_cache)")
    p.add_argument("--archs", default="", help="other compute capabilities than this GPU's, e.g. 80,86,89")
    p.add_argument("--measurements", default=DEFAULT_MEASUREMENTS, help="measurement counts of the kernel catalogue")
    p.add_argument("--work", type=Path, help="work folder (default: a temporary one, removed)")
    p.add_argument(
        "--large-subject",
        type=Path,
        help="also run fit-dti, deterministic tracking and COMMIT on this subject (a folder made by "
        "tests/benchmarks/bench_e2e.py --make-only): the kernels CuPy compiles for arrays over 2 GiB",
    )
    p.add_argument(
        "--commands",
        help="only these of the commands run on the subject (comma-separated labels: fit-dti, track-det, ...; "
        "default all; 'none': the kernel catalogue only, without CuPy's own kernels)",
    )
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="tractlens-kernels-"))
    record_dir, cache, logs = work / "records", work / "cache", work / "logs"
    for folder in (record_dir, cache, logs):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    start = time.perf_counter()
    ok = True
    log(f"kernel catalogue for {args.measurements} measurements")
    counts = ",".join(n.strip() for n in args.measurements.split(",") if n.strip())
    ok &= _run_captured(record_dir, cache, ["--catalogue", counts], logs, "catalogue")
    if args.commands != "none":
        log("the commands on a small subject (CuPy's own kernels)")
        _subject_dir, commands = _subject(work, args.large_subject)
        wanted = set(args.commands.split(",")) if args.commands else {label for label, _ in commands}
        for label, what in commands:
            if label in wanted:
                ok &= _run_captured(record_dir, cache, what, logs, label)
    others = [a.strip() for a in args.archs.split(",") if a.strip()]
    records = sorted(str(p) for p in record_dir.glob("*.json.gz"))
    replay_dir = work / "replay-records"
    replay_dir.mkdir(exist_ok=True)
    for arch in others:
        log(f"replay for sm_{arch}")
        ok &= _run_captured(replay_dir, cache, ["--replay", arch, *records], logs, f"replay_{arch}")
    for path in replay_dir.glob("*.json.gz"):
        shutil.copy(path, record_dir / f"replay-{path.name}")
    summary = assemble(record_dir, cache, args.out)
    log(f"done in {time.perf_counter() - start:.0f} s: {json.dumps(summary)}")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
