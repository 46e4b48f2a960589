"""What every subcommand shares: exit codes, progress on stderr, the summary on stdout."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import InputError

log = logging.getLogger("tractlens")

EXIT_OK, EXIT_INTERNAL, EXIT_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


#: Where every :class:`Progress` also reports ``(label, done, total)``, when set (``tractlens batch``
#: passes its workers' step progress on to the cohort display): see :func:`relay_progress`.
_progress_relay: Callable[[str, int, int], None] | None = None


@contextmanager
def relay_progress(callback: Callable[[str, int, int], None]) -> Iterator[None]:
    """Within the block, every :class:`Progress` also calls ``callback(label, done, total)``, even
    when quiet. Process-wide, not per thread: the pipelines report from their own worker threads."""
    global _progress_relay
    previous, _progress_relay = _progress_relay, callback
    try:
        yield
    finally:
        _progress_relay = previous


class Progress:
    """Progress on stderr: a rewritten line on a terminal, a line per 10 % otherwise."""

    def __init__(self, label: str, unit: str, quiet: bool = False):
        self.label, self.unit, self.quiet = label, unit, quiet
        self.tty = sys.stderr.isatty()
        self.last_decile = -1
        self.start = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        if _progress_relay is not None:
            _progress_relay(self.label, done, total)
        if self.quiet or total <= 0:
            return
        fraction = done / total
        decile = int(fraction * 10)
        text = f"{self.label}: {fraction:6.1%} ({done}/{total} {self.unit}, {time.perf_counter() - self.start:.1f} s)"
        if self.tty:
            sys.stderr.write("\r" + text + ("\n" if done >= total else ""))
            sys.stderr.flush()
        elif decile != self.last_decile or done >= total:
            self.last_decile = decile
            print(text, file=sys.stderr, flush=True)


def require_streamlines(tract, path, needs: str) -> None:
    """Refuse a tractogram without streamlines (a valid file: a target nothing reached) for a
    command that computes from them, naming the file (exit status 2, like any unusable input)."""
    if len(tract) == 0:
        raise InputError(
            f"the tractogram holds 0 streamlines: {needs} needs at least one",
            path=path,
            fix="Track again with other regions or parameters, or give another tractogram",
        )


def emit(args, summary: dict, human: str) -> None:
    """The command's summary on stdout: as JSON with ``--json`` (with its provenance: inputs,
    version, command line; see :mod:`app.provenance`), else the one-line ``human`` text."""
    if args.json:
        from ..provenance import with_provenance
        from ..timing import timings

        # read / compute / write seconds, memory peaks
        summary = with_provenance({**summary, "timings": timings()})
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(human)


#: The kernels (method names of :func:`gpu.warmup.catalogue`) each GPU command compiles.
WARMUP_METHODS = {
    "fit-dti": ("fit-dti",),
    "fit-ballstick": ("fit-ballstick",),
    "fit-model": (),  # array code, no kernels to compile: the warm-up only imports CuPy
    "deterministic": ("deterministic", "tracking", "select"),
    "geodesic": ("geodesic", "tracking"),
    "probabilistic": ("probabilistic", "tracking"),
    "commit": ("commit",),
}


#: With ``--device auto``, the warm-up starts only when the inputs are at least this large: a
#: smaller job stays on the CPU by the cost model (the crossovers are ~100 MB of float32 DWI for
#: the tensor fit), and importing CuPy beside it would only slow it down.
AUTO_WARMUP_MIN_BYTES = 32 * 2**20


def input_bytes(args) -> int:
    """The size of the command's main inputs on disk (a folder: its files); 0 when unknown."""
    total = 0
    for name in ("dwi", "tensor", "tractogram", "samples"):
        path = getattr(args, name, None)
        if not path:
            continue
        path = Path(path)
        try:
            files = [f for f in path.iterdir() if f.is_file()] if path.is_dir() else [path]
            total += sum(f.stat().st_size for f in files)
        except OSError:
            continue
    return total


def warm_up_gpu_in_background(args, command: str):
    """Import CuPy and compile ``command``'s kernels on a thread while the files are read
    (:func:`app.pipelines.warmup.start_background_warmup`); the pipelines wait for it before
    their first GPU work. Nothing with ``--device cpu``, where CuPy is not installed, or with
    ``auto`` on inputs smaller than :data:`AUTO_WARMUP_MIN_BYTES`."""
    from ..pipelines.warmup import start_background_warmup

    device = getattr(args, "device", "auto") or "auto"
    if device.lower() == "auto" and input_bytes(args) < AUTO_WARMUP_MIN_BYTES:
        return None
    methods = WARMUP_METHODS[command]
    if command in ("deterministic", "geodesic") and getattr(args, "dwi", None):
        methods += ("fit-dti",)  # tensors are fitted first
    return start_background_warmup(methods, device)
