"""Fuzzing the file loaders: mutated NIfTI, bval/bvec, .trk/.tck/.trx, tensor, bedpostX and
session files either load into something sane or raise :class:`app.errors.InputError` (one
paragraph, naming the file) -- never another exception, a hang or a huge allocation.

Small valid seed files are made here and mutated by hypothesis (deterministic: derandomized,
no example database): bit flips, byte runs set to interesting values (0, 0xFF, int32 extremes,
float NaN/Inf), truncation, insertion and deletion of chunks, and structured mutations of the
header fields (NIfTI dim/pixdim/datatype/vox_offset/qform/sform/scl_*, trk n_count, dimensions,
voxel_to_rasmm, scalar counts, trx header.json and member names, session manifest).
Anything that is not InputError counts as a failure and is listed; a failure is a bug in the
loader, not something to catch here. Counts per loader go to tests/_artifacts/fuzz_counts.json.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import signal
import struct
import sys
import time
import traceback
import zipfile
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from nibabel.nifti1 import header_dtype as NIFTI1_FIELDS
from nibabel.nifti2 import header_dtype as NIFTI2_FIELDS
from nibabel.streamlines.trk import header_2_dtype as TRK_FIELDS

from tests.conftest import ARTIFACTS
from tractlens.app.errors import InputError

EXAMPLES = 1000  # per loader (bedpostX: BEDPOSTX_EXAMPLES)
BEDPOSTX_EXAMPLES = 400
TIME_LIMIT_S = 10  # per example: longer is a hang
MEMORY_HEADROOM = 2 * 2**30  # an attempt to allocate more than this (address space) is a failure
COUNTS: dict[str, dict[str, int | float]] = {}
FAILURES: dict[str, list[str]] = {}

# ---------------------------------------------------------------------------------------------
# mutations

F32 = [0.0, -0.0, -1.0, 1.0, 0.5, 1e-30, 1e30, 3.4e38, -3.4e38, math.nan, math.inf, -math.inf]
INTS = [0, -1, 1, 2, 3, 4, 5, 6, 7, 8, 16, 255, 256, 1000, 32767, -32768, 65535, 2**31 - 1, -(2**31), 2**32 - 1]
RUNS = [
    b"\x00",
    b"\xff",
    b"\x7f",
    b"\x80",
    struct.pack("<i", 2**31 - 1),
    struct.pack("<i", -(2**31)),
    struct.pack("<i", -1),
    struct.pack("<h", 32767),
    struct.pack("<h", -32768),
    struct.pack("<f", math.nan),
    struct.pack("<f", math.inf),
    struct.pack("<f", -math.inf),
    struct.pack("<f", 1e38),
    struct.pack("<d", math.nan),
    struct.pack("<q", 2**63 - 1),
    struct.pack("<Q", 2**64 - 1),
]


@st.composite
def byte_mutations(draw, seed: bytes, hot: int = 0) -> bytes:
    """1-4 random edits of ``seed``; positions favour its first ``hot`` bytes (the header)."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        n = len(data)
        if n == 0:
            data += draw(st.binary(max_size=32))
            continue
        hot_n = min(hot, n) if hot else n
        pos = draw(st.one_of(st.integers(0, hot_n - 1), st.integers(0, n - 1)))
        kind = draw(st.sampled_from(["flip", "flip", "run", "run", "truncate", "insert", "delete", "junk"]))
        if kind == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "run":
            value = draw(st.sampled_from(RUNS))
            run = value * draw(st.integers(1, 4))
            data[pos : pos + len(run)] = run
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=64))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 64))]
        else:
            junk = draw(st.binary(min_size=1, max_size=16))
            data[pos : pos + len(junk)] = junk
    return bytes(data)


def _field_values(dtype: np.dtype, draw) -> object:
    if dtype.kind == "f":
        return draw(st.one_of(st.sampled_from(F32), st.floats(allow_nan=True, allow_infinity=True, width=32)))
    if dtype.kind in "iu":
        return draw(st.one_of(st.sampled_from(INTS), st.integers(-(2**63), 2**63 - 1)))
    return draw(st.binary(min_size=0, max_size=dtype.itemsize))


@st.composite
def field_mutations(draw, seed: bytes, fields: np.dtype, names: list[str], base: int = 0) -> bytes:
    """Set 1-3 header fields (an element of an array field) to interesting values, raw."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(names))
        dtype, offset = fields.fields[name][:2]
        element = dtype.base if dtype.subdtype else dtype
        count = int(np.prod(dtype.shape)) if dtype.subdtype else 1
        index = draw(st.integers(0, count - 1))
        value = _field_values(element, draw)
        if element.kind == "f":
            with np.errstate(all="ignore"):  # 1e308 into float32 is inf: that is the point
                blob = np.array(value, dtype=f"<f{element.itemsize}").tobytes()
        elif element.kind in "iu":
            blob = (int(value) % 2 ** (8 * element.itemsize)).to_bytes(element.itemsize, "little")
        else:
            blob = bytes(value).ljust(element.itemsize, b"\x00")[: element.itemsize]
        start = base + offset + index * element.itemsize
        data[start : start + element.itemsize] = blob
    return bytes(data)


NIFTI_NAMES = [
    "sizeof_hdr", "dim", "dim", "dim", "datatype", "bitpix", "pixdim", "pixdim", "vox_offset", "scl_slope",
    "scl_inter", "qform_code", "sform_code", "quatern_b", "quatern_c", "quatern_d", "qoffset_x", "srow_x",
    "srow_y", "srow_z", "intent_code", "magic", "dim_info", "xyzt_units",
]  # fmt: skip
TRK_NAMES = [
    "magic_number", "dimensions", "dimensions", "voxel_sizes", "nb_scalars_per_point", "nb_properties_per_streamline",
    "voxel_to_rasmm", "voxel_to_rasmm", "voxel_order", "nb_streamlines", "nb_streamlines", "version", "hdr_size",
    "origin", "scalar_name",
]  # fmt: skip


def nifti_bytes(seed: bytes, nifti2: bool = False):
    """Mutated NIfTI bytes and the container: .nii, .nii.gz of the mutated bytes, or a raw-mutated .nii.gz."""
    fields = NIFTI2_FIELDS if nifti2 else NIFTI1_FIELDS
    hot = 540 if nifti2 else 348
    mutated = st.one_of(
        byte_mutations(seed, hot),
        field_mutations(seed, fields, [n for n in NIFTI_NAMES if n in fields.names]),
        field_mutations(seed, fields, [n for n in NIFTI_NAMES if n in fields.names]).flatmap(
            lambda b: byte_mutations(b, hot)
        ),
    )
    plain = st.tuples(mutated, st.sampled_from([".nii", ".nii.gz"]))
    raw_gz = byte_mutations(gzip.compress(seed, mtime=0), 64).map(lambda b: (b, "raw.nii.gz"))
    return st.one_of(plain, plain, plain, raw_gz)


def write_nifti(folder: Path, stem: str, example) -> Path:
    data, container = example
    if container == "raw.nii.gz":
        path = folder / f"{stem}.nii.gz"
        path.write_bytes(data)
    else:
        path = folder / f"{stem}{container}"
        path.write_bytes(gzip.compress(data, compresslevel=1, mtime=0) if container == ".nii.gz" else data)
    for other in (".nii", ".nii.gz"):  # one file per stem, so discovery is unambiguous
        if not path.name.endswith(other) or (other == ".nii" and path.name.endswith(".nii.gz")):
            (folder / f"{stem}{other}").unlink(missing_ok=True)
    return path


NUMBER_TOKENS = ["nan", "inf", "-inf", "-1", "0", "1e308", "1e-300", "-0", "abc", "", "1,2", "0x10", "1e999", "1_0"]


@st.composite
def table_mutations(draw, text: str) -> bytes:
    """Mutations of a bval/bvec text table: tokens, rows, layout, or raw bytes."""
    kind = draw(st.sampled_from(["token", "token", "row", "layout", "bytes"]))
    rows = [line.split() for line in text.strip().splitlines()]
    if kind == "token":
        for _ in range(draw(st.integers(1, 3))):
            r = draw(st.integers(0, len(rows) - 1))
            if rows[r]:
                c = draw(st.integers(0, len(rows[r]) - 1))
                rows[r][c] = draw(st.one_of(st.sampled_from(NUMBER_TOKENS), st.text(max_size=6)))
    elif kind == "row":
        r = draw(st.integers(0, len(rows) - 1))
        action = draw(st.sampled_from(["drop", "dup", "drop_col", "add_col", "empty_row"]))
        if action == "drop":
            del rows[r]
        elif action == "dup":
            rows.insert(r, list(rows[r]))
        elif action == "drop_col":
            rows = [row[:-1] for row in rows]
        elif action == "add_col":
            rows = [[*row, "1"] for row in rows]
        else:
            rows[r] = []
    elif kind == "layout":
        action = draw(st.sampled_from(["transpose", "empty", "blank", "comment", "crlf", "tabs", "bom"]))
        if action == "transpose" and len({len(r) for r in rows}) == 1:
            rows = [list(c) for c in zip(*rows)]
        elif action == "empty":
            return b""
        elif action == "blank":
            return b"  \n\n\t\n"
        elif action == "comment":
            return ("# " + "\n# ".join(" ".join(r) for r in rows) + "\n").encode()
        elif action == "crlf":
            return "\r\n".join(" ".join(r) for r in rows).encode()
        elif action == "tabs":
            return "\n".join("\t".join(r) for r in rows).encode()
        elif action == "bom":
            return ("\ufeff" + "\n".join(" ".join(r) for r in rows)).encode()
    else:
        return draw(byte_mutations(text.encode(), 0))
    return ("\n".join(" ".join(r) for r in rows) + "\n").encode("utf-8", "surrogatepass")


# ---------------------------------------------------------------------------------------------
# the harness


@contextlib.contextmanager
def _guards():
    """A hang raises after TIME_LIMIT_S; an allocation beyond the headroom raises MemoryError."""

    resource = pytest.importorskip("resource", reason="the guards need POSIX (resource limits, SIGALRM)")

    def on_alarm(signum, frame):
        raise TimeoutError(f"no result after {TIME_LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limited = False
    try:
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[0]) * resource.getpagesize()
        cap = used + MEMORY_HEADROOM
        if soft == resource.RLIM_INFINITY or cap < soft:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
            limited = True
    except (OSError, ValueError):  # no /proc (macOS): the time guard alone
        pass
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        if limited:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _describe(example) -> str:
    text = repr(example)
    return text if len(text) < 300 else text[:300] + "..."


def fuzz(name: str, strategy, target, examples: int = EXAMPLES) -> None:
    """Run ``target(example)`` on ``examples`` inputs; count outcomes; fail on anything but InputError."""
    stats = COUNTS[name] = {"tried": 0, "ok": 0, "input_error": 0, "failures": 0, "seconds": 0.0}
    failures = FAILURES[name] = []

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(example):
        stats["tried"] += 1
        signal.alarm(TIME_LIMIT_S)
        try:
            target(example)
            stats["ok"] += 1
        except InputError as exc:
            message = str(exc)
            problem = []
            if "\n" in message or "Traceback" in message:
                problem.append("not one paragraph")
            if not exc.path or not exc.fix:
                problem.append("names no file or no fix")
            if problem:
                stats["failures"] += 1
                failures.append(f"InputError {', '.join(problem)}: {message!r} <- {_describe(example)}")
            else:
                stats["input_error"] += 1
        except Exception as exc:  # every other type is the finding
            stats["failures"] += 1
            tb = traceback.extract_tb(exc.__traceback__)
            where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb) if "/app/" in f.filename), "?")
            failures.append(f"{type(exc).__name__} at {where}: {str(exc)[:200]} <- {_describe(example)}")
        finally:
            signal.alarm(0)

    start = time.perf_counter()
    # numpy warnings (divide, overflow, invalid; underflow is silent by default) become errors
    with _guards(), np.errstate(divide="raise", over="raise", invalid="raise", under="ignore"):
        run()
    stats["seconds"] = round(time.perf_counter() - start, 2)
    _write_counts()
    assert not failures, f"{len(failures)} of {stats['tried']} inputs failed:\n" + "\n".join(failures[:15])
    assert stats["tried"] >= examples, stats


def _write_counts() -> None:
    path = ARTIFACTS / "fuzz_counts.json"
    try:
        counts = json.loads(path.read_text())
    except (OSError, ValueError):
        counts = {}
    counts.update(COUNTS)
    path.write_text(json.dumps(counts, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------
# seeds

SHAPE = (8, 8, 6)
AFFINE = np.array([[-2.0, 0, 0, 8], [0, 2.0, 0, -8], [0, 0, 2.5, -7], [0, 0, 0, 1]])


def _nifti_blob(array, *, nifti2=False, intent=None) -> bytes:
    cls = nib.Nifti2Image if nifti2 else nib.Nifti1Image
    img = cls(array, AFFINE)
    img.set_qform(AFFINE, code=1)
    img.set_sform(AFFINE, code=1)
    if intent:
        img.header.set_intent(intent)
    return img.to_bytes()


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    from tractlens.app.io import save_tractogram
    from tractlens.app.model import Tractogram

    rng = np.random.default_rng(7)
    brain = np.zeros(SHAPE, bool)
    brain[1:7, 1:7, 1:5] = True
    bvals = np.array([0, 1000, 1000, 1000, 1000, 1000, 1000])
    dirs = rng.normal(size=(6, 3))
    bvecs = np.vstack([[0, 0, 0], dirs / np.linalg.norm(dirs, axis=1, keepdims=True)])
    dwi = (rng.integers(100, 1000, (*SHAPE, 7)) * brain[..., None]).astype(np.int16)
    tensor = np.zeros((*SHAPE, 6), np.float32)
    tensor[..., [0, 3, 5]] = [1.7e-3, 0.3e-3, 0.3e-3]
    folder = tmp_path_factory.mktemp("fuzz-seeds")
    tract = Tractogram.from_list(
        [rng.uniform(0, 5, (n, 3)) for n in (2, 5, 9, 4)], affine=AFFINE, dimensions=SHAPE, name="t"
    )
    tract.point_scalars["fa"] = rng.random(len(tract.points)).astype(np.float32)
    tract.streamline_scalars["weight"] = rng.random(len(tract)).astype(np.float32)
    blobs = {}
    for suffix in (".trk", ".tck", ".trx"):
        save_tractogram(tract, folder / f"seed{suffix}")
        blobs[suffix] = (folder / f"seed{suffix}").read_bytes()
    return {
        "dwi": _nifti_blob(dwi),
        "dwi2": _nifti_blob(dwi.astype(np.float32), nifti2=True),
        "bval": " ".join(f"{b:g}" for b in bvals) + "\n",
        "bvec": "\n".join(" ".join(f"{v:.6f}" for v in row) for row in bvecs.T) + "\n",
        "volume": _nifti_blob(rng.random(SHAPE).astype(np.float32)),
        "mask": _nifti_blob(brain.astype(np.uint8)),
        "labels": _nifti_blob((brain * rng.integers(1, 6, SHAPE)).astype(np.int16)),
        "tensor": _nifti_blob(tensor),
        "symmatrix": _nifti_blob(tensor[..., None, [0, 1, 3, 2, 4, 5]], intent="symmetric matrix"),
        "tract": tract,
        **blobs,
    }


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if COUNTS:
        width = max(map(len, COUNTS))
        lines = [f"{'loader':{width}}  tried     ok  InputError  failures  seconds"]
        for name, c in COUNTS.items():
            lines.append(
                f"{name:{width}}  {c['tried']:5d}  {c['ok']:5d}  {c['input_error']:10d}  {c['failures']:8d}  {c['seconds']:7.1f}"
            )
        sys.stderr.write("\n" + "\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------
# sanity of what loaded


def _sane_affine(affine) -> None:
    affine = np.asarray(affine)
    assert affine.shape == (4, 4) and np.isfinite(affine).all()
    assert abs(np.linalg.det(affine[:3, :3])) > 0


def _sane_volume(volume, ndim=(3, 4)) -> None:
    assert volume.data.ndim in ndim and min(volume.data.shape) >= 1
    _sane_affine(volume.affine)


# ---------------------------------------------------------------------------------------------
# NIfTI volumes, masks, labels


def test_fuzz_load_volume(seeds, tmp_path):
    from tractlens.app.io import load_volume

    def target(example):
        volume = load_volume(write_nifti(tmp_path, "volume", example))
        _sane_volume(volume)
        assert volume.data.dtype == np.float32

    fuzz("load_volume", nifti_bytes(seeds["volume"]), target)


def test_fuzz_load_mask(seeds, tmp_path):
    from tractlens.app.io import load_mask

    def target(example):
        mask = load_mask(write_nifti(tmp_path, "mask", example))
        assert mask.dtype == bool and mask.ndim == 3 and mask.any()

    fuzz("load_mask", nifti_bytes(seeds["mask"]), target)


def test_fuzz_load_labels(seeds, tmp_path):
    """Half the examples are checked against the seed's grid (the reference Volume)."""
    from tractlens.app.io import load_labels
    from tractlens.app.model import Volume

    reference = Volume("ref", np.zeros(SHAPE, np.float32), AFFINE)

    def target(example):
        (blob, container), on_grid = example
        labels = load_labels(write_nifti(tmp_path, "labels", (blob, container)), reference if on_grid else None)
        assert labels.dtype == np.int32 and labels.ndim == 3 and labels.min() >= 0
        if on_grid:
            assert labels.shape == SHAPE

    fuzz("load_labels", st.tuples(nifti_bytes(seeds["labels"]), st.booleans()), target)


# ---------------------------------------------------------------------------------------------
# DWI: the NIfTI, the bval and the bvec mutated separately


def _dwi_target(folder: Path):
    from tractlens.app.io import load_dwi

    def target(example):
        part, blob = example
        files = {"dwi": None, "bval": None, "bvec": None}
        files[part] = blob
        dwi_path = write_nifti(folder, "dwi", files["dwi"]) if part == "dwi" else folder / "dwi.nii"
        if part != "dwi":
            (folder / "dwi.bval").write_bytes(files["bval"] if part == "bval" else SEEDS_TEXT["bval"])
            (folder / "dwi.bvec").write_bytes(files["bvec"] if part == "bvec" else SEEDS_TEXT["bvec"])
        dwi = load_dwi(dwi_path)
        assert dwi.data.ndim == 4 and dwi.data.shape[3] == len(dwi.bvals) == len(dwi.bvecs)
        assert dwi.b0_mask.any() and np.isfinite(dwi.bvals).all() and np.isfinite(dwi.bvecs).all()
        norms = np.linalg.norm(dwi.bvecs[~dwi.b0_mask], axis=1)
        assert np.allclose(norms, 1, atol=1e-6)
        _sane_affine(dwi.affine)

    return target


SEEDS_TEXT: dict[str, bytes] = {}


def _dwi_folder(seeds, folder: Path, nifti_key="dwi") -> None:
    SEEDS_TEXT["bval"] = seeds["bval"].encode()
    SEEDS_TEXT["bvec"] = seeds["bvec"].encode()
    (folder / "dwi.nii").write_bytes(seeds[nifti_key])
    (folder / "dwi.bval").write_bytes(SEEDS_TEXT["bval"])
    (folder / "dwi.bvec").write_bytes(SEEDS_TEXT["bvec"])


def test_fuzz_load_dwi_nifti(seeds, tmp_path):
    _dwi_folder(seeds, tmp_path)
    strategy = st.one_of(nifti_bytes(seeds["dwi"]), nifti_bytes(seeds["dwi2"], nifti2=True)).map(lambda b: ("dwi", b))
    fuzz("load_dwi (NIfTI mutated)", strategy, _dwi_target(tmp_path))


def test_fuzz_load_dwi_bval(seeds, tmp_path):
    _dwi_folder(seeds, tmp_path)
    fuzz("load_dwi (bval mutated)", table_mutations(seeds["bval"]).map(lambda b: ("bval", b)), _dwi_target(tmp_path))


def test_fuzz_load_dwi_bvec(seeds, tmp_path):
    _dwi_folder(seeds, tmp_path)
    fuzz("load_dwi (bvec mutated)", table_mutations(seeds["bvec"]).map(lambda b: ("bvec", b)), _dwi_target(tmp_path))


def test_fuzz_read_bvals_bvecs(seeds, tmp_path):
    """The table readers alone, on either file's mutations (bvecs for 7 volumes)."""
    from tractlens.app.io.dwi import read_bvals, read_bvecs

    def target(example):
        which, blob = example
        path = tmp_path / f"table.{which}"
        path.write_bytes(blob)
        if which == "bval":
            values = read_bvals(path)
            assert values.ndim == 1 and np.isfinite(values).all() and (values >= 0).all()
        else:
            values = read_bvecs(path, 7)
            assert values.shape == (7, 3)

    strategy = st.one_of(
        table_mutations(seeds["bval"]).map(lambda b: ("bval", b)),
        table_mutations(seeds["bvec"]).map(lambda b: ("bvec", b)),
    )
    fuzz("read_bvals/read_bvecs", strategy, target)


# ---------------------------------------------------------------------------------------------
# tractograms


def _sane_tractogram(tract) -> None:
    assert np.isfinite(tract.points).all()
    assert tract.offsets[0] == 0 and tract.offsets[-1] == len(tract.points)
    _sane_affine(tract.affine)
    assert all(d >= 1 for d in tract.dimensions)


def test_fuzz_load_trk(seeds, tmp_path):
    from tractlens.app.io import load_tractogram

    seed = seeds[".trk"]
    first_count = TRK_FIELDS.itemsize  # the first streamline's point count follows the header
    strategy = st.one_of(
        byte_mutations(seed, 1000),
        byte_mutations(seed),
        field_mutations(seed, TRK_FIELDS, TRK_NAMES),
        field_mutations(seed, TRK_FIELDS, TRK_NAMES).flatmap(lambda b: byte_mutations(b)),
        st.sampled_from(RUNS).map(lambda run: seed[:first_count] + run + seed[first_count + len(run) :]),
    )

    def target(blob):
        (tmp_path / "t.trk").write_bytes(blob)
        _sane_tractogram(load_tractogram(tmp_path / "t.trk"))

    fuzz("load_tractogram .trk", strategy, target)


@st.composite
def tck_mutations(draw, seed: bytes) -> bytes:
    head, sep, body = seed.partition(b"END\n")
    lines = head.decode().splitlines()
    kind = draw(st.sampled_from(["header", "header", "bytes", "body"]))
    if kind == "header":
        key = draw(st.sampled_from(["count", "datatype", "file", "magic", "drop", "dup"]))
        if key == "count":
            lines[1] = f"count: {draw(st.sampled_from(['-1', '0', '99999999999', 'x', '', '1e3', '4']))}"
        elif key == "datatype":
            lines[2] = f"datatype: {draw(st.sampled_from(['Float64LE', 'Float32BE', 'Int8', '', 'Float16LE']))}"
        elif key == "file":
            lines[3] = f"file: {draw(st.sampled_from(['. -5', '. 0', '. 99999999', 'other.bin 67', '.', '. x']))}"
        elif key == "magic":
            lines[0] = draw(st.sampled_from(["mrtrix track", "", "MRTRIX TRACKS"]))
        elif key == "drop":
            del lines[draw(st.integers(0, len(lines) - 1))]
        else:
            lines.insert(1, lines[draw(st.integers(1, len(lines) - 1))])
        new_head = ("\n".join(lines) + "\n").encode()
        return new_head + sep + (body if draw(st.booleans()) else body[:4])
    if kind == "body":
        return head + sep + draw(byte_mutations(body))
    return draw(byte_mutations(seed, len(head)))


def test_fuzz_load_tck(seeds, tmp_path):
    from tractlens.app.io import load_tractogram

    def target(example):
        blob, with_reference = example
        (tmp_path / "t.tck").write_bytes(blob)
        tract = load_tractogram(tmp_path / "t.tck", reference=(AFFINE, SHAPE) if with_reference else None)
        _sane_tractogram(tract)

    fuzz("load_tractogram .tck", st.tuples(tck_mutations(seeds[".tck"]), st.booleans()), target)


def _zip_members(blob: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _rezip(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


@st.composite
def json_mutations(draw, text: bytes) -> bytes:
    """Replace one value of a JSON object (nested lists too) with an odd one, or break the text."""
    if draw(st.integers(0, 4)) == 0:
        return draw(byte_mutations(text))
    doc = json.loads(text)
    odd = st.one_of(
        st.sampled_from([None, -1, 0, 2**63, -(2**31), 1e308, "x", [], {}, [1, 2], [[0] * 4] * 3, True, 0.5]),
        st.sampled_from(["NaN", "Infinity"]).map(float),
        st.integers(-1000, 10**7),
    )
    # walk down to a container and change one entry
    node = doc
    for _ in range(draw(st.integers(0, 3))):
        children = (
            [v for v in node.values() if isinstance(v, dict | list)]
            if isinstance(node, dict)
            else [v for v in node if isinstance(v, dict | list)]
        )
        if not children:
            break
        node = draw(st.sampled_from(children))
    if isinstance(node, dict) and node:
        key = draw(st.sampled_from(sorted(node)))
        if draw(st.integers(0, 3)):
            node[key] = draw(odd)
        else:
            del node[key]
    elif isinstance(node, list) and node:
        index = draw(st.integers(0, len(node) - 1))
        action = draw(st.sampled_from(["set", "set", "del", "dup"]))
        if action == "set":
            node[index] = draw(odd)
        elif action == "del":
            del node[index]
        else:
            node.append(node[index])
    return json.dumps(doc).encode()


@st.composite
def zip_mutations(draw, blob: bytes, member_mutations: dict | None = None) -> bytes:
    """A raw-mutated zip, or the zip rebuilt with one member's content or name mutated."""
    kind = draw(st.sampled_from(["raw", "member", "member", "member", "rename", "drop"]))
    if kind == "raw":
        return draw(byte_mutations(blob))
    members = _zip_members(blob)
    names = sorted(members)
    name = draw(st.sampled_from(names))
    if kind == "member":
        special = (member_mutations or {}).get(name)
        members[name] = draw(
            special(members[name]) if special and draw(st.booleans()) else byte_mutations(members[name])
        )
    elif kind == "rename":
        parts = name.split(".")
        new = draw(
            st.sampled_from(
                [
                    name.replace("float32", "float64"),
                    name.replace("uint32", "uint64"),
                    name.replace(".3.", ".4."),
                    name.replace(".3.", ".0."),
                    parts[0] + ".bogus",
                    "../" + name,
                    name + "/",
                    "/abs/" + name,
                    name.replace("float32", "int8"),
                ]
            )
        )
        members[new] = members.pop(name)
    else:
        del members[name]
    return _rezip(members)


def test_fuzz_load_trx(seeds, tmp_path):
    from tractlens.app.io import load_tractogram

    def target(blob):
        (tmp_path / "t.trx").write_bytes(blob)
        _sane_tractogram(load_tractogram(tmp_path / "t.trx"))

    strategy = zip_mutations(seeds[".trx"], {"header.json": json_mutations})
    before = _temp_entries()
    fuzz("load_tractogram .trx", strategy, target)
    leaked = _temp_entries() - before
    assert len(leaked) < 5, f"trx loading left temporary folders behind: {sorted(leaked)[:5]}"


def _temp_entries() -> set[str]:
    """Temporary folders of trx-python and of session opening (other processes' files are not counted)."""
    import tempfile

    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith(("trx_", "tractlens-open-"))}


# ---------------------------------------------------------------------------------------------
# tensors, bedpostX, sessions


def test_fuzz_load_tensor(seeds, tmp_path):
    from tractlens.app.io import load_tensor

    def target(example):
        (blob, container), which = example
        path = write_nifti(tmp_path, "tensor", (blob, container))
        volume = load_tensor(path, "fsl" if which == "tensor" else None)
        assert volume.data.shape[3:] == (6,) and np.isfinite(volume.data).all()
        _sane_volume(volume, (4,))

    strategy = st.one_of(
        st.tuples(nifti_bytes(seeds["tensor"]), st.just("tensor")),
        st.tuples(nifti_bytes(seeds["symmatrix"]), st.just("symmatrix")),
    )
    fuzz("load_tensor", strategy, target)


@pytest.fixture(scope="module")
def bedpostx_seed(tmp_path_factory):
    from tractlens.app.io.bedpostx import BedpostSamples, save_bedpostx

    rng = np.random.default_rng(3)
    shape = (4, 4, 3)
    mask = np.ones(shape, bool)
    theta, phi, f = (rng.random((*shape, 1, 3)).astype(np.float32) for _ in range(3))
    folder = tmp_path_factory.mktemp("bpx-seed")
    save_bedpostx(folder, BedpostSamples(theta, phi, f, mask, AFFINE))
    keep = ("merged_th1samples", "merged_ph1samples", "merged_f1samples", "nodif_brain_mask")
    return {name: gzip.decompress((folder / f"{name}.nii.gz").read_bytes()) for name in keep}


def test_fuzz_load_bedpostx(bedpostx_seed, tmp_path):
    from tractlens.app.io import load_bedpostx

    names = sorted(bedpostx_seed)
    folder = tmp_path / "subject.bedpostX"
    folder.mkdir()

    def target(example):
        which, mutated = example
        for name in names:
            for suffix in (".nii", ".nii.gz"):
                (folder / f"{name}{suffix}").unlink(missing_ok=True)
            if name == which:
                write_nifti(folder, name, mutated)
            else:
                (folder / f"{name}.nii").write_bytes(bedpostx_seed[name])
        samples = load_bedpostx(folder)
        assert samples.theta.shape == samples.phi.shape == samples.f.shape
        assert samples.theta.ndim == 5 and samples.theta.shape[:3] == samples.mask.shape
        _sane_affine(samples.affine)

    strategy = st.sampled_from(names).flatmap(lambda n: st.tuples(st.just(n), nifti_bytes(bedpostx_seed[n])))
    fuzz("load_bedpostx", strategy, target, examples=BEDPOSTX_EXAMPLES)


@pytest.fixture(scope="module")
def session_seed(seeds, tmp_path_factory):
    from tractlens.app.model import Document, Layer, RoiMask, Volume
    from tractlens.app.session import save_session

    doc = Document()
    doc.add_layer(
        Layer("FA", Volume("FA", np.random.default_rng(1).random(SHAPE).astype(np.float32), AFFINE), "scalar")
    )
    mask = np.zeros(SHAPE, bool)
    mask[2:4, 2:4, 2:4] = True
    doc.add_layer(Layer("seed", RoiMask("seed", mask, AFFINE, role="seed"), "roi"))
    tract = seeds["tract"]
    layer = doc.add_layer(Layer("bundle", tract, "tractogram"))
    layer.set_selection(np.arange(len(tract)) % 2 == 0)
    path = tmp_path_factory.mktemp("session-seed") / "seed.tractlens"
    save_session(doc, path)
    return path.read_bytes()


def test_fuzz_load_session(session_seed, tmp_path):
    from tractlens.app.session import load_session

    members = _zip_members(session_seed)
    special = {"manifest.json": json_mutations}
    for name in members:
        if name.endswith(".nii.gz"):
            special[name] = lambda b: byte_mutations(gzip.decompress(b), 348).map(
                lambda raw: gzip.compress(raw, compresslevel=1, mtime=0)
            )
        elif name.endswith(".nii"):
            special[name] = lambda b: field_mutations(b, NIFTI1_FIELDS, NIFTI_NAMES)
        elif name.endswith(".trx"):
            special[name] = lambda b: zip_mutations(b, {"header.json": json_mutations})

    def target(blob):
        (tmp_path / "s.tractlens").write_bytes(blob)
        session = load_session(tmp_path / "s.tractlens")
        for layer in session.document.layers:
            if layer.kind == "tractogram":
                _sane_tractogram(layer.data)
            else:
                _sane_affine(layer.data.affine)

    before = _temp_entries()
    fuzz("load_session", zip_mutations(session_seed, special), target)
    leaked = _temp_entries() - before
    assert len(leaked) < 5, f"session loading left temporary folders behind: {sorted(leaked)[:5]}"


def test_counts_cover_every_loader():
    """Runs last in this module: every loader was fuzzed with enough inputs and none failed."""
    expected = {
        "load_volume", "load_mask", "load_labels", "load_dwi (NIfTI mutated)", "load_dwi (bval mutated)",
        "load_dwi (bvec mutated)", "read_bvals/read_bvecs", "load_tractogram .trk", "load_tractogram .tck",
        "load_tractogram .trx", "load_tensor", "load_bedpostx", "load_session",
    }  # fmt: skip
    if not expected <= set(COUNTS):
        pytest.skip("run the whole module to check the totals (a -k selection ran part of it)")
    for name in expected:
        c = COUNTS[name]
        assert c["failures"] == 0 and c["tried"] >= (BEDPOSTX_EXAMPLES if name == "load_bedpostx" else EXAMPLES), name
        assert c["tried"] == c["ok"] + c["input_error"]
