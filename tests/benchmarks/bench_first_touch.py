"""Host memory touched for the first time, by 1 and by N processes at once.

In a virtual machine the host backs a guest page only when the guest first writes it, and the
host's faults of one guest are served one after another. A fresh guest then makes every new
allocation and every new page of the page cache slow, and slower still when several processes
allocate at once (as ``batch --gpus 4``'s workers do). Once touched, and freed, the guest's pages
are backed and cheap. This measures it: ``--rounds`` rounds of 1 process, then N processes at
once, each writing ``--gb`` GB of fresh anonymous memory (``np.ones``), GB/s per process.

    python tests/benchmarks/bench_first_touch.py --gb 8 --procs 4 --rounds 2 --out first_touch.json

``--warm GB`` first touches that much memory (in ``--warm-procs`` processes) and frees it (not timed in the
rounds; its own rate is reported), which is what a host that has been up for a while has done.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import time

import numpy as np


def _touch(gb: float, start_at: float, queue) -> None:
    while time.time() < start_at:  # all processes start together
        time.sleep(0.001)
    t0 = time.perf_counter()
    block = np.ones(int(gb * 2**30) // 8, np.float64)
    seconds = time.perf_counter() - t0
    del block
    queue.put(seconds)


def run(gb: float, procs: int) -> dict:
    queue = mp.Queue()
    start_at = time.time() + 0.5
    workers = [mp.Process(target=_touch, args=(gb, start_at, queue)) for _ in range(procs)]
    for w in workers:
        w.start()
    seconds = sorted(queue.get() for _ in workers)
    for w in workers:
        w.join()
    return {"procs": procs, "gb_each": gb, "seconds": seconds, "gb_per_s_each": [round(gb / s, 2) for s in seconds]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=8.0, help="GB each process writes")
    p.add_argument("--procs", type=int, default=4, help="processes at once in the second run of a round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warm", type=float, default=0.0, help="GB touched and freed first (by --warm-procs processes)")
    p.add_argument("--warm-procs", type=int, default=1, help="processes sharing --warm")
    p.add_argument("--out")
    args = p.parse_args(argv)
    result = {"host": platform.node(), "cpus": os.cpu_count(), "rounds": []}
    if args.warm:
        result["warm"] = run(args.warm / args.warm_procs, args.warm_procs)
        print("warm", result["warm"], flush=True)
    for r in range(args.rounds):
        one, many = run(args.gb, 1), run(args.gb, args.procs)
        result["rounds"].append({"one": one, "many": many})
        print(
            f"round {r + 1}: 1 process {one['gb_per_s_each']} GB/s; {args.procs} at once {many['gb_per_s_each']} GB/s each",
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
