"""Cohorts: the single-subject pipelines over a BIDS dataset, distributed with Dask.

``tractlens batch`` finds the subjects (:mod:`.dataset`), builds one task per subject and
step whose inputs are earlier steps' outputs (:mod:`.steps`, parameters from :mod:`.config`),
runs each task on a Dask worker exactly as the single-subject command would run
(:mod:`.task`), and names the results per the BIDS derivatives specification with a
provenance sidecar beside each (:mod:`.naming`, :mod:`.provenance`). :mod:`.engines` makes
the Dask cluster (local processes, GPUs through dask-cuda, SLURM/PBS/SGE through
dask-jobqueue, or an existing scheduler) and :mod:`.runner` submits the tasks as they become
ready, one per free worker thread, shows the cohort's progress and collects the summary.

Dask and pybids are the optional extra ``tractlens[batch]``, imported only here and only when
the command runs.
"""
