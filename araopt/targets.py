"""The two targets a parameter version and its releases can have (the browser APIs), described once,
so that the commands take a target rather than assume ARA's, and the W3C Attribution API plugs in
beside ARA instead of being wired twice:

============  =========================================  ==========================================
              ARA (``araopt.mechanism``, ``araopt.ara``)   W3C Attribution Level 1 (``araopt.attribution``)
============  =========================================  ==========================================
privacy unit  the impression (a source): Alg. 1 caps      browser instance x conversion site x epoch:
              its reports over its life                   the browser's budgets
budget        epsilon per release; Gamma per source        epsilon per site per epoch (per-site budget)
encoder       Alg. 3 / Alg. 6 (HistogramContribution)     measureConversion per query (its encoder)
noise         DLap(epsilon / Gamma) once per key           Laplace of scale 2 maxValue / epsilon_l once
                                                          per histogram index
============  =========================================  ==========================================

The noise's variance model is the optimizer's (``optimize.mechanisms``: ``ARA_LINF``, ``ATTRIBUTION``);
what a release of a version reads and records of itself (the input columns it validates, its ledger
entry, its manifests' facts, its run summary's parameter facts) is decided here per target, for
``measure``'s one command path (``pipelines.measure``) and its one commit (``araopt.ledger.commit``).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from araopt.attribution.lifetime import CHARGED, MATCHED, ChargedWindow
from araopt.attribution.params import AttributionParams
from araopt.attribution.reconstruct import check_noise_rates
from araopt.errors import InvalidParameters, Unsupported
from araopt.io.conversions import BROWSER_ID, IMPRESSION_ID
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.params import Encoding
from araopt.optimize.mechanisms import ARA_LINF, NoiseModel
from araopt.optimize.mechanisms import ATTRIBUTION as ATTRIBUTION_NOISE
from araopt.version import Api, ParameterVersion


class HeldLookback(StrEnum):
    """How a release's job says which earlier releases its lookback held whole (the commit's check that
    a lookback costs each earlier release in reach with all of its conversions)."""

    COUNTED = "counted"
    """Counted per earlier release of the ledger's history in the job (``transforms.rowset.CountHeldReleases``,
    ``araopt.ledger.lifetime``); nothing to count without a history."""
    ROW_IDS = "row ids"
    """Every lookback row's id written beside the released rows' and matched with the earlier releases'
    at commit (``araopt.ledger.attribution``)."""


@dataclass(frozen=True)
class Target:
    """One target: its API, what Alg. 1 groups by (``privacy_unit``, and the log column the jobs shard
    by: ``unit_column``, ``fallback_unit_column`` when the log lacks it), whose budget a report spends,
    the encoder, and the noise's variance model (``optimize.mechanisms``); and what a release job
    (``transforms.measure.build_release``, written once) does differently per target: whether the read
    groups the privacy units (``groups_at_read``: ARA's complete impressions, sharded and checked for
    constant impression-side slices before Alg. 1; else the release step groups them itself, as the
    W3C browsers are simulated per shard), whether the log's Attribution columns are validated too
    (``attribution_columns``), and how the lookback's held releases are told (``held_lookback``)."""

    api: Api
    privacy_unit: str
    unit_column: str
    budget: str
    encoder: str
    noise: NoiseModel
    fallback_unit_column: str | None = None
    groups_at_read: bool = True
    attribution_columns: bool = False
    held_lookback: HeldLookback = HeldLookback.COUNTED
    debug_needs_simulation: bool = False
    """Whether a debug run writes what only a simulation may: W3C Attribution's debug output is the
    browsers' unnoised sums; ARA's is the Aggregation Service's debug report (operator-private)."""

    def group_column(self, columns: Iterable[str]) -> str:
        """The column whose value keeps a privacy unit's rows together (one shard each): ``unit_column``,
        or without it in ``columns`` the fallback (Attribution: each impression its own browser)."""
        present = set(columns)
        if self.unit_column in present or self.fallback_unit_column is None:
            return self.unit_column
        return self.fallback_unit_column


ARA = Target(Api.ARA, "impression", IMPRESSION_ID, "the contribution budget of each source over its life",
             "HistogramContribution (Alg. 3 / Alg. 6)", ARA_LINF)
ATTRIBUTION = Target(Api.ATTRIBUTION, "browser instance x conversion site x epoch", BROWSER_ID,
                     "the per-site budget of each epoch", "measureConversion per query (araopt.attribution.encoder)",
                     ATTRIBUTION_NOISE, fallback_unit_column=IMPRESSION_ID, groups_at_read=False,
                     attribution_columns=True, held_lookback=HeldLookback.ROW_IDS, debug_needs_simulation=True)
TARGETS = {t.api: t for t in (ARA, ATTRIBUTION)}


def target_of(version: ParameterVersion) -> Target:
    return TARGETS[version.api]


def attribution_params(version: ParameterVersion, command: str = "measure --api attribution") -> AttributionParams:
    """The Attribution parameters a release of ``version`` is made with (refused: another API,
    conversion-side slices, whose aggregation tasks need a declared task layout, or a query whose noise
    araopt cannot sample: ``reconstruct.check_noise_rates``)."""
    version.require_api(Api.ATTRIBUTION, command)
    if version.attribution is None:  # (require_api: an attribution version carries them)
        raise InvalidParameters("the parameter version carries no attribution parameters")
    if version.attribution.conversion_slice_columns:
        raise Unsupported(f"{command}: conversion-side slices (aggregation tasks) need a declared task layout, not "
                          f"supported yet")
    check_noise_rates(version.attribution)  # before any work, not at the job's noise step
    return version.attribution


def input_columns(version: ParameterVersion) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(slice columns, value columns) a release of ``version`` reads and validates."""
    if version.api == Api.ATTRIBUTION:
        params = attribution_params(version)
        return (*params.slice_columns, *params.conversion_slice_columns), params.value_columns
    return version.params.slice_columns, version.params.query_columns


def domain_columns(version: ParameterVersion) -> tuple[tuple[str, ...], tuple[str, ...], bool, tuple[str, ...]]:
    """How a declared domain file of a release of ``version`` is read: (slice columns, query columns,
    baseline encoding's extra key, conversion-side slice columns); for Attribution its histogram layout
    (impression-side slices, the queries' names)."""
    if version.api == Api.ATTRIBUTION:
        params = attribution_params(version)
        return params.slice_columns, params.query_names, False, ()
    p = version.params
    return p.slice_columns, p.query_columns, p.encoding == Encoding.BASELINE, p.conversion_slice_columns


def check_domain(version: ParameterVersion, domain: KeyDomain, source: str) -> None:
    """Refuse (one line naming ``source``) a domain whose columns are not those of ``version``'s target."""
    if version.api == Api.ATTRIBUTION:
        attribution_params(version).check_domain(domain, source=source)
    else:
        version.params.check_domain(domain, source=source)


def ledger_entry(version: ParameterVersion, epsilon_note: dict[str, Any] | None = None,
                 accounting: dict[str, Any] | None = None, attribution: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """The ledger entry's own fields of a release of ``version`` (``araopt.ledger.commit`` adds the
    output, the release files' digests and the ids): the parameters' sha256, epsilon and the mechanism
    it released with (ARA: the mechanism part, which later lookbacks are costed with; Attribution: the
    whole version, and the impression times its accepted reports charged, from the job's
    ``accounting``: ``araopt.attribution.lifetime``, and ``attribution``: its layout and the ledger's draw
    key, ``araopt.ledger.attribution.entry_fields``), with ``epsilon_note`` (an ``--override-epsilon``)."""
    if version.api == Api.ATTRIBUTION:
        return {"params_sha256": version.checksum(), "api": Api.ATTRIBUTION.value, "epsilon": version.params.epsilon,
                "mechanism": version.to_json(), CHARGED: (accounting or {}).get(CHARGED), **(attribution or {})}
    params = version.params
    return {"params_sha256": version.checksum(), "epsilon": params.epsilon,
            "mechanism": ParameterVersion(params).to_json(), **(epsilon_note or {})}


def charged_impressions(version: ParameterVersion, accounting: dict[str, Any]) -> ChargedWindow | None:
    """The impression times an Attribution release's matched reports used (its job's ``accounting``: the
    epochs whose budgets its decisions read, a superset of those its accepted reports charged), which the
    ledger compares with earlier attribution releases' charged ones (no epoch charged by two releases
    unless the later one carried the earlier's budget state: ``araopt.ledger.attribution``); None for ARA,
    or when no report matched."""
    window = accounting.get(MATCHED, accounting.get(CHARGED))
    if version.api != Api.ATTRIBUTION or window is None:
        return None
    return ChargedWindow.from_json(window)


def public_facts(version: ParameterVersion) -> dict[str, Any]:
    """What a release's manifest says of its parameters (public)."""
    if version.api == Api.ATTRIBUTION:
        return {"params_sha256": version.checksum(), "api": Api.ATTRIBUTION.value}
    return {"params_sha256": version.checksum(), "epsilon": version.params.epsilon}


def private_facts(version: ParameterVersion, domain_origin: str) -> dict[str, Any]:
    """What a release's run manifest says of its parameters and domain (operator-private)."""
    if version.api == Api.ATTRIBUTION:
        return {"params_sha256": version.checksum(), "domain": domain_origin}
    return {"params_sha256": version.checksum(), "epsilon": version.params.epsilon, "domain": domain_origin}
