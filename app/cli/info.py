"""``tractlens info`` and ``tractlens demo-data``: the installation, and the built-in phantom.

``tractlens info --compile`` compiles every GPU kernel now (for installers and first runs), so
no later command pays for it: CuPy keeps them in its on-disk cache, which ``info`` names."""

from __future__ import annotations

import sys
import time

from tractlens.gpu.backend import get_backend, gpu_status
from tractlens.gpu.cuda import cache_dir

from .. import __version__
from ..kernel_cache import last_result, shipped_tags
from ._common import EXIT_OK, emit


def add_parsers(sub, common) -> None:
    p = sub.add_parser("info", parents=[common], help="version, backend, GPU name and memory (or why none)")
    p.add_argument(
        "--compile",
        action="store_true",
        help="compile every GPU kernel now (first use only; kept in CuPy's kernel cache)",
    )
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("demo-data", parents=[common], help="write the built-in demo phantom to a folder")
    p.add_argument("outdir", help="folder to write into (created if missing)")
    p.set_defaults(func=cmd_demo_data)


def cmd_info(args) -> int:
    ok, detail = gpu_status()
    summary = {"version": __version__, "python": sys.version.split()[0], "gpu_available": ok}
    if ok:
        backend = get_backend("gpu")
        summary.update(
            backend="gpu",
            gpu_name=detail,
            gpu_memory_total_bytes=backend.total_memory_bytes(),
            gpu_memory_free_bytes=backend.free_memory_bytes(),
        )
        human_gpu = f"GPU: {detail}, {backend.free_memory_bytes() / 2**30:.1f} of {backend.total_memory_bytes() / 2**30:.1f} GiB free"
    else:
        summary.update(backend="cpu", gpu_unavailable_reason=detail)
        human_gpu = f"GPU: none ({detail}); computing on the CPU with NumPy"
    import numpy

    summary["numpy"] = numpy.__version__
    summary["kernel_cache_dir"] = str(cache_dir())
    summary["shipped_kernels"] = shipped_tags()  # compiled ahead of time (app/kernel_cache.py)
    if last_result():
        summary["shipped_kernels_here"] = last_result()
    shipped = ", ".join(summary["shipped_kernels"]) or "none"
    human = (
        f"TractLens {__version__}\nbackend: {summary['backend']}\n{human_gpu}\nkernel cache: {cache_dir()}"
        f"\nshipped kernels: {shipped}"
    )
    if last_result():
        done = last_result()
        why = f": {done['reason']}" if done.get("reason") else ""
        human += f" ({done['tag']} here: {done['status']}{why}, {done['installed']} installed)"
    if args.compile:
        summary.update(_compile(ok, detail, args.quiet))
        human += "\n" + summary.pop("_human")
    emit(args, summary, human)
    return EXIT_OK


def _compile(gpu_ok: bool, reason: str, quiet: bool) -> dict:
    """Compile every kernel of :func:`gpu.warmup.catalogue`: the summary's fields (and its text)."""
    if not gpu_ok:
        return {"compiled": [], "compile_s": 0.0, "_human": f"nothing to compile: no usable GPU ({reason})"}
    from tractlens.gpu.warmup import compile_all

    def progress(done: int, total: int, label: str) -> None:
        if not quiet:
            print(f"compiled {done}/{total}: {label}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    builds = compile_all(progress)
    total_s = time.perf_counter() - start
    lines = [f"  {b.build.label:<40} {b.build.method:<14} {b.seconds:7.2f} s" for b in builds]
    fields = {
        "compiled": [{"kernel": b.build.label, "method": b.build.method, "seconds": b.seconds} for b in builds],
        "compile_s": total_s,
    }
    from .. import rehearsal

    if rehearsal.needed():  # CuPy's own kernels: the GPU commands once on the demo (app/rehearsal.py)
        done = rehearsal.rehearse(reason, lambda i, n, label: progress(i, n, f"rehearsed {label}"))
        fields["rehearsal"] = done
        lines.append(
            "CuPy's kernels: rehearsed before" if done["skipped"] else
            f"CuPy's kernels: {len(done['ran'])} commands rehearsed on the demo in {done['seconds']:.1f} s"
            + (f" ({', '.join(done['failed'])} failed: see the log)" if done["failed"] else "")
        )  # fmt: skip
    else:
        lines.append("CuPy's kernels: installed from the shipped build")
    return {**fields, "_human": "\n".join([f"compiled {len(builds)} GPU kernels in {total_s:.1f} s:", *lines])}


def cmd_demo_data(args) -> int:
    from ..demo import write_demo

    out = write_demo(args.outdir)
    files = sorted(p.name for p in out.iterdir())
    emit(args, {"outdir": str(out), "files": files}, f"demo dataset written to {out} ({len(files)} files)")
    return EXIT_OK
