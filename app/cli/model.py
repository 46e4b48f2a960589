"""``tractlens fit-model``: a microstructure model (NODDI-Watson, NODDI-Bingham, ball & sticks) per voxel."""

from __future__ import annotations

import dataclasses

from tractlens.gpu.backend import DEVICES
from tractlens.gpu.models import ModelFitParams

from .fit import _dwi_options, _run_fit
from .options import add_params, dest_of
from .parameter_flags import cli_flags


def add_parsers(sub, common) -> None:
    from tractlens.gpu.models import MODELS

    p = sub.add_parser(
        "fit-model",
        parents=[common],
        help="fit a microstructure model (NODDI-Watson, NODDI-Bingham, ball & sticks): NDI, ODI, FWF maps",
        description="Per voxel: grid search, Levenberg-Marquardt, optionally MCMC (--method mcmc: posterior "
        "means and *_std maps) of a multi-compartment model. NODDI (Zhang 2012; Bingham: Tariq 2016) writes NDI, "
        "ODI (Bingham also ODI_primary, ODI_secondary, DAI), FWF, dir (mean orientation, world RAS unit vectors), "
        "S0, residual, mask and fit_model.json. NODDI needs multi-shell data with b=0 volumes. "
        "Without --mask, a brain mask is computed from the mean b=0 image.",
    )
    p.add_argument("model", choices=tuple(MODELS), help="the model to fit")
    _dwi_options(p)
    add_params(p, ModelFitParams)
    p.add_argument("--device", choices=DEVICES, default="auto", help="compute device (default: auto)")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.set_defaults(func=cmd_fit_model)


def cmd_fit_model(args) -> int:
    from ..pipelines.fit_model import fit_model_pipeline, write_fit_model_outputs

    command_line = canonical_command_line(args)
    return _run_fit(
        args,
        ModelFitParams,
        "Check the fit options (see tractlens fit-model --help)",
        lambda dwi, **kw: fit_model_pipeline(dwi, args.model, **kw),
        lambda result, outdir: write_fit_model_outputs(result, outdir, command_line),
        lambda params, fit: f"{fit['model']}, {params.method.upper()}",
        "maps",
    )


def canonical_command_line(args) -> list[str]:
    """The command as it would be typed to repeat this run: every option with the value used
    (the defaults included, so a later change of a default cannot change what it means)."""
    line = ["tractlens", "fit-model", args.model, args.dwi]
    for flag, value in (("--bval", args.bval), ("--bvec", args.bvec), ("--mask", args.mask)):
        if value:
            line += [flag, value]
    for spec in dataclasses.fields(ModelFitParams):
        dest = dest_of(ModelFitParams, spec.name)
        if hasattr(args, dest):
            line += [cli_flags(ModelFitParams, spec.name)[0], str(getattr(args, dest))]
    return [*line, "--device", args.device, "-o", args.output]
