"""``tractlens info`` and ``tractlens demo-data``: the installation, and the built-in phantom."""

from __future__ import annotations

import sys

from tractlens.gpu.backend import get_backend, gpu_status

from .. import __version__
from ._common import EXIT_OK, emit


def add_parsers(sub, common) -> None:
    p = sub.add_parser("info", parents=[common], help="version, backend, GPU name and memory (or why none)")
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
    emit(args, summary, f"TractLens {__version__}\nbackend: {summary['backend']}\n{human_gpu}")
    return EXIT_OK


def cmd_demo_data(args) -> int:
    from ..demo import write_demo

    out = write_demo(args.outdir)
    files = sorted(p.name for p in out.iterdir())
    emit(args, {"outdir": str(out), "files": files}, f"demo dataset written to {out} ({len(files)} files)")
    return EXIT_OK
