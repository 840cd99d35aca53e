"""araopt: optimized summary reports for the Privacy Sandbox Attribution Reporting API.

Engine-free core (numpy/scipy/pyarrow only; never imports Beam), in layers (README, Architecture).
The public API: ``Params``, ``QueryParams``, ``ParameterVersion``, ``encode``, ``bound_contributions``,
``sample_discrete_laplace``, ``summary_report``, ``reconstruct``, ``expected_error``, ``rmsre_tau``,
``KeyDomain``, ``measure``. Each name is imported from its module when first used, so importing a
light module of the package (``araopt.constants``: what ``araopt <command> --help`` reads) does not
import numpy.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_PUBLIC = {
    "CONTRIBUTION_BUDGET": "araopt.constants", "Conversions": "araopt.io.conversions", "avro": "araopt.io",
    "outputs": "araopt.io", "aggregate": "araopt.mechanism", "release": "araopt.mechanism",
    "bound_contributions": "araopt.mechanism.bounding", "encode": "araopt.mechanism.encoding",
    "randomized_round": "araopt.mechanism.encoding", "KeyDomain": "araopt.mechanism.keys",
    "Measurement": "araopt.mechanism.measure", "encode_and_bound": "araopt.mechanism.measure",
    "measure": "araopt.mechanism.measure", "discrete_laplace_variance": "araopt.mechanism.noise",
    "sample_discrete_laplace": "araopt.mechanism.noise", "Params": "araopt.mechanism.params",
    "QueryParams": "araopt.mechanism.params", "Simulation": "araopt.mechanism.randomness",
    "secure_generator": "araopt.mechanism.randomness", "Estimates": "araopt.mechanism.report",
    "SummaryReport": "araopt.mechanism.report", "key_histogram": "araopt.mechanism.report",
    "reconstruct": "araopt.mechanism.report", "summary_report": "araopt.mechanism.report",
    "ErrorBreakdown": "araopt.optimize.error_model", "RmsreTau": "araopt.optimize.error_model",
    "default_taus": "araopt.optimize.error_model", "expected_error": "araopt.optimize.error_model",
    "rmsre_tau": "araopt.optimize.error_model", "ParameterVersion": "araopt.version", "Provenance": "araopt.version",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'araopt' has no attribute {name!r}")
    parent = importlib.import_module(module)
    value = getattr(parent, name) if hasattr(parent, name) else importlib.import_module(f"{module}.{name}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


if TYPE_CHECKING:  # the same names, for type checkers
    from araopt.constants import CONTRIBUTION_BUDGET as CONTRIBUTION_BUDGET
    from araopt.io import avro as avro
    from araopt.io import outputs as outputs
    from araopt.io.conversions import Conversions as Conversions
    from araopt.mechanism import aggregate as aggregate
    from araopt.mechanism import release as release
    from araopt.mechanism.bounding import bound_contributions as bound_contributions
    from araopt.mechanism.encoding import encode as encode
    from araopt.mechanism.encoding import randomized_round as randomized_round
    from araopt.mechanism.keys import KeyDomain as KeyDomain
    from araopt.mechanism.measure import Measurement as Measurement
    from araopt.mechanism.measure import encode_and_bound as encode_and_bound
    from araopt.mechanism.measure import measure as measure
    from araopt.mechanism.noise import discrete_laplace_variance as discrete_laplace_variance
    from araopt.mechanism.noise import sample_discrete_laplace as sample_discrete_laplace
    from araopt.mechanism.params import Params as Params
    from araopt.mechanism.params import QueryParams as QueryParams
    from araopt.mechanism.randomness import Simulation as Simulation
    from araopt.mechanism.randomness import secure_generator as secure_generator
    from araopt.mechanism.report import Estimates as Estimates
    from araopt.mechanism.report import SummaryReport as SummaryReport
    from araopt.mechanism.report import key_histogram as key_histogram
    from araopt.mechanism.report import reconstruct as reconstruct
    from araopt.mechanism.report import summary_report as summary_report
    from araopt.optimize.error_model import ErrorBreakdown as ErrorBreakdown
    from araopt.optimize.error_model import RmsreTau as RmsreTau
    from araopt.optimize.error_model import default_taus as default_taus
    from araopt.optimize.error_model import expected_error as expected_error
    from araopt.optimize.error_model import rmsre_tau as rmsre_tau
    from araopt.version import ParameterVersion as ParameterVersion
    from araopt.version import Provenance as Provenance
