"""Use cases: one function per user action, called alike by the window, the ``tractlens``
command, batch and Python scripts.

A use case takes files or in-memory objects plus parameters, checks its inputs once (one grid
rule, :class:`app.grid.Grid`, and one set of messages, :class:`app.errors.InputError`), runs the
pipelines of :mod:`app.pipelines`, and reports progress and honours cancellation through plain
callbacks (``progress(done, total)``, ``cancelled()``). The window's panels only build forms,
submit a use case on a worker and show what comes back.
"""
