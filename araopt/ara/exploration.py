"""Exploration arms as ARA registrations: what the ad server registers so that Chrome caps an arm's
impressions at the arm's count limit and reports them on the arm's pooled keys.

* Source: the ad server assigns the impression its arm (``Exploration.assign``: a keyed hash of the
  impression id) and registers ``filter_data: {"araopt_arm": [label]}``, label ``main`` or the arm's
  index. A main source's ``aggregation_keys`` carry its impression-side slice fields (as without
  arms); an arm's carry the arm's bucket bits (the top bit, the arm's index; no slice: arms are pooled).
* Trigger: the conversion does not know its impression's arm, so it carries every configuration and
  the browser picks by the source's filter data: ``aggregatable_values`` is a list of
  ``{"values", "filters": {"araopt_arm": [label]}}``, the main values (Alg. 3 / 6 at C) then each
  arm's (at C_a), each totalling floor(Gamma / C) or floor(Gamma / C_a) <= Gamma; key pieces with
  conversion-side slice fields apply to main sources only, the query codes alone to arm sources.
Alg. 1 in the browser then caps every source at Gamma as before: each report stays epsilon-DP.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from araopt.ara.registrations import (
    SourceEncoder,
    TriggerEncoder,
    aggregatable_values,
    key_piece_hex,
    with_extra,
)
from araopt.errors import InvalidParameters
from araopt.mechanism.exploration import EXPLORATION_BIT, Exploration

ARM_FILTER = "araopt_arm"
"""The filter-data key of a source's arm."""
MAIN = "main"


def arm_label(arm: int) -> str:
    """Filter value of an arm (-1: the main configuration)."""
    return MAIN if arm < 0 else str(int(arm))


def source_registrations(sources: SourceEncoder, exploration: Exploration) -> list[dict[str, Any]]:
    """Every source registration: the main ones per impression-side slice (``source_index`` 0..n-1,
    with the main filter data), then one per arm (``source_index`` n + arm, pooled over slices)."""
    out = [{"source_index": i, "slice": dict(s), "arm": MAIN,
            "registration": sources.registration_at(i, {"filter_data": {ARM_FILTER: [MAIN]}})}
           for i, s in enumerate(sources.slices)]
    for arm in range(exploration.num_arms):
        piece = key_piece_hex((1 << EXPLORATION_BIT) | (arm << 8))
        registration: dict[str, Any] = {"destination": sources.destination,
                                        "aggregation_keys": {name: piece for name in sources.key_names},
                                        "filter_data": {ARM_FILTER: [arm_label(arm)]}}
        out.append({"source_index": len(sources) + arm, "slice": None, "arm": arm_label(arm),
                    "registration": registration})
    return out


def query_pieces(triggers: TriggerEncoder) -> tuple[str | None, ...]:
    """Trigger key pieces of an arm's keys: the query codes alone (None where 0)."""
    codes = [triggers.domain.query_code(c) for c in range(triggers.params.num_queries + 1)]
    return tuple(key_piece_hex(code) if code else None for code in codes)


def trigger_registration(triggers: TriggerEncoder, exploration: Exploration, contributions: Sequence[Sequence[int]],
                         pieces: Sequence[str | None], extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The trigger of one conversion: ``contributions`` holds its encoding for the main configuration
    then for each arm (HistogramContribution at C, then at every C_a), ``pieces`` its main key pieces."""
    if len(contributions) != exploration.num_arms + 1:
        raise InvalidParameters(f"need {exploration.num_arms + 1} encodings (main, then each arm), got {len(contributions)}")
    names = triggers.key_names
    arm_labels = [arm_label(a) for a in range(exploration.num_arms)]
    arm_pieces = query_pieces(triggers)
    data: list[dict[str, Any]] = []
    if tuple(pieces) == arm_pieces:  # no conversion-side slice: the same pieces for every source
        data += [{"key_piece": p, "source_keys": [n]} for n, p in zip(names, pieces, strict=True) if p is not None]
    else:
        data += [{"key_piece": p, "source_keys": [n], "filters": {ARM_FILTER: [MAIN]}}
                 for n, p in zip(names, pieces, strict=True) if p is not None]
        data += [{"key_piece": p, "source_keys": [n], "filters": {ARM_FILTER: arm_labels}}
                 for n, p in zip(names, arm_pieces, strict=True) if p is not None]
    values = [{"values": aggregatable_values(names, contribution), "filters": {ARM_FILTER: [arm_label(a - 1)]}}
              for a, contribution in enumerate(contributions)]
    return with_extra({"aggregatable_trigger_data": data, "aggregatable_values": values}, extra)
