"""What the tracking commands (:mod:`.track` for tensors, :mod:`.track_fod` for fODFs) share:
the output options, the regions read onto the tracking grid, the streamlines written while they
are tracked, and the summary. Like every command module, it imports the pipelines and writers
when a command runs, not with the parser that every ``tractlens`` command starts through."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..params import TractogramOutputParams
from ..timing import phase, recorder
from ._common import EXIT_OK, Progress, emit, log
from .options import params_from_args


def tractogram_output(args, fix: str) -> TractogramOutputParams:
    """The output options of a tracking command, checked against the output's format."""
    output = params_from_args(TractogramOutputParams, args, fix=fix)
    if output.positions_dtype != "float32" and Path(args.output).suffix.lower() != ".trx":
        raise InputError(
            f"--dtype {output.positions_dtype} is for .trx output; .trk and .tck hold float32",
            fix="Write a .trx file, or drop --dtype",
        )
    return output


def regions_from_args(args, grid, notes: list) -> dict:
    """The seed, tracking mask, stop, include and exclude regions of a tracking command, read
    and brought onto ``grid`` (a tensor field or an fODF volume)."""
    from ..pipelines.track import masks_on_field  # a command imports its pipeline when it runs

    return {
        "mask": masks_on_field([args.mask], "tracking mask", grid, notes)[0] if args.mask else None,
        "seed_mask": masks_on_field([args.seed], "seed mask", grid, notes)[0] if args.seed else None,
        "stop": masks_on_field(args.stop or [], "stop region", grid, notes),
        "include": masks_on_field(args.include or [], "include region", grid, notes),
        "exclude": masks_on_field(args.exclude or [], "exclude region", grid, notes),
    }


def track_to_file(args, pipeline, grid, output, seeding, notes: list, **regions):
    """Run a tracking ``pipeline`` (tensor or fODF) with the command's seeding on ``grid``,
    its streamlines written to ``args.output`` while it tracks (by a thread, while the next batch
    is tracked). The file is removed unless tracking ends well (an error, Ctrl-C); its parts
    count as write."""
    from ..io.tractogram_stream import open_tractogram_writer

    with (
        open_tractogram_writer(
            args.output, grid.affine, grid.shape, positions_dtype=output.positions_dtype, background=True
        ) as writer,
        phase("compute"),
    ):

        def sink(part) -> None:
            with phase("write"):
                writer.append(part)

        result = pipeline(
            grid,
            whole_brain=args.whole_brain,
            seeds_per_voxel=seeding.seeds_per_voxel,
            placement=seeding.placement,
            rng_seed=seeding.rng_seed,
            device=args.device,
            progress=Progress("track", "seeds", quiet=args.quiet),
            notes=notes,
            sink=sink,
            **regions,
        )
        with phase("write"):  # .trx: the folder zipped into the file
            writer.close()
    recorder().detail("tractogram_writer", writer.seconds)  # its thread's stages, beside the phases
    return result


def report_tracking(args, result) -> int:
    """The run's notes as warnings, its summary on stdout (``--json``) or a line on stderr."""
    for note in result.notes:
        log.warning("%s", note)
    prov = result.provenance
    method = f" ({prov['method']})" if "fod" in prov else ""
    human = (
        f"{prov['streamlines']} streamlines{method} from {prov['seeds']} seeds on {prov['backend']} "
        f"({prov['device']}) in {prov['tracking_s']:.2f} s; written to {args.output}"
    )
    emit(args, {"output": str(args.output), **result.summary()}, human)
    return EXIT_OK
