"""Microstructure model toolbox, cuDIMOT style: declare a model in a few lines, fit it anywhere.

A model is its parameters (bounds, grid values, priors) and a signal function written once over
the array module (:mod:`.declare`); the toolbox fits it to many voxels at once on NumPy or
CuPy — grid search, Levenberg–Marquardt, optionally MCMC (:mod:`.fit`, :mod:`.optimize`).
Compartments to compose from are in :mod:`.compartments`, the shipped models (NODDI-Watson,
NODDI-Bingham, ball & sticks) in :mod:`.library`.
"""

from . import compartments
from .declare import Acquisition, Model, Parameter, shells
from .fit import FLAG_NAMES, FLAG_NOT_CONVERGED, FLAG_NOT_FITTED, ModelFit, ModelFitParams, fit_model
from .library import MODELS, ball_sticks, noddi_bingham, noddi_watson

__all__ = [
    "FLAG_NAMES",
    "FLAG_NOT_CONVERGED",
    "FLAG_NOT_FITTED",
    "MODELS",
    "Acquisition",
    "Model",
    "ModelFit",
    "ModelFitParams",
    "Parameter",
    "ball_sticks",
    "compartments",
    "fit_model",
    "noddi_bingham",
    "noddi_watson",
    "shells",
]
