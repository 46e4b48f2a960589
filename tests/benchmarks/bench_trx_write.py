"""Concurrent .trx writers, as the workers of ``batch --gpus N`` write their tractograms: is the
write phase bound by the CPU (points to RAS mm, the zip's CRC, copies) or by the disk (the
flush before the rename)?

Each writer is a process of its own that appends the same synthetic part (streamlines of 100
points, an FA per point, as ``track deterministic`` writes) through
:func:`tractlens.app.io.tractogram_stream.open_tractogram_writer` with ``background=True`` (the
command's writer) until ``--points`` points, then closes the file. All writers start together;
each reports its wall seconds and the writer's stages (``world``, ``file``, ``finish``,
``flush``: :attr:`TractogramWriter.seconds`), and the run the total GB/s.

    python tests/benchmarks/bench_trx_write.py --points 80e6 --writers 1,2 --folder /tmp/trxbench
    python tests/benchmarks/bench_trx_write.py --points 310e6 --writers 1,2,4 --folder OUTPUT_DISK
    python tests/benchmarks/bench_trx_write.py --points 310e6 --writers 1,4 --parts voxel,mm   # as before / as a GPU run now

On a batch host, ``--folder`` on the disk the batch writes to; ``--threads`` as the batch gives
each worker (its share of the cores: ``TRACTLENS_THREADS``, OpenBLAS/OpenMP threads).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's tractlens, in the writers too

PART_POINTS = 1 << 22  # about one GPU batch's pieces


def _part(kind: str = "voxel"):
    """The part every writer appends; ``kind="mm"``: its points held as float32 millimetres, as a
    GPU batch worker's tracking step gives them (written as they are: no ``world`` stage)."""
    import numpy as np

    from tractlens.app.model import Tractogram

    rng = np.random.default_rng(0)
    steps = rng.normal(0, 0.3, (PART_POINTS, 3)).astype(np.float32)
    offsets = np.arange(0, PART_POINTS + 1, 100, dtype=np.int64)
    offsets[-1] = PART_POINTS
    points = np.cumsum(steps, axis=0, dtype=np.float32) % 140 + 2
    fa = rng.random(PART_POINTS, dtype=np.float32)
    affine = np.diag([1.25, 1.25, 1.25, 1.0])
    affine[:3, 3] = [-90, 126, -72]
    if kind == "mm":
        from tractlens.app.io.tractogram_mapped import world_points
        from tractlens.app.io.tractogram_points import points_world_float32

        points = world_points(points_world_float32(points, affine), affine)
    return Tractogram(points, offsets, affine=affine, dimensions=(145, 174, 145), point_scalars={"fa": fa})


def resident_fraction(path: Path) -> float | None:
    """The share of ``path``'s pages in the page cache (Linux ``mincore``), None elsewhere."""
    import ctypes
    import mmap

    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                             ctypes.c_int, ctypes.c_int, ctypes.c_int64)  # fmt: skip
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            return None
        pages = -(-size // mmap.PAGESIZE)
        vector = ctypes.create_string_buffer(pages)
        ok = libc.mincore(ctypes.c_void_p(address), size, vector) == 0
        libc.munmap(ctypes.c_void_p(address), size)
        return round(sum(b & 1 for b in vector.raw) / pages, 4) if ok else None
    finally:
        os.close(fd)


def read_back_s(path: Path) -> float:
    """Seconds to touch every page of ``path`` through a memory map (as the connectome reads the
    streamlines' ends of a .trx: one point per streamline, so nearly every page)."""
    import numpy as np

    t0 = time.perf_counter()
    data = np.memmap(path, dtype=np.uint8, mode="r")
    int(data[::4096].sum(dtype=np.int64))
    del data
    return round(time.perf_counter() - t0, 3)


def _crc_rate(points) -> float:
    """GB/s of the CRC-32 the writer computes over every byte of a stored member (ISA-L's where
    python-isal is installed; zlib's in the writer before its own zip, through :mod:`zipfile`)."""
    try:
        from tractlens.app.io._zip_stored import crc32
    except ImportError:  # the writer of an older checkout
        from zlib import crc32

    data = memoryview(points).cast("B")
    t0 = time.perf_counter()
    for _ in range(4):
        crc32(data)
    return round(4 * len(data) / 1e9 / (time.perf_counter() - t0), 2)


def _writer(index: int, folder: str, points: int, dtype: str, writeback: int | None, start, out,
            call: str = "sync_file_range", read_back: bool = False, kind: str = "voxel") -> None:  # fmt: skip
    from tractlens.app.io import tractogram_stream
    from tractlens.app.io.tractogram_stream import open_tractogram_writer

    if writeback is not None:
        tractogram_stream.WRITEBACK_BYTES = writeback
    os.environ[tractogram_stream.ENV_WRITEBACK] = "fadvise" if call == "posix_fadvise" else ""

    part = _part(kind)
    start.wait()
    t0 = time.perf_counter()
    path = Path(folder) / f"writer{index}.trx"
    with open_tractogram_writer(path, part.affine, part.dimensions, positions_dtype=dtype, background=True) as w:
        appended = 0
        append_s = 0.0
        while appended < points:
            a0 = time.perf_counter()
            w.append(part)
            append_s += time.perf_counter() - a0
            appended += part.n_points
        c0 = time.perf_counter()
    close_s = time.perf_counter() - c0
    wall = time.perf_counter() - t0
    row = {"writer": index, "wall_s": round(wall, 3), "append_wait_s": round(append_s, 3), "close_s": round(close_s, 3),
           "bytes": path.stat().st_size, "stages_s": {k: round(v, 3) for k, v in w.seconds.items()}}  # fmt: skip
    if read_back:
        row["resident_after_close"] = resident_fraction(path)
        row["read_back_s"] = read_back_s(path)
    row["crc32_gb_per_s"] = _crc_rate(
        part.points if part.mapped is None else part.mapped.world
    )  # the zip's CRC, on the writer's thread for every byte
    out.put(row)
    path.unlink()


def run(writers: int, folder: Path, points: int, dtype: str, writeback: int | None = None,
        call: str = "sync_file_range", read_back: bool = False, kind: str = "voxel") -> dict:  # fmt: skip
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(i, str(folder), points, dtype, writeback, start, out, call, read_back, kind))
        for i in range(writers)
    ]
    for p in procs:
        p.start()
    time.sleep(3.0)  # every writer has made its part
    t0 = time.perf_counter()
    start.set()
    rows = sorted((out.get() for _ in procs), key=lambda r: r["writer"])
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    total = sum(r["bytes"] for r in rows)
    return {"writers": writers, "parts": kind, "wall_s": round(wall, 3), "gb": round(total / 1e9, 2),
            "gb_per_s": round(total / 1e9 / wall, 3), "per_writer": rows}  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", type=float, default=80e6, help="points per writer (310e6: an HCP subject's tractogram)")
    p.add_argument("--writers", default="1,2", help="concurrent writers, one run each")
    p.add_argument("--folder", type=Path, default=Path("/tmp/tractlens-trx-bench"))
    p.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    p.add_argument("--threads", type=int, help="threads per writer process (BLAS, OpenMP, TRACTLENS_THREADS)")
    p.add_argument("--writeback-mb", type=float, help="start the disk writes every this many MB (0: at close only)")
    p.add_argument("--writeback-call", default="sync_file_range", choices=("sync_file_range", "posix_fadvise"),
                   help="how the writes are started (posix_fadvise: as before, dropping clean pages)")  # fmt: skip
    p.add_argument("--read-back", action="store_true",
                   help="after close: the file's share in the page cache, and seconds to touch every page")  # fmt: skip
    p.add_argument("--parts", default="voxel",
                   help="kinds of part, comma-separated, run in turn for each writer count: voxel (the writer "
                        "converts them to millimetres) or mm (already millimetres, as a GPU run into a file gives)")  # fmt: skip
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.threads:
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TRACTLENS_THREADS"):
            os.environ[name] = str(args.threads)  # inherited by the spawned writers
    args.folder.mkdir(parents=True, exist_ok=True)
    result = {"command": "python tests/benchmarks/bench_trx_write.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "cores": os.cpu_count(), "points_per_writer": int(args.points),
              "writeback_mb": args.writeback_mb, "writeback_call": args.writeback_call, "runs": []}  # fmt: skip
    kinds = [k.strip() for k in args.parts.split(",") if k.strip()]
    if not kinds or set(kinds) - {"voxel", "mm"}:
        p.error("--parts takes voxel and/or mm")
    for n, kind in ((int(v), kind) for v in args.writers.split(",") for kind in kinds):
        writeback = None if args.writeback_mb is None else int(args.writeback_mb * 2**20) or 2**62
        row = run(n, args.folder, int(args.points), args.dtype, writeback, args.writeback_call, args.read_back, kind)
        result["runs"].append(row)
        stages = {
            k: round(max(r["stages_s"][k] for r in row["per_writer"]), 2) for k in row["per_writer"][0]["stages_s"]
        }
        print(f"{n} writer(s), {kind} parts: {row['wall_s']} s, {row['gb_per_s']} GB/s in all; slowest writer's stages {stages}, "
              f"append wait {max(r['append_wait_s'] for r in row['per_writer'])} s", flush=True)  # fmt: skip
        if args.read_back:
            print(f"  after close: crc32 GB/s {[r['crc32_gb_per_s'] for r in row['per_writer']]}, "
                  f"resident {[r['resident_after_close'] for r in row['per_writer']]}, "
                  f"read back {[r['read_back_s'] for r in row['per_writer']]} s", flush=True)  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
