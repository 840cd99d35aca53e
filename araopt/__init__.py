"""araopt: optimized summary reports for the Privacy Sandbox Attribution Reporting API.

Engine-free core (numpy/scipy/pyarrow only; never imports Beam). The public API:
``Params``, ``QueryParams``, ``encode``, ``bound_contributions``, ``sample_discrete_laplace``,
``summary_report``, ``reconstruct``, ``expected_error``, ``rmsre_tau``, ``KeyDomain``, ``measure``.
"""
from araopt.constants import CONTRIBUTION_BUDGET
from araopt.io import avro, outputs
from araopt.io.conversions import Conversions
from araopt.mechanism import aggregate, release
from araopt.mechanism.bounding import bound_contributions
from araopt.mechanism.encoding import encode, randomized_round
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.measure import Measurement, encode_and_bound, measure
from araopt.mechanism.noise import discrete_laplace_variance, sample_discrete_laplace
from araopt.mechanism.params import Params, QueryParams
from araopt.mechanism.randomness import Simulation, secure_generator
from araopt.mechanism.report import Estimates, SummaryReport, key_histogram, reconstruct, summary_report
from araopt.optimize.error_model import ErrorBreakdown, RmsreTau, default_taus, expected_error, rmsre_tau
from araopt.version import Provenance

__version__ = "0.1.0"

__all__ = [
    "CONTRIBUTION_BUDGET", "Conversions", "aggregate", "avro", "outputs", "release", "ErrorBreakdown", "Estimates",
    "KeyDomain", "Measurement", "Params",
    "Provenance", "QueryParams", "RmsreTau", "Simulation", "SummaryReport", "bound_contributions", "default_taus",
    "discrete_laplace_variance", "encode", "encode_and_bound", "expected_error", "key_histogram", "measure",
    "randomized_round", "reconstruct", "rmsre_tau", "sample_discrete_laplace", "secure_generator", "summary_report",
]
