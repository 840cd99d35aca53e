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

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from araopt.ara.registrations import (
    SourceEncoder,
    TriggerBatch,
    TriggerEncoder,
    aggregatable_values,
    check_ara_limits_for_cardinalities,
    key_piece_hex,
    with_extra,
)
from araopt.errors import InvalidParameters
from araopt.io import jsonio
from araopt.io.conversions import Conversions
from araopt.mechanism.encoding import encode
from araopt.mechanism.exploration import EXPLORATION_BIT, Exploration
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.measure import rounding_uniforms
from araopt.mechanism.params import Encoding, Params
from araopt.mechanism.randomness import secure_generator

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


def domain_from_conversions(params: Params, conv: Conversions) -> KeyDomain:
    """The slices present in the log (as ``araopt measure`` without --domain), after the key-bit limit check."""
    cards = [int(pd.Series(conv.slices[c]).nunique()) for c in params.slice_columns]
    check_ara_limits_for_cardinalities(params, cards)  # before KeyDomain, which also refuses > 128 bits
    return KeyDomain.from_slice_values(params.slice_columns, conv.slices, params.query_columns,
                                       baseline=params.encoding == Encoding.BASELINE,
                                       conversion_slice_columns=params.conversion_slice_columns)


def configuration_encodings(conv: Conversions, params: Params, simulation_seed: int | None) -> np.ndarray:
    """(n, k + 1, d + 1): every conversion encoded for the main configuration and for each of the k
    arms (Alg. 3 / 6 at C, then at each C_a), with the same rounding uniforms a measure of the record
    uses (in simulation: the record's keyed uniforms; else one secure draw per record)."""
    assert params.exploration is not None
    uniforms = rounding_uniforms(conv.record_keys(), params.num_queries, simulation_seed)
    if uniforms is None:
        uniforms = secure_generator().random((len(conv), params.num_queries))
    configurations = [params] + [params.for_arm(a) for a in range(params.exploration.num_arms)]
    return np.stack([encode(conv.values, p, None, uniforms=uniforms) for p in configurations], axis=1)


def exploring_lines(batch: TriggerBatch, triggers: TriggerEncoder, exploration: Exploration, num_sources: int
                    ) -> Iterator[str]:
    """triggers.jsonl with arms: each conversion's source is its impression's arm source, or its slice's."""
    arm = exploration.assign(batch.impression_id)
    source_index = np.where(arm >= 0, num_sources + arm, batch.source_index)
    shape = (exploration.num_arms + 1, triggers.params.num_queries + 1)
    for i, (imp, t) in enumerate(zip(batch.impression_id.tolist(), batch.conversion_time.tolist(), strict=True)):
        registration = trigger_registration(triggers, exploration,
                                                 batch.contributions[i].reshape(shape).tolist(),
                                                 batch.pieces[batch.piece_index[i]])
        yield jsonio.dumps({"impression_id": imp, "conversion_time_us": t, "source_index": int(source_index[i]),
                            "arm": arm_label(int(arm[i])), "registration": registration}, separators=(",", ":"))
