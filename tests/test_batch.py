"""tractlens batch: a 3-subject BIDS dataset made from the demo phantom, on a LocalCluster of 2
worker processes — outputs equal to the single-subject commands', skip when done, re-run on a
changed parameter, a worker killed mid-task, a corrupt subject, Ctrl+C, and the SLURM job script."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

pytest.importorskip("distributed", reason="the batch extra (dask[distributed]) is part of the test extra")
pytest.importorskip("bids", reason="the batch extra (pybids) is part of the test extra")

from tractlens.app.batch.config import load_config
from tractlens.app.batch.dataset import find_series
from tractlens.app.batch.engines import cluster_arguments, start_cluster
from tractlens.app.batch.naming import sidecar_of
from tractlens.app.batch.plan import build_plan
from tractlens.app.batch.runner import run_plan
from tractlens.app.batch.staging import remove_staging
from tractlens.app.batch.steps import STEPS
from tractlens.app.cli import main
from tractlens.app.errors import InputError

PIPELINE = ["fit-dti", "track-deterministic", "connectome", "profile"]
SUBJECTS = ("01", "02", "03")


def make_bids(root: Path, demo_dir: Path, subjects=SUBJECTS, corrupt=()) -> Path:
    """A BIDS dataset whose subjects are copies of the demo phantom (``corrupt``: a DWI that is
    not a NIfTI, as a failed transfer leaves it)."""
    root.mkdir(parents=True)
    (root / "dataset_description.json").write_text(json.dumps({"Name": "phantoms", "BIDSVersion": "1.9.0"}))
    for subject in subjects:
        folder = root / f"sub-{subject}" / "dwi"
        folder.mkdir(parents=True)
        for ext in ("nii.gz", "bval", "bvec"):
            shutil.copy(demo_dir / f"dwi.{ext}", folder / f"sub-{subject}_dwi.{ext}")
        if subject in corrupt:
            (folder / f"sub-{subject}_dwi.nii.gz").write_bytes(b"\x1f\x8b not really a gzip stream" * 10)
    return root


def write_config(path: Path, demo_dir: Path, **extra_tables) -> Path:
    tables = {
        "connectome": {"labels": str(demo_dir / "parcellation.nii.gz"), "lut": str(demo_dir / "parcellation.txt")}
    }
    for step, table in extra_tables.items():
        tables.setdefault(step.replace("_", "-"), {}).update(table)
    lines = []
    for step, table in tables.items():
        lines.append(f"[{step}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def client():
    """One LocalCluster of 2 worker processes for the module (what --workers 2 builds)."""
    from distributed import Client

    choice = cluster_arguments(workers=2)
    assert choice.name == "LocalCluster" and choice.kwargs["n_workers"] == 2
    cluster = start_cluster(choice)
    with Client(cluster) as c:
        yield c
    cluster.close()


@pytest.fixture(scope="module")
def cohort(demo_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("cohort")
    bids = make_bids(root / "bids", demo_dir)
    return bids, write_config(root / "params.toml", demo_dir), root / "derivatives"


def run(bids, derivatives, steps, config_path, client, *, participants=None, on_event=None) -> dict:
    """The batch run through the Python API on the shared cluster: ``{(step, subject): result}``."""
    series = find_series(bids, participants)
    config = load_config(config_path, steps)
    staging = derivatives / ".staging" / "test"
    plan = build_plan(series, steps, config, derivatives, device="cpu", staging=staging, generated_by=["test"])
    results = run_plan(plan, client, on_event=on_event)
    remove_staging(staging)
    return {(r["step"], r["subject"]): r for r in results}


@pytest.fixture(scope="module")
def first_run(cohort, client):
    bids, config, derivatives = cohort
    return run(bids, derivatives, PIPELINE, config, client)


def outputs_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.endswith(".json"))


def test_first_run_does_every_subject_step_and_names_outputs_per_bids(first_run, cohort):
    _bids, _, derivatives = cohort
    assert {r["status"] for r in first_run.values()} == {"done"}
    assert len(first_run) == len(SUBJECTS) * len(PIPELINE)
    # each step's outputs were flushed by its worker before the run reported (then the sidecars)
    assert all(r["durable"] == "done" and r["timing"]["durable_s"] >= 0 for r in first_run.values())
    for subject in SUBJECTS:
        folder = derivatives / f"sub-{subject}" / "dwi"
        names = {p.name for p in outputs_of(folder)}
        assert f"sub-{subject}_space-dwi_model-tensor_param-fa_dwimap.nii.gz" in names
        assert f"sub-{subject}_space-dwi_desc-deterministic_tractography.trx" in names
        assert f"sub-{subject}_space-dwi_meas-count_desc-deterministic_connectome.csv" in names
        assert f"sub-{subject}_space-dwi_param-fa_desc-deterministic_profile.csv" in names
        for output in outputs_of(folder):  # one sidecar per output, with its provenance
            record = json.loads(sidecar_of(output).read_text())
            assert record["Step"] in PIPELINE and record["Parameters"] and record["Inputs"]
            assert all({"path", "size", "mtime_ns"} <= set(i) for i in record["Inputs"].values())
    assert not (derivatives / ".staging" / "test").exists()


def test_outputs_equal_the_single_subject_commands(first_run, cohort, demo_dir, tmp_path):
    """sub-01 through the four plain commands, as a user types them, gives the same maps,
    streamlines, matrix and profile as the cohort run."""
    from tractlens.app.io import load_tractogram

    bids, _, derivatives = cohort
    dwi = bids / "sub-01" / "dwi" / "sub-01_dwi.nii.gz"
    dti, trx = tmp_path / "dti", tmp_path / "det.trx"
    assert main(["fit-dti", str(dwi), "-o", str(dti), "--device", "cpu", "--quiet"]) == 0
    assert main(["track", "deterministic", "--tensor", str(dti), "--whole-brain", "-o", str(trx), "--device", "cpu",
                 "--quiet"]) == 0  # fmt: skip
    labels, lut = demo_dir / "parcellation.nii.gz", demo_dir / "parcellation.txt"
    assert main(["connectome", str(trx), "--labels", str(labels), "--lut", str(lut), "-o", str(tmp_path / "c.csv"),
                 "--device", "cpu", "--quiet"]) == 0  # fmt: skip
    assert (
        main(["profile", str(trx), "--map", str(dti / "dti_FA.nii.gz"), "-o", str(tmp_path / "p.csv"), "--quiet"]) == 0
    )
    folder = derivatives / "sub-01" / "dwi"
    for native, param in (("FA", "fa"), ("MD", "md"), ("tensor", "tensor"), ("V1", "v1"), ("RGB", "rgb")):
        ours = nib.load(folder / f"sub-01_space-dwi_model-tensor_param-{param}_dwimap.nii.gz")
        theirs = nib.load(dti / f"dti_{native}.nii.gz")
        np.testing.assert_array_equal(ours.get_fdata(), theirs.get_fdata())
        np.testing.assert_array_equal(ours.affine, theirs.affine)
    np.testing.assert_array_equal(
        nib.load(folder / "sub-01_space-dwi_desc-brain_mask.nii.gz").get_fdata(),
        nib.load(dti / "dti_mask.nii.gz").get_fdata(),
    )
    ours = load_tractogram(folder / "sub-01_space-dwi_desc-deterministic_tractography.trx")
    theirs = load_tractogram(trx)
    assert len(ours) == len(theirs) > 1000
    np.testing.assert_array_equal(ours.points, theirs.points)
    np.testing.assert_array_equal(ours.offsets, theirs.offsets)
    assert (folder / "sub-01_space-dwi_meas-count_desc-deterministic_connectome.csv").read_text() == (
        tmp_path / "c.csv"
    ).read_text()
    assert (folder / "sub-01_space-dwi_param-fa_desc-deterministic_profile.csv").read_text() == (
        tmp_path / "p.csv"
    ).read_text()


def test_second_run_skips_everything(first_run, cohort, client):
    bids, config, derivatives = cohort
    before = {p: p.stat().st_mtime_ns for p in derivatives.rglob("*") if p.is_file()}
    again = run(bids, derivatives, PIPELINE, config, client)
    assert {r["status"] for r in again.values()} == {"skipped"}
    assert {p: p.stat().st_mtime_ns for p in derivatives.rglob("*") if p.is_file()} == before


def test_changed_parameter_reruns_only_that_step(first_run, cohort, client, demo_dir, tmp_path):
    bids, _, derivatives = cohort
    changed = write_config(tmp_path / "params.toml", demo_dir, connectome={"radius": 3.0})
    again = run(bids, derivatives, PIPELINE, changed, client)
    assert {key for key, r in again.items() if r["status"] == "done"} == {("connectome", f"sub-{s}") for s in SUBJECTS}
    assert {r["status"] for key, r in again.items() if key[0] != "connectome"} == {"skipped"}
    record = json.loads(
        sidecar_of(derivatives / "sub-02/dwi/sub-02_space-dwi_meas-count_desc-deterministic_connectome.csv").read_text()
    )
    assert record["Parameters"]["ConnectomeParams"]["radius_mm"] == 3.0


def test_worker_killed_mid_task_is_rerun_and_leaves_nothing_half_written(cohort, client, demo_dir, tmp_path):
    """SIGKILL the worker process tracking sub-01 at its first progress report: the scheduler
    reruns the task on a live worker; every output is whole, with its sidecar."""
    from tractlens.app.io import load_tractogram

    bids, _, _ = cohort
    derivatives = tmp_path / "derivatives"
    config = write_config(tmp_path / "params.toml", demo_dir, track_deterministic={"seeds-per-voxel": 3})
    killed: list[int] = []
    after_kill: list[int] = []
    lock = threading.Lock()

    def on_event(event: dict) -> None:
        if not event["key"].startswith("track-deterministic/"):
            return
        with lock:
            if not killed:
                killed.append(event["pid"])
                os.kill(event["pid"], signal.SIGKILL)
            elif event["pid"] != killed[0]:
                after_kill.append(event["pid"])

    results = run(bids, derivatives, ["fit-dti", "track-deterministic"], config, client, participants=["01"],
                  on_event=on_event)  # fmt: skip
    assert killed and after_kill, "the tracking task was killed and then ran again in another process"
    assert {r["status"] for r in results.values()} == {"done"}
    folder = derivatives / "sub-01" / "dwi"
    trx = folder / "sub-01_space-dwi_desc-deterministic_tractography.trx"
    record = json.loads(sidecar_of(trx).read_text())
    assert len(load_tractogram(trx)) == record["Summary"]["streamlines"] > 0
    for output in outputs_of(folder):
        assert sidecar_of(output).exists()
    assert len(outputs_of(folder)) == len(STEPS["fit-dti"].primary("sub-01", {})) + 1
    leftovers = [p for p in derivatives.rglob("*") if ".staging" in p.parts or "tmp" in p.name.lower()]
    assert leftovers == []
    client.wait_for_workers(2, timeout=60)  # the nanny restarted the killed worker


def test_corrupt_subject_is_reported_and_the_others_done(demo_dir, tmp_path, client, capsys):
    """Through the command, on the running scheduler (--scheduler): exit status 3, the failure
    named with its reason in the --json summary, the other subjects' outputs written."""
    bids = make_bids(tmp_path / "bids", demo_dir, subjects=("01", "02"), corrupt=("02",))
    derivatives = tmp_path / "derivatives"
    code = main(["batch", str(bids), "-o", str(derivatives), "--pipeline", "fit-dti,track-deterministic",
                 "--scheduler", client.scheduler.address, "--json", "--quiet"])  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert code == 3
    assert summary["counts"] == {"done": 2, "skipped": 0, "failed": 1, "not-run": 1}
    failed = summary["failed"][0]
    assert failed["subject"] == "sub-02" and failed["step"] == "fit-dti"
    assert "sub-02_dwi.nii.gz" in failed["reason"]
    assert summary["not_run"][0]["step"] == "track-deterministic"
    assert (derivatives / "sub-01/dwi/sub-01_space-dwi_desc-deterministic_tractography.trx").exists()
    assert not (derivatives / "sub-02").exists()
    description = json.loads((derivatives / "dataset_description.json").read_text())
    assert description["DatasetType"] == "derivative"
    assert description["GeneratedBy"][-1]["Name"] == "tractlens" and "Version" in description["GeneratedBy"][-1]


def test_interrupted_run_cancels_and_leaves_no_staging(demo_dir, tmp_path, client, monkeypatch, capsys):
    """Ctrl+C after the first finished subject-step: exit status 130, the futures cancelled,
    the staging folder removed, and every output there is whole with its sidecar."""
    from tractlens.app.batch import runner

    bids = make_bids(tmp_path / "bids", demo_dir, subjects=("01", "02"))
    derivatives = tmp_path / "derivatives"

    def interrupt(self, key, status):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner.CohortProgress, "finished", interrupt)
    code = main(["batch", str(bids), "-o", str(derivatives), "--pipeline", "fit-dti,track-deterministic",
                 "--scheduler", client.scheduler.address, "--quiet"])  # fmt: skip
    assert code == 130
    assert "interrupted" in capsys.readouterr().err
    # A task that had started runs to its end on the external scheduler (the scheduler forgets a
    # cancelled task at once, its worker thread does not): wait until its files have settled.
    _wait_until_settled(client, timeout_s=600)
    assert not any(".staging" in p.parts for p in derivatives.rglob("*") if p.is_file())
    for output in (p for p in derivatives.glob("sub-*/dwi/*") if not p.name.endswith(".json")):
        assert sidecar_of(output).exists() or not output.exists()


def _wait_until_settled(client, timeout_s: float) -> None:
    """Until no worker runs a task any more, nor flushes one's outputs. A cancelled task that had
    started runs to its end in its worker's thread (its clean-up included) while the scheduler
    has already forgotten it, so the scheduler's ``processing`` cannot tell; each worker's
    ``active_threads`` can (a task leaves it when its function returns). ``timeout_s`` only
    guards against a hang."""
    import time

    def running(dask_worker) -> int:
        return len(dask_worker.active_threads)

    end = time.monotonic() + timeout_s
    while any(client.run(running).values()):
        if time.monotonic() > end:
            raise AssertionError(f"tasks still running after {timeout_s} s")
        time.sleep(0.2)
    # then the flushes those tasks queued (their sidecars come after them): an interrupted run
    # does not wait for them, a worker that lives on still writes them
    from tractlens.app.batch import durable

    client.run(durable.drain_on_worker, None)


def test_config_with_an_unknown_key_names_the_valid_ones(tmp_path):
    path = tmp_path / "params.toml"
    path.write_text("[track-deterministic]\nfa-treshold = 0.2\n")
    with pytest.raises(InputError, match="fa-treshold") as info:
        load_config(path, ["track-deterministic"])
    assert "fa-threshold" in str(info.value) and "max-angle" in str(info.value)


def test_config_values_are_checked_by_the_dataclasses(tmp_path):
    path = tmp_path / "params.toml"
    path.write_text("[track-deterministic]\nfa-threshold = 7\n")
    with pytest.raises(InputError, match="FA threshold"):
        load_config(path, ["track-deterministic"])


def test_connectome_without_labels_is_refused_before_any_work(cohort, tmp_path):
    bids, _, _ = cohort
    series = find_series(bids)
    with pytest.raises(InputError, match="parcellation"):
        build_plan(
            series, ["connectome"], {"connectome": {}}, tmp_path, device="cpu", staging=tmp_path, generated_by=[]
        )


def test_missing_upstream_output_names_the_step_to_add(cohort, demo_dir, tmp_path):
    bids, config, _ = cohort
    series = find_series(bids)
    with pytest.raises(InputError, match="Add track-deterministic"):
        build_plan(series, ["connectome"], load_config(config, ["connectome"]), tmp_path / "empty", device="cpu",
                   staging=tmp_path, generated_by=[])  # fmt: skip


def test_unknown_participant_lists_the_ones_there(cohort):
    bids, _, _ = cohort
    with pytest.raises(InputError, match="Choose among: 01, 02, 03"):
        find_series(bids, ["sub-07"])


def readme_slurm_config() -> str:
    """The worked SLURM config of the user guide's Cohorts page (docs/guide/cohorts.md)."""
    cohorts = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "cohorts.md").read_text(encoding="utf-8")
    start = cohorts.index("```yaml\n# slurm.yaml") + len("```yaml\n")
    return cohorts[start : cohorts.index("```", start)]


def test_slurm_job_script_from_the_readme_config(tmp_path):
    """dask-jobqueue's job script for the docs' worked SLURM config (no SLURM here: the
    script is generated, not submitted)."""
    import sys

    from dask_jobqueue import SLURMCluster

    config = tmp_path / "slurm.yaml"
    config.write_text(readme_slurm_config())
    choice = cluster_arguments(cluster="slurm", cluster_config=config, gpus=1)
    assert choice.name == "SLURMCluster" and choice.jobs == 10 and choice.device == "gpu"
    with SLURMCluster(**choice.kwargs) as cluster:
        script = cluster.job_script()
    for line in ("#SBATCH -p gpu", "#SBATCH -A neuro", "#SBATCH --cpus-per-task=8", "#SBATCH -t 04:00:00",
                 "#SBATCH --gres=gpu:1", "module load cuda/12.4", "export NCCL_NVLS_ENABLE=0"):  # fmt: skip
        assert line in script, script
    assert f"{sys.executable} -m distributed.cli.dask_worker" in script
    assert "--nthreads 1" in script and "--memory-limit" in script and "--local-directory $TMPDIR" in script


def test_cluster_config_with_an_unknown_setting_is_refused(tmp_path):
    config = tmp_path / "slurm.toml"
    config.write_text('cores = 8\nmemory = "32GB"\nwalltimes = "1:00:00"\n')
    with pytest.raises(InputError, match="walltimes") as info:
        cluster_arguments(cluster="slurm", cluster_config=config)
    assert "walltime" in str(info.value)


def _with_dask_cuda(monkeypatch, present: bool):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if present else None) if name == "dask_cuda" else find_spec(name, *a))  # fmt: skip


def test_gpus_build_one_cuda_worker_per_gpu_with_nvls_off(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _with_dask_cuda(monkeypatch, True)
    choice = cluster_arguments(gpus=2)
    assert (choice.module, choice.name) == ("dask_cuda", "LocalCUDACluster")
    assert choice.kwargs["CUDA_VISIBLE_DEVICES"] == "0,1" and choice.kwargs["n_workers"] == 2
    assert choice.environ == {"NCCL_NVLS_ENABLE": "0"} and choice.device == "gpu"


@pytest.mark.gpu
def test_two_subjects_through_local_cuda_cluster(demo_dir, tmp_path, capsys):
    bids = make_bids(tmp_path / "bids", demo_dir, subjects=("01", "02"))
    derivatives = tmp_path / "derivatives"
    code = main(["batch", str(bids), "-o", str(derivatives), "--pipeline", "fit-dti,track-deterministic",
                 "--gpus", "1", "--json", "--quiet"])  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["counts"]["done"] == 4
    record = json.loads(
        sidecar_of(derivatives / "sub-02/dwi/sub-02_space-dwi_desc-deterministic_tractography.trx").read_text()
    )
    assert record["Summary"]["backend"] == "gpu" and "--device" in record["Command"]


@pytest.mark.gpu
def test_two_workers_per_gpu_write_what_one_worker_writes(demo_dir, tmp_path, capsys):
    """Three subjects on one GPU shared by two worker processes: every step done, and each
    subject's tractogram and connectome equal to those of one worker per GPU."""
    import trx.trx_file_memmap as tmm

    bids = make_bids(tmp_path / "bids", demo_dir, subjects=("01", "02", "03"))
    config = write_config(tmp_path / "params.toml", demo_dir)
    outputs = {}
    for k in (1, 2):
        derivatives = tmp_path / f"derivatives_{k}"
        code = main(["batch", str(bids), "-o", str(derivatives), "--pipeline", "fit-dti,track-deterministic,connectome",
                     "--config", str(config), "--gpus", "1", "--workers-per-gpu", str(k), "--json", "--quiet"])  # fmt: skip
        summary = json.loads(capsys.readouterr().out)
        assert code == 0 and summary["counts"]["done"] == 9, summary
        outputs[k] = derivatives
    for subject in ("01", "02", "03"):
        name = f"sub-{subject}/dwi/sub-{subject}_space-dwi_desc-deterministic_tractography.trx"
        one, two = (tmm.load(str(outputs[k] / name)) for k in (1, 2))
        try:
            np.testing.assert_array_equal(one.streamlines._data, two.streamlines._data)
            np.testing.assert_array_equal(one.streamlines._offsets, two.streamlines._offsets)
        finally:
            one.close()
            two.close()
        matrices = [sorted((outputs[k] / f"sub-{subject}/dwi").glob("*connectome*.csv")) for k in (1, 2)]
        assert matrices[0] and [m.name for m in matrices[0]] == [m.name for m in matrices[1]]
        for a, b in zip(*matrices):
            assert a.read_text() == b.read_text()


@pytest.mark.gpu
def test_two_workers_per_gpu_each_hold_half_of_its_memory(monkeypatch):
    """Each of the two worker processes on one GPU sizes its work from half the device."""
    from tractlens.app.batch.engines import connect

    monkeypatch.delenv("CUPY_GPU_MEMORY_LIMIT", raising=False)

    def share():
        from tractlens.gpu.backend import get_backend

        backend = get_backend("gpu")
        return (
            backend.xp.get_default_memory_pool().get_limit(),
            backend.total_memory_bytes(),
            backend.free_memory_bytes(),
        )

    client, cluster = connect(None, cluster_arguments(gpus=1, workers_per_gpu=2))
    try:
        seen = list(client.run(share).values())
    finally:
        client.close()
        cluster.close()
    assert len(seen) == 2
    for limit, total, free in seen:
        assert abs(limit - total / 2) <= 2**20 and free <= limit

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    _with_dask_cuda(monkeypatch, False)
    choice = cluster_arguments(gpus=2)
    assert (choice.module, choice.name) == ("distributed", "LocalCluster") and choice.kwargs["n_workers"] == 2
    assert choice.kwargs["processes"] and choice.pin_gpus == ["3", "5"] and choice.device == "gpu"
    assert choice.environ == {"NCCL_NVLS_ENABLE": "0"}


def test_the_pin_plugin_gives_each_worker_process_its_own_gpu(monkeypatch):
    """A real LocalCluster of two processes with the plugin: each worker sees one device of its own."""
    import os

    from tractlens.app.batch.engines import connect

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,7")
    _with_dask_cuda(monkeypatch, False)
    client, cluster = connect(None, cluster_arguments(gpus=2))
    try:
        seen = client.run(lambda: (os.environ["CUDA_VISIBLE_DEVICES"], os.environ["NCCL_NVLS_ENABLE"]))
    finally:
        client.close()
        cluster.close()
    assert sorted(seen.values()) == [("4", "0"), ("7", "0")]


@pytest.mark.parametrize("dask_cuda", [True, False])
def test_workers_per_gpu_start_k_pinned_processes_on_each_gpu_with_their_share_of_the_cores(monkeypatch, dask_cuda):
    """K > 1 always takes the LocalCluster with the pinning plugin (dask-cuda makes one worker per GPU)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    monkeypatch.delenv("TRACTLENS_THREADS", raising=False)
    monkeypatch.setattr("tractlens.app.batch.engines.host_cores", lambda: 16)
    _with_dask_cuda(monkeypatch, dask_cuda)
    choice = cluster_arguments(gpus=2, workers_per_gpu=2)
    assert (choice.module, choice.name) == ("distributed", "LocalCluster")
    assert choice.kwargs["n_workers"] == 4 and choice.kwargs["threads_per_worker"] == 1
    assert choice.pin_gpus == ["3", "5"] and choice.worker_environ["TRACTLENS_THREADS"] == "4"
    assert choice.worker_environ["CUPY_GPU_MEMORY_LIMIT"] == "50%"  # each its half of the device
    monkeypatch.setenv("CUPY_GPU_MEMORY_LIMIT", "20%")  # the user's own cap: inherited, not replaced
    assert "CUPY_GPU_MEMORY_LIMIT" not in cluster_arguments(gpus=2, workers_per_gpu=2).worker_environ
    monkeypatch.delenv("CUPY_GPU_MEMORY_LIMIT")
    one = cluster_arguments(gpus=2)
    assert one.kwargs["n_workers"] == 2 and one.name == ("LocalCUDACluster" if dask_cuda else "LocalCluster")
    assert "CUPY_GPU_MEMORY_LIMIT" not in one.worker_environ


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(gpus=1, workers_per_gpu=0), "at least 1"),
        (dict(workers=2, workers_per_gpu=2), "belongs to --gpus"),
        (dict(gpus=1, workers_per_gpu=2, cluster="slurm"), "belongs to --gpus"),
        (dict(workers_per_gpu=0), "at least 1"),
        (dict(workers=2, gpus=1), "not both"),
        (dict(workers=0), "at least 1"),
        (dict(cluster_config="jobqueue.yaml"), "belongs to --cluster"),
    ],
)
def test_cluster_options_that_contradict_each_other_are_refused(options, message):
    """One set of checks for the CLI and Python callers alike (the command adds only --scheduler's)."""
    with pytest.raises(InputError, match=message):
        cluster_arguments(**options)


def test_the_cli_refuses_workers_per_gpu_with_a_scheduler(tmp_path, capsys):
    code = main(["batch", str(tmp_path), "-o", str(tmp_path / "d"), "--pipeline", "fit-dti",
                 "--scheduler", "tcp://127.0.0.1:1", "--workers-per-gpu", "2"])  # fmt: skip
    assert code == 2 and "--workers-per-gpu belongs to --gpus" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--gpus", "2"], ["--workers", "3"], ["--workers", "0"]])
def test_the_cli_refuses_a_cluster_of_its_own_with_a_scheduler(tmp_path, capsys, extra):
    code = main(["batch", str(tmp_path), "-o", str(tmp_path / "d"), "--pipeline", "fit-dti",
                 "--scheduler", "tcp://127.0.0.1:1", *extra])  # fmt: skip
    assert code == 2 and "with --scheduler the scheduler's workers run the steps" in capsys.readouterr().err


def test_two_workers_per_gpu_share_each_device(monkeypatch):
    """A real LocalCluster of four processes over two devices: each device is seen by two workers."""
    import os

    from tractlens.app.batch.engines import connect

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,7")
    _with_dask_cuda(monkeypatch, False)
    client, cluster = connect(None, cluster_arguments(gpus=2, workers_per_gpu=2))
    try:
        seen = client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"])
    finally:
        client.close()
        cluster.close()
    assert sorted(seen.values()) == ["4", "4", "7", "7"]


def test_gpus_take_the_devices_this_process_may_use(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    _with_dask_cuda(monkeypatch, True)
    assert cluster_arguments(gpus=2).kwargs["CUDA_VISIBLE_DEVICES"] == "3,5"
    with pytest.raises(InputError, match="shows 3"):
        cluster_arguments(gpus=4)


def test_cohort_progress_writes_a_line_per_finished_step_with_the_running_ones():
    import io

    from tractlens.app.batch.runner import CohortProgress

    stream = io.StringIO()
    progress = CohortProgress(subjects=3, steps=2, stream=stream)
    progress.step_progress("track-deterministic/sub-02", "track", 45, 100)
    progress.finished("fit-dti/sub-01", "done")
    progress.finished("fit-dti/sub-03", "failed")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2  # not a terminal: one line per finished subject-step, nothing per progress report
    assert lines[0].startswith("cohort: 1/6 (3 subjects × 2 steps) 1 done")
    assert "track-deterministic/sub-02 track 45%" in lines[0]
    assert "2/6" in lines[1] and "1 done, 1 failed" in lines[1]


def test_bad_config_value_ends_with_exit_status_2_before_any_cluster(cohort, tmp_path, capsys):
    bids, _, _ = cohort
    config = tmp_path / "params.toml"
    config.write_text("[track-deterministic]\nmax-angle = -5\n")
    code = main(["batch", str(bids), "-o", str(tmp_path / "d"), "--pipeline", "fit-dti,track-deterministic",
                 "--config", str(config), "--workers", "1"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "params.toml" in err and "[track-deterministic]" in err
    assert not (tmp_path / "d").exists()  # nothing written


def test_gradients_at_the_dataset_level_serve_every_subject(demo_dir, tmp_path):
    """BIDS inheritance: one dwi.bval/dwi.bvec at the top level, found through pybids."""
    bids = make_bids(tmp_path / "bids", demo_dir, subjects=("01", "02"))
    for subject in ("01", "02"):
        for ext in ("bval", "bvec"):
            (bids / f"sub-{subject}" / "dwi" / f"sub-{subject}_dwi.{ext}").unlink()
    shutil.copy(demo_dir / "dwi.bval", bids / "dwi.bval")
    shutil.copy(demo_dir / "dwi.bvec", bids / "dwi.bvec")
    series = find_series(bids)
    assert [s.subject for s in series] == ["01", "02"]
    assert all(s.bval == bids / "dwi.bval" and s.bvec == bids / "dwi.bvec" for s in series)


class _CountingClient:
    """The module's client, counting at each submission the jobs submitted and not yet finished.
    (Counted from the futures' states, which the scheduler loop sets before the plan can learn
    that a job is done; a done-callback runs later, on another thread, so a count it lowers
    could still hold a job the plan had already seen finish.)"""

    def __init__(self, client):
        self.client, self.futures, self.most = client, [], 0
        self.lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.client, name)

    def submit(self, *args, **kwargs):
        with self.lock:
            in_flight = sum(not future.done() for future in self.futures) + 1
            self.most = max(self.most, in_flight)
        future = self.client.submit(*args, **kwargs)
        with self.lock:
            self.futures.append(future)
        return future


def _fake_step(job, *upstream):
    if job.step == "b" and job.subject == "s1":
        return {"step": job.step, "subject": job.subject, "status": "failed", "reason": "bad input", "seconds": 0.0}
    assert all(u["status"] == "done" for u in upstream)
    return {"step": job.step, "subject": job.subject, "status": "done", "seconds": 0.01, "after": len(upstream)}


class _InlineClient:
    """A client without Dask for run_plan: ``threads`` worker threads, a job run when submitted and
    reported finished by ``wait`` in submission order, one at a time."""

    def __init__(self, threads: int):
        self.threads, self.in_flight, self.most, self.submitted = threads, [], 0, []

    def nthreads(self):
        return {f"w{k}": 1 for k in range(self.threads)}

    def subscribe_topic(self, *args, **kwargs):
        pass

    unsubscribe_topic = cancel = subscribe_topic

    def submit(self, fn, job, *upstream, **kwargs):
        future = _InlineFuture(fn(job, *upstream))
        self.in_flight.append(future)
        self.submitted.append(job.key)
        self.most = max(self.most, len(self.in_flight))
        return future

    def wait(self, futures, timeout=None, return_when=None):
        first = self.in_flight.pop(0)
        return {first}, set(futures) - {first}


class _InlineFuture:
    status = "finished"

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class _CountedWaits(list):
    """A plan's ``waits_for`` that counts how often a job's upstream list is looked up."""

    lookups = 0

    def __getitem__(self, index):
        type(self).lookups += 1
        return super().__getitem__(index)


def test_a_large_cohort_looks_up_each_job_s_upstream_a_few_times_not_once_per_turn(monkeypatch):
    """3,000 subjects x 3 steps on two threads: every job once, in the plan's order, its subject's
    failure blocking only that subject; each job's upstream looked up at most twice (a scan of the
    waiting jobs on every turn looked them up about n^2 / 4 times: 20 M here)."""
    from types import SimpleNamespace

    import distributed

    from tractlens.app.batch.plan import Plan

    subjects, steps = [f"s{k}" for k in range(3000)], ["a", "b", "c"]
    jobs = [SimpleNamespace(step=step, subject=s, key=f"{step}/{s}") for s in subjects for step in steps]
    waits = _CountedWaits([] if k % 3 == 0 else [k - 1] for k in range(len(jobs)))
    fake = _InlineClient(threads=2)
    monkeypatch.setattr(distributed, "wait", fake.wait)
    _CountedWaits.lookups = 0
    results = run_plan(Plan(jobs, waits, steps, subjects), fake, task=_fake_step)
    assert [(r["step"], r["subject"]) for r in results] == [(j.step, j.subject) for j in jobs]
    assert sorted(fake.submitted) == sorted(j.key for j in jobs if not (j.subject == "s1" and j.step == "c"))
    firsts = [key.split("/")[1] for key in fake.submitted if key.startswith("a/")]
    assert firsts == subjects  # subjects start in the plan's order, each one's steps in order after
    at = {key: n for n, key in enumerate(fake.submitted)}
    assert all(at[f"a/{s}"] < at[f"b/{s}"] for s in subjects)
    by = {(r["step"], r["subject"]): r["status"] for r in results}
    assert by["b", "s1"] == "failed" and by["c", "s1"] == "not-run"
    assert sum(status == "done" for status in by.values()) == len(jobs) - 2
    assert fake.most <= 2
    assert _CountedWaits.lookups <= 2 * len(jobs)


def test_jobs_go_to_free_workers_in_the_plan_s_order_and_a_failure_blocks_only_its_subject(client):
    """At most as many jobs in flight as the workers have threads (each job to a free worker), every
    job once, its upstream results as arguments; a failed step's later steps are "not run"."""
    from types import SimpleNamespace

    from tractlens.app.batch.plan import Plan

    subjects, steps = [f"s{k}" for k in range(6)], ["a", "b", "c"]
    jobs = [SimpleNamespace(step=step, subject=s, key=f"{step}/{s}") for s in subjects for step in steps]
    waits = [[] if k % 3 == 0 else [k - 1] for k in range(len(jobs))]
    counting = _CountingClient(client)
    results = run_plan(Plan(jobs, waits, steps, subjects), counting, task=_fake_step)
    assert [(r["step"], r["subject"]) for r in results] == [(j.step, j.subject) for j in jobs]
    by = {(r["step"], r["subject"]): r for r in results}
    assert by["b", "s1"]["status"] == "failed" and by["c", "s1"]["status"] == "not-run"
    assert all(r["status"] == "done" for key, r in by.items() if key[1] != "s1")
    assert by["c", "s4"]["after"] == 1 and by["a", "s4"]["after"] == 0
    assert 1 <= counting.most <= sum(client.nthreads().values()) == 2
