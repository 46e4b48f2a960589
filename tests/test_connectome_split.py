"""The connectome modes shared out over several devices (gpu.connectome_split): simulated GPUs
(NumPy backends, the code path of real ones) give one device's counts to the last one, also
when a device fails or the sparse totals are merged on the host; on real GPUs (gpu marker)
two shares of one GPU, and every GPU, give the NumPy counts."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.test_connectome_modes import PARAMS, SHAPE, numbered, phantom
from tractlens.gpu.backend import get_backend, gpu_backends
from tractlens.gpu.connectome import ConnectomeSpec, track_connectome
from tractlens.gpu.connectome_split import track_connectome_split
from tractlens.gpu.multidevice import DeviceFailure, simulated_backends
from tractlens.gpu.probabilistic_params import mask_bits


def _case(network: bool = False):
    field_, brain, bundle, seeds = phantom()
    bits = mask_bits(brain)
    mask3 = bundle & np.isin(np.arange(SHAPE[0]), [2, 3, 14, 25, 26])[:, None, None]
    columns = np.full(SHAPE, -1, dtype=np.int64)
    columns[1:-1] = (np.arange(1, SHAPE[0] - 1) // 3)[:, None, None]
    spec = ConnectomeSpec(matrix2_columns=columns, n_matrix2_columns=int(columns.max()) + 1,
                          matrix3_nodes=numbered(mask3), n_matrix3_nodes=int(mask3.sum()))  # fmt: skip
    if network:
        masks = np.stack([bundle & np.isin(np.arange(SHAPE[0]), [x])[:, None, None] for x in (5, 15, 25)])
        per_mask = [np.argwhere(m)[::3] for m in masks]
        seeds = np.concatenate(per_mask)
        spec = ConnectomeSpec(
            network_masks=masks, seed_mask_of_seed=np.repeat(np.arange(3), [len(s) for s in per_mask])
        )
    return field_, bits, seeds, spec


def _assert_same(a, b, names=("matrix2", "matrix3", "network")):
    assert np.array_equal(a.paths, b.paths) and np.array_equal(a.waytotal, b.waytotal)
    assert a.streamlines == b.streamlines
    for name in names:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None)
        if x is not None:
            assert x.shape == y.shape and x.nnz > 0
            assert np.array_equal(x.rows, y.rows) and np.array_equal(x.cols, y.cols)
            assert np.array_equal(x.counts, y.counts)
            if x.lengths_mm is not None:
                np.testing.assert_allclose(x.lengths_mm, y.lengths_mm, rtol=1e-12)


@pytest.mark.parametrize("lengths", [False, True])
def test_three_simulated_gpus_count_what_one_device_counts(lengths):
    field_, bits, seeds, spec = _case()
    kw = dict(distthresh=0.0, distthresh3=0.0, lengths=lengths)
    one = track_connectome(field_, bits, seeds, PARAMS, spec, device="cpu", **kw)
    seen = []
    split = track_connectome_split(field_, bits, seeds, PARAMS, spec, simulated_backends(3), chunk=17,
                                   progress=lambda d, t: seen.append((d, t)), **kw)  # fmt: skip
    _assert_same(split, one)
    if lengths:
        np.testing.assert_allclose(split.paths_lengths_mm, one.paths_lengths_mm, rtol=1e-12)
    devices = split.provenance["devices"]
    assert sum(d["items"] for d in devices) == len(seeds) * PARAMS.n_samples and len(devices) == 3
    assert split.provenance["merged_on"] == ["device", "device"]
    assert seen[-1] == (len(seeds) * PARAMS.n_samples,) * 2


def test_network_mode_split_counts_the_same():
    field_, bits, seeds, spec = _case(network=True)
    kw = dict(distthresh=0.0, distthresh3=0.0, lengths=False)
    one = track_connectome(field_, bits, seeds, PARAMS, spec, device="cpu", **kw)
    _assert_same(track_connectome_split(field_, bits, seeds, PARAMS, spec, simulated_backends(2), **kw), one)


def test_spilled_totals_are_merged_on_the_host_with_the_same_counts(monkeypatch):
    from tractlens.gpu import connectome as connectome_module

    field_, bits, seeds, spec = _case()
    kw = dict(distthresh=0.0, distthresh3=0.0, lengths=False)
    one = track_connectome(field_, bits, seeds, PARAMS, spec, device="cpu", **kw)
    monkeypatch.setattr(connectome_module, "plan_capacity", lambda backend, n=1: 16)
    monkeypatch.setattr(connectome_module, "plan_device_entries", lambda backend, n=1: 40)
    split = track_connectome_split(field_, bits, seeds, PARAMS, spec, simulated_backends(3), chunk=11, **kw)
    assert split.provenance["spills"] > 0 and split.provenance["merged_on"] == ["host", "host"]
    _assert_same(split, one)


def test_a_failing_simulated_gpu_is_named_and_the_others_count_its_share(monkeypatch):
    from tractlens.gpu.connectome import ConnectomeCounter

    field_, bits, seeds, spec = _case()
    kw = dict(distthresh=0.0, distthresh3=0.0, lengths=False)
    one = track_connectome(field_, bits, seeds, PARAMS, spec, device="cpu", **kw)
    count = ConnectomeCounter.count
    reached = threading.Event()  # GPU 1 took a chunk: the others wait for it (or a loaded machine's
    # scheduling lets them empty the queue before GPU 1 asks, and nothing fails)

    def failing(self, start, n, *a, **k):
        if self.backend.device_id == 1:
            reached.set()
            raise MemoryError("injected")
        reached.wait(30)
        return count(self, start, n, *a, **k)

    monkeypatch.setattr(ConnectomeCounter, "count", failing)
    split = track_connectome_split(field_, bits, seeds, PARAMS, spec, simulated_backends(3), largest=50, **kw)
    _assert_same(split, one)
    assert any(
        n.startswith("GPU 1 (simulated on the CPU): out of memory while tracking") for n in split.provenance["notes"]
    )
    reached.clear()
    with pytest.raises(DeviceFailure, match=r"GPU 1 \(simulated on the CPU\): out of memory"):
        track_connectome_split(field_, bits, seeds, PARAMS, spec, simulated_backends(3), largest=50, keep_going=False,
                               **kw)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("shares", ["two on one GPU", "every GPU"])
def test_the_gpu_split_counts_what_numpy_counts(shares):
    """Bit for bit (integer counts summed in float64) against the NumPy reference."""
    field_, bits, seeds, spec = _case()
    kw = dict(distthresh=0.0, distthresh3=0.0, lengths=False)
    cpu = track_connectome(field_, bits, seeds, PARAMS, spec, device="cpu", **kw)
    gpu = get_backend("gpu")
    backends = [gpu, gpu] if shares == "two on one GPU" else gpu_backends()
    split = track_connectome_split(field_, bits, seeds, PARAMS, spec, backends, chunk=100, largest=300, **kw)
    _assert_same(split, cpu)
    assert not split.provenance["notes"]


def test_the_command_with_gpus_writes_the_files_of_one_device(demo_bedpostx, demo_dir, tmp_path, monkeypatch):
    """``track probabilistic --omatrix3 --gpus 3`` (simulated GPUs): the same matrix and path
    files, byte for byte, as the run on one device."""
    from tests.test_connectome_modes import _masks
    from tractlens.app.cli import main
    from tractlens.app.pipelines import connectome_modes

    seed, _, target3, _ = _masks(demo_dir, tmp_path)
    base = ["track", "probabilistic", "--samples", str(demo_bedpostx), "--seed", str(seed), "--nsamples", "4",
            "--omatrix3", "--target3", str(target3), "--quiet"]  # fmt: skip
    assert main([*base, "--device", "cpu", "-o", str(tmp_path / "one")]) == 0
    monkeypatch.setattr(connectome_modes, "gpu_backends", lambda n: simulated_backends(n))
    assert main([*base, "--gpus", "3", "-o", str(tmp_path / "three")]) == 0
    one = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert one == sorted(p.name for p in (tmp_path / "three").iterdir()) and "fdt_matrix3.dot" in one
    for name in ("fdt_matrix3.dot", "fdt_paths.nii.gz", "waytotal", "coords_for_fdt_matrix3"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "three" / name).read_bytes(), name


def test_more_gpus_than_there_are_is_refused_before_anything_is_written(demo_bedpostx, demo_dir, tmp_path):
    from tests.test_cli import _expect_input_error
    from tests.test_connectome_modes import _masks

    seed, _, target3, _ = _masks(demo_dir, tmp_path)
    _expect_input_error("track", "probabilistic", "--samples", str(demo_bedpostx), "--seed", str(seed), "--omatrix3",
                        "--target3", str(target3), "--gpus", "64", "-o", str(tmp_path / "o"), match="64 GPU")  # fmt: skip
    assert not (tmp_path / "o").exists()
