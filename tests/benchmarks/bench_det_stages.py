"""Benchmark: where the seconds of whole-brain deterministic tracking go, stage by stage.

    python tests/benchmarks/bench_det_stages.py [--device cpu|gpu] [--seeds N] [--repeats 3]
        [--folder /tmp] [--out results.json]

On the HCP-like field of ``bench_deterministic.py`` (145×174×145 voxels of 1.25 mm), with
whole-brain seeds (one random seed per voxel with FA ≥ 0.15, shuffled, the first ``--seeds``;
default all of them on a GPU, 20 000 on the CPU), it times (best of ``--repeats``):

- ``track``: the engine, compaction and the copy of the points to the host
  (:func:`gpu.deterministic.track` without scalars);
- ``track_with_scalars``: the same with FA per point and lengths computed by the tracker
  (:class:`gpu.streamlines.StreamlineScalars`: on a GPU before the copy);
- ``host_scalars``: FA per point and lengths on the host, piece by piece, as the pipeline
  does for CPU batches (:func:`app.pipelines.track_parts.deterministic_part`; on a GPU over the
  first batches up to ``--host-points``, 20 M by default: what the device now does instead);
- ``write_trx``: appending the parts to a ``.trx`` and closing it (:mod:`app.io.tractogram_stream`),
  against ``disk``: the same number of bytes written with plain large writes and flushed;
- ``track_with_world``: ``track_with_scalars`` with the points also made millimetres on the
  device (``StreamlineScalars(world=True)``, what a run into a file asks for);
- ``pipeline``: :func:`app.pipelines.track.deterministic_pipeline` writing to a ``.trx`` through
  a background writer, as ``track deterministic --whole-brain`` runs it (without start-up and
  reading), and ``pipeline_host_mm``, the same with the points converted to millimetres by the
  writer's thread on the host (``device_scalars`` asking for no ``world``: how it ran before),
  interleaved with it, best of ``--repeats`` each; ``writer_seconds``: the writer thread's
  stages of each one's best run.

Not part of the test run; about a minute and a half on the GPU machine (1.15 M seeds, ~170 M
points; the host stages once there), 40 s on two CPU cores (20 000 seeds, 2.7 M points).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from bench_deterministic import VOXEL_MM, hcp_like_field  # noqa: E402

from tractlens.app.io.tractogram_stream import open_tractogram_writer  # noqa: E402
from tractlens.app.pipelines import track as track_pipeline  # noqa: E402
from tractlens.app.pipelines.track import TensorField, deterministic_pipeline  # noqa: E402
from tractlens.app.pipelines.track_parts import PIECE_POINTS, PathLength, deterministic_part  # noqa: E402
from tractlens.gpu import deterministic  # noqa: E402
from tractlens.gpu.backend import get_backend  # noqa: E402
from tractlens.gpu.seeding import seeds_in_mask  # noqa: E402
from tractlens.gpu.streamlines import StreamlineBatch  # noqa: E402


def best(repeats: int, fn):
    """(fastest seconds, the last result) of ``repeats`` calls."""
    seconds, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - t0)
    return min(seconds), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--host-points", type=int, default=None, help="points of the host-scalars stage (default: all; 20 M on a GPU)"
    )
    parser.add_argument("--folder", default=tempfile.gettempdir(), help="where the .trx files are written")
    parser.add_argument("--out", default=None, help="JSON file of the results")
    args = parser.parse_args()
    backend = get_backend(args.device)
    if args.host_points is None and backend.is_gpu:
        args.host_points = 20_000_000

    tensor, _fa, brain = hcp_like_field()
    affine = np.diag([-VOXEL_MM, VOXEL_MM, VOXEL_MM, 1.0])
    affine[:3, 3] = [90.0, -126.0, -72.0]
    field_ = TensorField.from_tensor(tensor, affine, "hcp-like")
    params = deterministic.DeterministicParams()
    seed_mask = brain & (field_.fa >= params.fa_threshold)
    seeds = seeds_in_mask(seed_mask, 1, placement="random", rng_seed=0)
    n = args.seeds or (len(seeds) if backend.is_gpu else 20_000)
    seeds = seeds[np.random.default_rng(0).permutation(len(seeds))[:n]]
    tf = deterministic.prepare_field(field_.tensor, field_.voxel_size, field_.mask)
    rows: dict[str, float] = {}

    list(deterministic.track(tf, seeds[:1000], params, device=backend))  # compile, upload, warm up
    rows["track"], batches = best(args.repeats, lambda: list(deterministic.track(tf, seeds, params, device=backend)))
    points = sum(len(b.points) for b in batches)
    streamlines = sum(len(b) for b in batches)
    print(f"{backend.device_name}: {n} seeds, {streamlines} streamlines, {points} points", flush=True)

    try:
        from tractlens.gpu.streamlines import StreamlineScalars
    except ImportError:  # before the tracker computed them
        StreamlineScalars = None
    scalar_batches = None
    if StreamlineScalars is not None:
        scalars = StreamlineScalars(field_.fa, field_.affine)  # compile CuPy's kernels of its array code
        list(deterministic.track(tf, seeds[:1000], params, device=backend, scalars=scalars))
        rows["track_with_scalars"], scalar_batches = best(
            args.repeats,
            lambda: list(
                deterministic.track(
                    tf, seeds, params, device=backend, scalars=StreamlineScalars(field_.fa, field_.affine)
                )
            ),
        )
        rows["track_with_world"], _ = best(
            args.repeats,
            lambda: len(
                list(
                    deterministic.track(
                        tf,
                        seeds,
                        params,
                        device=backend,
                        scalars=StreamlineScalars(field_.fa, field_.affine, world=True),
                    )
                )
            ),
        )

    def parts_of(chosen, plain: bool):
        """Tractogram parts as the pipeline makes them (``plain``: FA and lengths on the host)."""
        path_length = PathLength(field_.affine)
        return [
            deterministic_part(piece, field_.fa, field_.affine, field_.shape, "d", path_length)
            for batch in chosen
            for piece in (
                StreamlineBatch(batch.points, batch.offsets, batch.seed_index, batch.stop, batch.seed_point)
                if plain
                else batch
            ).pieces(PIECE_POINTS)
        ]

    # The host's scalars take seconds per 10 M points: on a GPU (whole brain) they are timed on
    # the first batches up to --host-points, the host stages once, so the whole benchmark stays
    # within a minute and a half there.
    host_repeats = 1 if backend.is_gpu else args.repeats
    some, some_points = [], 0
    for batch in batches:
        if some_points >= (args.host_points or points):
            break
        some.append(batch)
        some_points += len(batch.points)
    rows["host_scalars"], parts = best(host_repeats, lambda: parts_of(some, plain=True))
    rows_points = {"host_scalars": some_points}
    if scalar_batches is not None:  # the parts the GPU pipeline writes: its scalars, wrapped
        parts = parts_of(scalar_batches, plain=False)
        scalar_batches = None
    target = Path(args.folder) / f"bench_det_stages_{os.getpid()}.trx"

    def write():
        with open_tractogram_writer(target, field_.affine, field_.shape) as writer:
            for part in parts:
                writer.append(part)
        return target.stat().st_size

    rows["write_trx"], size = best(host_repeats, write)

    def disk():
        block = np.ones(16 << 20, np.uint8)
        raw = target.with_suffix(".raw")
        with open(raw, "wb") as f:
            for _ in range(0, size, len(block)):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        raw.unlink()

    rows["disk"], _ = best(host_repeats, disk)

    def pipeline():  # the writer's thread writes while the next batch is tracked, as in the command
        with open_tractogram_writer(target, field_.affine, field_.shape, background=True) as writer:
            deterministic_pipeline(field_, seed_points=seeds, params=params, device=backend, sink=writer.append)
        return dict(writer.seconds)

    def pipeline_host_mm():  # the millimetres made by the writer's thread, as before the device made them
        real = track_pipeline.device_scalars
        track_pipeline.device_scalars = lambda backend, field, to_file_only: real(backend, field, False)
        try:
            return pipeline()
        finally:
            track_pipeline.device_scalars = real

    parts = batches = some = None  # not held while the pipeline runs
    runs: dict[str, list] = {"pipeline": [], "pipeline_host_mm": []}
    for _ in range(args.repeats if backend.is_gpu else host_repeats):  # interleaved: the disk's state alike
        for name, run in (("pipeline_host_mm", pipeline_host_mm), ("pipeline", pipeline)):
            runs[name].append(best(1, run))
    writer_seconds = {}
    for name, timed in runs.items():
        rows[name], writer_seconds[name] = min(timed, key=lambda t: t[0])
    target.unlink(missing_ok=True)
    result = {
        "device": backend.device_name,
        "seeds": n,
        "streamlines": streamlines,
        "points": points,
        "trx_bytes": size,
        "seconds": {k: round(v, 3) for k, v in rows.items()},
        "host_scalars_points": some_points,
        "ns_per_point": {k: round(v / max(rows_points.get(k, points), 1) * 1e9, 2) for k, v in rows.items()},
        "writer_seconds": {k: {stage: round(v, 3) for stage, v in w.items()} for k, w in writer_seconds.items()},
        "pipeline_all_s": {k: [round(t[0], 3) for t in timed] for k, timed in runs.items()},
        "trx_gb_per_s": round(size / rows["write_trx"] / 1e9, 2),
        "disk_gb_per_s": round(size / rows["disk"] / 1e9, 2),
    }
    for key, value in rows.items():
        per_point = value / max(rows_points.get(key, points), 1) * 1e9
        print(f"{key:>20}: {value:8.3f} s  {per_point:7.2f} ns/point", flush=True)
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
