"""Where one cohort subject's host time goes: ``fit-dti``, ``track deterministic`` and
``connectome`` on bench_batch.py's HCP-sized subject, in one process, under :mod:`cProfile`.

    python tests/benchmarks/profile_subject.py --threads 16 --outdir /tmp/prof --out profile_h200.txt
    python tests/benchmarks/profile_subject.py --quick --outdir /tmp/prof-quick   # checks the script anywhere

``--threads`` is a batch worker's share of the cores (``TRACTLENS_THREADS`` and the BLAS/OpenMP
counts: 16 for each of two workers on a 32-core host). The three commands run twice, each round
in its own folder: the first warms the device, its kernels and the imports; the second is
profiled, each step on its own. The report gives each step's wall seconds and its main thread's
functions by own time and by cumulative time. The work of other threads (the tractogram's
writer, the mask's slabs, the maps' compression) shows only where the main thread waits for it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

THREAD_VARIABLES = ("TRACTLENS_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def steps(subject: Path, out: Path, device: str) -> dict[str, list[str]]:
    """The cohort's three commands for one subject, as bench_batch.py's plain run types them."""
    dwi = next(subject.glob("dwi.nii*"))
    return {
        "fit-dti": ["fit-dti", str(dwi), "-o", str(out / "dti"), "--device", device],
        "track-deterministic": ["track", "deterministic", "--tensor", str(out / "dti"), "--whole-brain",
                                "-o", str(out / "det.trx"), "--device", device],
        "connectome": ["connectome", str(out / "det.trx"), "--labels", str(subject / "labels.nii.gz"),
                       "-o", str(out / "matrix.csv"), "--device", device],
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="a batch worker's threads")
    p.add_argument("--outdir", type=Path, default=Path("/tmp/tractlens-profile"), help="subject and outputs")
    p.add_argument("--device", default="gpu", choices=("gpu", "cpu"))
    p.add_argument("--quick", action="store_true", help="bench_e2e's small subject")
    p.add_argument("--top", type=int, default=25, help="functions listed per step and order")
    p.add_argument("--out", type=Path, help="the report (also printed)")
    args = p.parse_args()
    os.environ.update({name: str(args.threads) for name in THREAD_VARIABLES})

    import bench_batch
    import bench_e2e

    from tractlens.app.cli import main as cli

    spec = bench_e2e.QUICK if args.quick else bench_e2e.SubjectSpec()
    subject = bench_batch.make_subject(spec, args.outdir / "subject", os.cpu_count() or 1)
    report = [f"profile_subject.py --threads {args.threads} --device {args.device}{' --quick' if args.quick else ''}"]
    for round_ in (0, 1):
        out = args.outdir / f"round{round_}"
        out.mkdir(parents=True, exist_ok=True)
        for name, argv in steps(subject, out, args.device).items():
            profile = cProfile.Profile() if round_ else None
            start = time.perf_counter()
            if profile is not None:
                profile.enable()
            code = cli([*argv, "--quiet", "--json"])
            if profile is not None:
                profile.disable()
            wall = time.perf_counter() - start
            if code:
                raise SystemExit(f"{name} exited {code}")
            report.append(f"\n== round {round_} {name}: {wall:.3f} s")
            if profile is None:
                continue
            for order in ("tottime", "cumulative"):
                text = io.StringIO()
                pstats.Stats(profile, stream=text).sort_stats(order).print_stats(args.top)
                body = text.getvalue()
                report.append(f"-- by {order}\n" + body[body.find("ncalls") :])
    text = "\n".join(report)
    print(text, file=sys.stderr)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
