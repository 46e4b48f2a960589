"""Peak host memory of a CPU COMMIT fit, phase by phase, against the memory guard's estimate.

    python tests/benchmarks/commit_memory_phases.py --streamlines 40000 --shape 64 --meas 288
    python tests/benchmarks/commit_memory_phases.py --dwi D.nii --tractogram T.trx   # a real pair

Runs :func:`app.pipelines.commit.commit_pipeline` on the CPU in this process. Each phase (the
guard's sample, the cut, the EC compartments, the look-up tables, the signal, the operator, its
column norms, the power iteration, FISTA's iterations, the model and the maps) resets the
kernel's high-water mark on entry (``/proc/self/clear_refs``), and reads it on exit: the peak
resident memory within that phase, exact, however short. Printed per phase: the peak (GB), and
the counts (segments, voxels, EC compartments, streamlines) to divide it by. The synthetic input
(no ``--dwi``): curving streamlines (a random walk of their direction, 0.5-voxel steps) in a cube
of ``--shape`` voxels, so a voxel holds many orientations, as a whole-brain tractogram's do.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def status(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")


class Phases:
    """Innermost-phase peaks: on entering or leaving a phase, the peak since the last change
    goes to the phase that was running, and the high-water mark is reset."""

    def __init__(self):
        self.stack = ["start"]
        self.peak: dict[str, int] = {}
        self.entry: dict[str, int] = {}
        self.order: list[str] = []

    def _close(self) -> None:
        name = self.stack[-1]
        self.peak[name] = max(self.peak.get(name, 0), status("VmHWM"))
        if name not in self.order:
            self.order.append(name)
        reset_peak()

    def wrap(self, owner, attr: str, name: str) -> None:
        real = getattr(owner, attr, None)
        if real is None:  # an older tree without it
            return

        def wrapped(*a, **k):
            self._close()
            self.stack.append(name)
            self.entry.setdefault(name, status("VmRSS"))
            try:
                return real(*a, **k)
            finally:
                self._close()
                self.stack.pop()

        setattr(owner, attr, wrapped)


def curving_inputs(n_streamlines: int, side: int, n_meas: int, n_points: int = 160, seed: int = 0, turn: float = 0.05):
    """(DWI, Tractogram): random signal, and streamlines whose direction turns by a random
    angle of about ``turn`` radians a step (many orientations per voxel)."""
    from tractlens.app.io.dwi import DWI
    from tractlens.app.model import Tractogram

    rng = np.random.default_rng(seed)
    points = np.empty((n_streamlines, n_points, 3), dtype=np.float32)
    block = 20_000
    for a in range(0, n_streamlines, block):
        b = min(n_streamlines, a + block)
        pos = rng.uniform(0.2 * side, 0.8 * side, (b - a, 3))
        d = rng.normal(size=(b - a, 3))
        for k in range(n_points):
            d /= np.linalg.norm(d, axis=1, keepdims=True)
            points[a:b, k] = np.clip(pos, 0, side - 1)
            pos = pos + 0.5 * d
            d = d + rng.normal(scale=turn, size=d.shape)
            d = np.where((pos < 1) | (pos > side - 2), -d, d)
    shape = (side, side, side)
    n_b0 = max(1, n_meas // 16)
    bvals = np.r_[np.zeros(n_b0), np.tile([1000.0, 2000.0, 3000.0], n_meas)[: n_meas - n_b0]]
    g = rng.normal(size=(n_meas, 3))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    g[:n_b0] = 0
    data = np.empty((*shape, n_meas), dtype=np.float32)
    for x in range(side):
        data[x] = rng.uniform(0.3, 1.0, (*shape[1:], n_meas))
    data[..., :n_b0] = 1.0
    affine = np.diag([1.25, 1.25, 1.25, 1.0])
    offsets = np.arange(n_streamlines + 1, dtype=np.int64) * n_points
    tract = Tractogram(points.reshape(-1, 3), offsets, affine, shape, {}, {}, name="curving")
    return DWI(data, affine, bvals, g, path="synthetic"), tract


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streamlines", type=int, default=40_000)
    p.add_argument("--shape", type=int, default=64, help="voxels along each side of the synthetic cube")
    p.add_argument("--meas", type=int, default=288)
    p.add_argument("--points", type=int, default=160, help="points per synthetic streamline (0.5-voxel steps)")
    p.add_argument("--turn", type=float, default=0.05, help="random turn of a synthetic streamline per step (rad)")
    p.add_argument("--dwi")
    p.add_argument("--tractogram")
    p.add_argument("--max-iter", type=int, default=2)
    p.add_argument("--ec-orientations", type=int, help="CommitParams.ec_orientations (default: the default)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

    import importlib

    from tractlens.app import memory_guard
    from tractlens.app.pipelines import commit as pipeline
    from tractlens.gpu import commit, commit_host, commit_operator, commit_segments, commit_solver

    try:
        commit_ec = importlib.import_module("tractlens.gpu.commit_ec")
    except ImportError:  # an older tree: EC compartments from every orientation only
        commit_ec = None
    from tractlens.gpu.commit import CommitParams

    if args.dwi:
        from tractlens.app.usecases.commit import commit_from_files

        run = lambda params: commit_from_files(args.dwi, args.tractogram, params=params, device="cpu")[0]  # noqa: E731
    else:
        dwi, tract = curving_inputs(args.streamlines, args.shape, args.meas, args.points, turn=args.turn)
        run = lambda params: pipeline.commit_pipeline(dwi, tract, params=params, device="cpu")  # noqa: E731
    phases = Phases()
    needs = []
    real_check = memory_guard.check_host_memory
    memory_guard.check_host_memory = lambda need, fix, **k: needs.append(need) or real_check(need, fix, **k)
    phases.wrap(memory_guard, "commit_host_need", "guard estimate")
    phases.wrap(commit_segments, "segments", "cut")
    phases.wrap(commit_operator, "ec_from_segments", "EC compartments")
    if commit_ec is not None:
        phases.wrap(commit_ec, "ec_main_orientations", "EC compartments")
    phases.wrap(commit, "lookup_tables", "look-up tables")
    phases.wrap(pipeline, "_normalised_signal", "signal")
    phases.wrap(commit_host, "host_operator", "operator")
    phases.wrap(commit_host.HostOperator, "column_norms", "column norms")
    phases.wrap(commit_solver, "power_iteration", "power iteration")
    phases.wrap(commit_solver, "power_iteration_fused", "power iteration")
    phases.wrap(commit_solver, "fista", "FISTA")
    phases.wrap(commit_solver, "fista_fused", "FISTA")
    phases.wrap(pipeline, "host_fit_errors", "error maps")
    phases.wrap(pipeline.CommitResult, "maps", "maps")
    reset_peak()
    base = status("VmRSS")
    t0 = time.perf_counter()
    extra = {} if args.ec_orientations is None else {"ec_orientations": args.ec_orientations}
    result = run(CommitParams(max_iter=args.max_iter, tol=0.0, **extra))
    phases.stack.append("after the fit")
    result.maps()
    phases._close()
    counts = {
        "segments": len(result.problem.segments),
        "voxels": result.problem.n_rows,
        "ec_compartments": result.problem.n_ec,
        "streamlines": result.problem.n_fibers,
        "measurements": result.problem.n_meas,
        "points": len(result.tractogram.points),
    }
    peaks = {name: phases.peak[name] for name in phases.order}
    entry = {name: phases.entry.get(name, base) for name in phases.order}
    out = {
        "counts": counts,
        "base_rss": base,
        "peak_by_phase": peaks,
        "rss_at_entry": entry,
        "peak": max(peaks.values()),
        "announced": max(n.total for n in needs) if needs else None,  # before the cut, and the fit counted after it
        "announced_fit_counted": needs[1].total if len(needs) > 1 else None,
        "fit_counted_parts": needs[1].parts if len(needs) > 1 else None,
        "announced_parts": needs[0].parts if needs else None,
        "plan": needs[0].plan if needs else None,
        "provenance": {k: v for k, v in result.provenance.items() if k in ("cut_passes", "fit_s", "segments_s")},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(counts))
    print(f"process before the job: {base / 1e9:.3f} GB")
    for name, value in peaks.items():
        print(f"  {name:18s} peak {value / 1e9:7.3f} GB, at entry {entry[name] / 1e9:7.3f} GB")
    if needs:
        print(f"announced {needs[0].total / 1e9:.3f} GB above the start: {needs[0].plan}")
        for k, v in needs[0].parts.items():
            print(f"    {k:26s} {v / 1e9:7.3f} GB")
    if len(needs) > 1:  # the check before the fit, from the exact counts
        print(f"the fit, counted after the cut: {needs[1].total / 1e9:.3f} GB above the start: {needs[1].plan}")
        for k, v in needs[1].parts.items():
            print(f"    {k:26s} {v / 1e9:7.3f} GB")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
