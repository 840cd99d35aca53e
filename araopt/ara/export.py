"""``export-ara``'s deployment, engine-free (docs/ara.md): from a parameter version and its key domain to
what the ad servers and the Aggregation Service are given. The refusals first (Chrome's contribution
budget, ARA's limits), the domain (a key map, the version's, or, with a warning, the slices of a
conversion log), then the content: the key map (JSON and CSV), one source registration per slice of
impression features (and the exploration arms' sources), the output domain's buckets, and, for a
conversion log, one trigger per conversion (every configuration's encoding when the version explores:
the browser picks by the arm), with the export's summary. ``pipelines.ara`` reads the inputs, writes
these files through the output-folder contract and prints."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from araopt.ara import exploration as arms
from araopt.ara.exploration import domain_from_conversions
from araopt.ara.registrations import (
    ARA_CONTRIBUTION_BUDGET,
    REGISTER_SOURCE,
    REGISTER_TRIGGER,
    KeyMap,
    SourceEncoder,
    TriggerBatch,
    TriggerEncoder,
    check_ara_limits,
    key_map_json,
    trigger_batch,
)
from araopt.errors import InvalidParameters
from araopt.io.conversions import Conversions
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.measure import encode_and_bound
from araopt.mechanism.release import check_declared_domain, check_learnt_window, with_version_end
from araopt.publication import histogram_buckets
from araopt.version import ParameterVersion


def check_exportable(version: ParameterVersion) -> None:
    """Refuse parameters registrations cannot carry: a contribution budget other than Chrome's (the
    Aggregation Service noises at epsilon / that budget). (ARA's limits that do not depend on the slices:
    ``check_ara_limits_for_cardinalities(params, [])``, before any data is read.)"""
    params = version.params
    if params.contribution_budget != ARA_CONTRIBUTION_BUDGET:
        raise InvalidParameters(f"contribution_budget Γ = {params.contribution_budget}: Chrome's budget per source is "
                                f"fixed at {ARA_CONTRIBUTION_BUDGET} (and the Aggregation Service noises at "
                                f"ε/{ARA_CONTRIBUTION_BUDGET}), so registrations for another Γ would not do what "
                                f"measure simulates; export parameters with Γ = {ARA_CONTRIBUTION_BUDGET}")


def export_domain(version: ParameterVersion, key_map: KeyMap | None, params_source: str, conv: Conversions | None,
                  conversions_source: str | None, simulation_seed: int | None = None) -> tuple[KeyDomain, str | None]:
    """The key domain of the registrations and a warning, if any: the key map's (checked against the
    version; one of origin ``data`` refused outside simulation, as ``measure`` refuses it:
    ``check_declared_domain``), else the one the version carries (the training history's slices), else
    the slices present in the conversion log (a warning: only a history may give the output domain,
    never the data released)."""
    if key_map is not None:
        domain = key_map.domain_for(version, params_source)
        check_declared_domain(domain, simulation_seed, f"--key-map {key_map.source}")
        return with_version_end(domain, version.domain), None
    if version.domain is not None:
        return version.domain, None
    if conv is not None:
        return domain_from_conversions(version.params, conv), (
            f"the output domain lists exactly the slices present in {conversions_source}: use it for the Aggregation "
            f"Service only if that log is history, never the data being released")
    raise InvalidParameters("export-ara needs the key domain: pass --key-map M, parameters that carry a domain "
                            "(araopt nightly / optimize), or --conversions LOG (its slices)")


@dataclass(frozen=True)
class AraExport:
    """What export-ara writes: the key map, the source registrations document, the output domain's
    buckets, the triggers (None without a conversion log) and the summary (export.json)."""

    key_map: dict[str, Any]
    key_table: Any  # the key map as a table (key_map.csv)
    sources: dict[str, Any]
    buckets: list[int]
    triggers: TriggerBatch | None
    summary: dict[str, Any]
    _trigger_encoder: TriggerEncoder | None = field(default=None, repr=False)
    _num_sources: int = 0

    def trigger_lines(self, version: ParameterVersion) -> Iterator[str]:
        """One Attribution-Reporting-Register-Trigger line per conversion, in browser arrival order
        (OPERATOR-PRIVATE: raw impression ids and times)."""
        assert self.triggers is not None and self._trigger_encoder is not None
        exploration = version.params.exploration
        if exploration is None:
            return iter(self.triggers.lines(self._trigger_encoder))
        return iter(arms.exploring_lines(self.triggers, self._trigger_encoder, exploration, self._num_sources))


def export_ara(version: ParameterVersion, domain: KeyDomain, destination: str, conv: Conversions | None = None,
               rejected: dict[str, int] | None = None, rows_read: int = 0,
               simulation_seed: int | None = None) -> AraExport:
    """The registrations of ``version`` over ``domain`` for ``destination`` (its site), with the triggers
    of ``conv`` (seeded rounding of their values with ``simulation_seed``, as ``measure`` rounds them);
    ARA's limits checked over the domain first, and, outside simulation, that ``conv`` holds none of the
    version's training history (``check_learnt_window``) and that the domain is not theirs (origin
    ``data``: ``check_declared_domain``), as ``measure`` refuses to release them."""
    params = version.params
    check_ara_limits(params, domain)
    if conv is not None:  # the Aggregation Service would release these triggers over the output domain
        check_declared_domain(domain, simulation_seed, "the output domain (the slices present in the conversion log)")
        check_learnt_window(with_version_end(domain, version.domain), conv.conversion_time[conv.period_mask()],
                            simulation_seed is not None)
    sources = SourceEncoder(version, domain, destination)
    triggers = TriggerEncoder(version, domain)
    exploration = params.exploration
    batch = None
    if conv is not None and exploration is None:
        contributions, _ = encode_and_bound(conv, params, simulation_seed=simulation_seed)
        batch = trigger_batch(conv.impression_id, conv.conversion_time, conv.slices, contributions, conv.record_keys(),
                              sources, triggers)
    elif conv is not None:  # every configuration's encoding of every conversion: the browser picks by the arm
        encodings = arms.configuration_encodings(conv, params, simulation_seed)
        batch = trigger_batch(conv.impression_id, conv.conversion_time, conv.slices,
                              encodings.reshape(len(conv), -1), conv.record_keys(), sources, triggers)
    registrations = (sources.all_registrations() if exploration is None
                     else arms.source_registrations(sources, exploration))
    source_doc: dict[str, Any] = {
        "header": REGISTER_SOURCE, "params_sha256": version.checksum(), "layout_sha256": domain.layout_checksum(),
        "impression_slice_columns": list(sources.columns), "key_names": list(sources.key_names),
        "registrations": registrations}
    if exploration is not None:
        source_doc["exploration"] = {**exploration.to_json(), "filter_data_key": arms.ARM_FILTER,
                                     "rule": "an impression of arm a (Exploration.assign: a keyed hash of its id) "
                                             "registers source n + a; a main impression its slice's source"}
    buckets = histogram_buckets(params, domain)  # the output domain: the keys and the arms' keys
    summary = {
        "params_sha256": version.checksum(), "layout_sha256": domain.layout_checksum(), "encoding": params.encoding,
        "slices": domain.num_slices, "keys": domain.num_keys, "buckets": len(buckets), "sources": len(sources),
        "key_bits": domain.total_bits, "keys_per_source": len(sources.key_names),
        "trigger_header": REGISTER_TRIGGER, "conversions_read": rows_read, "conversions_rejected": rejected or {},
        "triggers": len(batch) if batch is not None else 0,
        "triggers_skipped": dict(batch.skipped) if batch is not None else {},
        "triggers_outside_domain": batch.outside_domain if batch is not None else 0,
        "simulation_seed": simulation_seed,
    }
    return AraExport(key_map_json(version, domain), domain.key_table(), source_doc, buckets, batch, summary, triggers,
                     len(sources))
