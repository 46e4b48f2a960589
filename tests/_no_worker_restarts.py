"""A crashed test worker fails the run; it is not replaced.

pytest-xdist (3.8) replaces a worker that dies (a segmentation fault in a GUI test, say) and, with
``--dist loadfile``, puts the dead worker's file back in the queue, the crashed test included. A
fresh-clone CI run then stopped making progress at 98 % with both workers idle, and the same
happens to a small run whose test crashes every time it runs (tests/test_ci_crash.py keeps the
reverse: the run ends, non-zero, in seconds). So a crash stops the run (``--max-worker-restart=0``)
unless the command line asks for restarts itself: the crashed test is reported as failed
("worker 'gw0' crashed while running ..."), the other worker finishes the file it holds, and the
session ends with exit code 1.

Set here rather than in the test command because pytest without pytest-xdist (the GPU machine's)
would refuse the option in ``addopts``.
"""

from __future__ import annotations


def no_worker_restarts(config) -> None:
    """Make ``--max-worker-restart`` 0 when pytest-xdist is loaded and the option was not given."""
    if getattr(config.option, "maxworkerrestart", "no xdist") is None:
        config.option.maxworkerrestart = "0"
