"""Run a ``tractlens`` command in this process while a thread samples the resident memory and
the main thread's innermost project frames, to find which step holds the memory.

    python tests/benchmarks/memory_trace.py [--every 0.5] -- commit --dwi D --tractogram T -o OUT

Prints one line per sample where the RSS grew by more than 0.5 GB since the last line, and the
peak with the stack at that moment; at the end, where the main thread spent its time (the share
of samples per innermost project frame, and per project function anywhere on the stack), a
sampling profile of the whole command. Linux only (reads /proc/self/statm).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 1e9


def where(frame) -> str:
    stack = [f for f in traceback.extract_stack(frame) if "/tractlens/" in f.filename or "/app/" in f.filename
             or "/gpu/" in f.filename]  # fmt: skip
    return " > ".join(f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in stack[-4:])


def main() -> int:
    argv = sys.argv[1:]
    every = 0.5
    if argv[:1] == ["--every"]:
        every, argv = float(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    main_id = threading.get_ident()
    peak = [0.0, ""]
    inner: dict[str, int] = {}
    anywhere: dict[str, int] = {}
    done = threading.Event()
    t0 = time.perf_counter()

    def sample():
        last = 0.0
        while not done.wait(every):
            now = rss_gb()
            frame = sys._current_frames().get(main_id)
            here = where(frame) if frame is not None else "?"
            frames = here.split(" > ")
            inner[frames[-1]] = inner.get(frames[-1], 0) + 1
            for name in {f.rsplit(":", 2)[0] + ":" + f.rsplit(":", 1)[-1] for f in frames}:
                anywhere[name] = anywhere.get(name, 0) + 1
            if now > peak[0]:
                peak[:] = [now, here]
            if now - last > 0.5 or last - now > 2.0:
                print(f"[{time.perf_counter() - t0:7.1f} s] rss {now:6.2f} GB  {here}", file=sys.stderr, flush=True)
                last = now

    threading.Thread(target=sample, daemon=True).start()
    from tractlens.app.cli import main as cli

    try:
        code = cli(argv)
    finally:
        done.set()
        print(f"peak rss {peak[0]:.2f} GB at {peak[1]}", file=sys.stderr, flush=True)
        for title, counts in (("innermost frame", inner), ("on the stack", anywhere)):
            total = max(1, sum(inner.values()))
            print(f"time by {title} ({total} samples of {every} s):", file=sys.stderr)
            for name, n in sorted(counts.items(), key=lambda kv: -kv[1])[:25]:
                print(f"  {n * every:7.1f} s {100 * n / total:5.1f} %  {name}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
