"""araopt: optimized summary reports for the Privacy Sandbox Attribution Reporting API.

Engine-free core (numpy/scipy/pyarrow only; never imports Beam). The public API:
``Params``, ``QueryParams``, ``encode``, ``bound_contributions``, ``sample_discrete_laplace``,
``summary_report``, ``reconstruct``, ``expected_error``, ``rmsre_tau``, ``KeyDomain``, ``measure``.
"""
from . import aggregate, avro, outputs, release
from .bounding import bound_contributions
from .conversions import Conversions
from .encoding import encode, randomized_round
from .error_model import ErrorBreakdown, RmsreTau, default_taus, expected_error, rmsre_tau
from .keys import KeyDomain
from .mechanism import Measurement, encode_and_bound, measure
from .noise import discrete_laplace_variance, sample_discrete_laplace
from .params import CONTRIBUTION_BUDGET, Params, Provenance, QueryParams
from .randomness import Simulation, secure_generator
from .report import Estimates, SummaryReport, key_histogram, reconstruct, summary_report

__version__ = "0.1.0"

__all__ = [
    "CONTRIBUTION_BUDGET", "Conversions", "aggregate", "avro", "outputs", "release", "ErrorBreakdown", "Estimates",
    "KeyDomain", "Measurement", "Params",
    "Provenance", "QueryParams", "RmsreTau", "Simulation", "SummaryReport", "bound_contributions", "default_taus",
    "discrete_laplace_variance", "encode", "encode_and_bound", "expected_error", "key_histogram", "measure",
    "randomized_round", "reconstruct", "rmsre_tau", "sample_discrete_laplace", "secure_generator", "summary_report",
]
