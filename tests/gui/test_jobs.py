"""Background jobs keep the GUI thread free and honour Cancel, checked by events, not by the clock:
the GUI thread handles timer events while a job runs (and sees it progress between them), and a
job that would run forever ends, cancelled, when asked. How late the timer is and how long a
cancel takes are measured by tests/benchmarks/bench_gui_latency.py (not in the default run: a
shared, loaded machine makes any time limit flaky)."""

import threading
import time

import numpy as np
from PySide6.QtCore import QTimer

from tractlens.app.demo import gradient_table
from tractlens.app.errors import InputError
from tractlens.gpu.dti import fit_dti
from tractlens.widgets.jobs import CANCELLED, DONE, FAILED, RUNNING

#: Only a guard against a hang (a job that never yields the GUI thread, a cancel never heard):
#: generous, since nothing here is measured against it.
HANG_MS = 120_000


def tensor_fitting_job(seconds: float | None = None, stop: threading.Event | None = None):
    """A realistic CPU job: repeated tensor fits, checking for cancel between batches, until
    ``seconds`` have passed (the benchmark) or ``stop`` is set (the tests: no clock involved).
    (Imports happen here, not in the worker: an import holds the import lock.)"""
    rng = np.random.default_rng(0)
    bvals, bvecs = gradient_table(rng)
    signal = rng.uniform(100, 1000, size=(4000, len(bvals)))

    def job(ctx):
        start = time.perf_counter()
        rounds = 0
        while not (stop is not None and stop.is_set()) and (seconds is None or time.perf_counter() - start < seconds):
            fit_dti(signal, bvals, bvecs, device="cpu", cancelled=ctx.cancelled, batch_voxels=1000)
            rounds += 1
            ctx.progress(rounds, 0 if seconds is None else int(1000 * seconds))
            ctx.check()
        return rounds

    return job


def test_the_gui_thread_handles_events_while_a_job_runs_and_sees_its_progress(qtbot, runner):
    stop = threading.Event()
    finished = []
    job_id = runner.submit("fit", tensor_fitting_job(stop=stop), on_done=finished.append)
    seen = []  # the job's progress, read on the GUI thread at each timer event while it runs
    timer = QTimer()
    timer.setInterval(20)
    timer.timeout.connect(lambda: runner.jobs[job_id].state == RUNNING and seen.append(runner.jobs[job_id].done))
    timer.start()
    # The GUI thread keeps handling timer events while the job runs, and the job advances meanwhile:
    # progress it reported reached the GUI thread between two of them.
    qtbot.waitUntil(lambda: len(seen) >= 25 and len(set(seen)) >= 3, timeout=HANG_MS)
    timer.stop()
    assert runner.jobs[job_id].state == RUNNING and not finished  # all of that while it ran
    assert seen == sorted(seen)
    stop.set()
    qtbot.waitUntil(lambda: bool(finished), timeout=HANG_MS)
    assert runner.jobs[job_id].state == DONE and finished[0] >= max(seen) > 0


def test_cancel_ends_a_job_that_would_run_forever(qtbot, runner):
    done = []
    job_id = runner.submit("fit", tensor_fitting_job(), on_done=done.append)  # no end of its own
    qtbot.waitUntil(lambda: runner.jobs[job_id].state == RUNNING and runner.jobs[job_id].done >= 2, timeout=HANG_MS)
    with qtbot.waitSignal(runner.job_cancelled, timeout=HANG_MS) as cancelled:
        runner.cancel(job_id)
    assert cancelled.args == [job_id]
    assert runner.jobs[job_id].state == CANCELLED and done == []  # heard between batches; no result
    assert runner.wait(HANG_MS / 1000)  # its worker has ended too


def test_errors_become_messages(qtbot, runner):

    def bad_input(ctx):
        raise InputError("the mask is empty", path="roi.nii.gz", fix="Draw a region")

    def bug(ctx):
        return 1 / 0

    errors = []
    with qtbot.waitSignal(runner.job_failed, timeout=5000):
        a = runner.submit("a", bad_input, on_error=lambda m, d: errors.append((m, d)))
    with qtbot.waitSignal(runner.job_failed, timeout=5000):
        b = runner.submit("b", bug, on_error=lambda m, d: errors.append((m, d)))
    assert errors[0] == ("roi.nii.gz: the mask is empty. Draw a region.", "")
    assert errors[1][0].startswith("internal error: ZeroDivisionError") and "Traceback" in errors[1][1]
    assert runner.jobs[a].state == runner.jobs[b].state == FAILED


def test_partial_results_arrive_in_order_on_the_gui_thread(qtbot, runner):
    import threading

    main = threading.get_ident()
    seen = []

    def job(ctx):
        for i in range(5):
            ctx.partial(i)
        return "ok"

    runner.submit("p", job, on_partial=lambda x: seen.append((x, threading.get_ident() == main)))
    qtbot.waitUntil(lambda: len(seen) == 5, timeout=5000)
    assert seen == [(i, True) for i in range(5)]


def test_finished_jobs_let_go_of_their_results_and_the_history_is_bounded(qtbot, runner):
    """A live re-track starts a job per edit: the runner must not keep every result (each can
    be a whole tractogram) nor an ever-growing job list."""
    import weakref

    from tractlens.widgets.jobs import KEEP_ENDED
    from tractlens.widgets.panels import JobPanel

    class Result:
        pass

    panel = JobPanel(runner)
    qtbot.addWidget(panel)
    delivered = []
    refs = []

    def make(ctx):
        result = Result()
        refs.append(weakref.ref(result))
        return result

    for _ in range(KEEP_ENDED + 20):
        runner.submit("re-track", make, on_done=delivered.append)
    assert runner.wait(30)
    qtbot.waitUntil(lambda: len(delivered) == KEEP_ENDED + 20, timeout=10_000)
    assert len(runner.jobs) == KEEP_ENDED and panel.tree.topLevelItemCount() == KEEP_ENDED
    assert min(runner.jobs) == 21  # the oldest were dropped
    assert all(job.result is None for job in runner.jobs.values())
    # Nor a signal object per job ever run (they are the runner's children: 120 stayed alive).
    signal_objects = lambda: [c for c in runner.children() if type(c).__name__ == "_Signals"]  # noqa: E731
    qtbot.waitUntil(lambda: len(signal_objects()) == KEEP_ENDED, timeout=10_000)  # deleted by the event loop
    delivered.clear()
    import gc

    gc.collect()
    assert all(ref() is None for ref in refs)  # nothing else holds them


def test_a_finished_job_shows_done_not_its_last_progress_message(qtbot, runner):
    """The job list's detail line and state column say what a job is doing while it runs and
    that it is done when it is: the last progress message ("reading the reference series")
    must not stay as if it were still at that step."""
    from tractlens.widgets.job_panel import JobPanel

    panel = JobPanel(runner)
    qtbot.addWidget(panel)

    def job(ctx):
        ctx.progress(0, 2, "reading the reference series")
        ctx.progress(1, 2)
        return "ok"

    with qtbot.waitSignal(runner.job_finished, timeout=5000):
        job_id = runner.submit("export for navigation", job)
    assert runner.jobs[job_id].state == DONE
    assert panel.detail.text() == "export for navigation: done"
    item = panel.tree.topLevelItem(0)
    assert item.text(2) == "done" and "reading" not in item.toolTip(2)


def test_a_job_starts_before_it_is_announced_and_the_job_list_never_repaints_on_the_spot(qtbot, runner):
    """The job list hears of a job after its worker has it, and its progress bars repaint with the
    window's next update, not synchronously (a synchronous repaint composes the whole window, and
    draws a due 3-D frame, in the middle of an ROI edit's selection job being started)."""
    from PySide6.QtCore import QEvent, QObject

    from tractlens.widgets.job_panel import JobPanel

    panel = JobPanel(runner)
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    release = threading.Event()
    seen_active = []
    runner.job_added.connect(lambda _id: seen_active.append(runner.pool.activeThreadCount()))

    class Paints(QObject):
        count = 0

        def eventFilter(self, _watched, event):
            if event.type() == QEvent.Type.Paint:
                Paints.count += 1
            return False

    def job(ctx):
        release.wait(HANG_MS / 1000)
        ctx.progress(1, 2)
        return 1

    try:
        first = runner.submit("select streamlines", job)
        assert seen_active == [1]  # the worker had it when the list was told
        release.set()
        qtbot.waitUntil(lambda: runner.jobs[first].state == DONE, timeout=HANG_MS)
        _item, bar = panel._items[first]
        assert bar.maximum() == 1000 and bar.value() > 0  # (its progress: out of the busy range)
        watcher = Paints()
        bar.installEventFilter(watcher)
        release.clear()
        second = runner.submit("select streamlines", job)  # the same row: its bar emptied again
        assert panel._items[second][1] is bar and (bar.minimum(), bar.maximum(), bar.value()) == (0, 1000, 0)
        assert Paints.count == 0  # not repainted within the call
        qtbot.waitUntil(lambda: Paints.count > 0, timeout=HANG_MS)  # but with the next update
        release.set()
        qtbot.waitUntil(lambda: runner.jobs[second].state == DONE, timeout=HANG_MS)
    finally:
        release.set()  # (a failed check leaves no worker waiting)


def test_a_job_without_progress_shows_its_seconds_not_an_animation_and_the_status_bar_names_it_later(qtbot, runner):
    """No busy bar anywhere: Qt animates one at 30 frames a second, each composing the whole
    window (a third of the GUI thread on an H200 machine). A job that reports no progress shows
    its running seconds in its row, renewed once a second; the status bar says "running: <job>"
    only once jobs have run for BUSY_AFTER_MS (a selection at a brush stroke shows nothing)."""
    from PySide6.QtWidgets import QStatusBar

    from tractlens.widgets.job_panel import BUSY_AFTER_MS, BusyIndicator, JobPanel

    panel = JobPanel(runner)
    bar_holder = QStatusBar()
    busy = BusyIndicator(runner)
    bar_holder.addPermanentWidget(busy)
    for widget in (panel, bar_holder):
        qtbot.addWidget(widget)
        widget.show()
    release = threading.Event()

    def job(ctx):
        release.wait(HANG_MS / 1000)
        if ctx.cancelled():
            raise InputError("stopped")
        return 1

    try:
        job_id = runner.submit("fit the model", job)
        _item, bar = panel._items[job_id]
        assert bar.maximum() == 1000 and panel.ticker.isActive()  # a range: never the busy animation
        assert not busy.isVisible() and busy.later.isActive() and busy.later.interval() == BUSY_AFTER_MS
        qtbot.waitUntil(lambda: runner.jobs[job_id].state == RUNNING, timeout=HANG_MS)
        runner.jobs[job_id].started_at -= 3.2  # as if it had run for three seconds
        panel._tick()
        assert bar.format() == "3 s" and bar.maximum() == 1000
        qtbot.waitUntil(busy.isVisible, timeout=HANG_MS)
        assert busy.text() == "running: fit the model"
        runner.cancel(job_id)
        release.set()
        qtbot.waitUntil(lambda: runner.jobs[job_id].state in (CANCELLED, FAILED), timeout=HANG_MS)
        assert bar.format() == "" and not busy.isVisible() and not busy.later.isActive()
        panel._tick()  # nothing waits: the seconds stop
        assert not panel.ticker.isActive()
        quick = runner.submit("select streamlines", lambda ctx: 2)
        qtbot.waitUntil(lambda: runner.jobs[quick].state == DONE, timeout=HANG_MS)
        assert not busy.isVisible() and not busy.later.isActive()  # done: nothing said, nothing pending
        assert panel._items[quick][1].format() == "%p%" and panel._items[quick][1].value() == 1000
    finally:
        release.set()
