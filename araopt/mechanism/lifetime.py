"""What an impression's earlier conversions cost over its life: each lookback conversion costed with
the parameters (count limit, arm plan, encoding) of the release that used it, as the browser costed
it when the trigger registered (ContributionCapping, Alg. 1, over the source's whole life).

A release on day d reads the days before as a *lookback* (earlier conversions of the same
impressions that consume budget but are not released). Re-encoding them with *today's* parameters
under-counts the budget whenever the parameters changed: a conversion released at C = 3 cost
floor(Gamma / 3) = 21,845, not floor(Gamma / 5) = 13,107. Here each lookback row gets the L1 norm of
its contribution under the configuration that released it (:class:`ReleaseHistory`, built from the
release ledger), as an interval ``[low, high]``:

* L-inf (Alg. 3) and L1 (Alg. 6): every contribution of configuration C (of arm a) has norm exactly
  floor(Gamma / C_a) (Lemma 4.1: the bottom key takes what the queries leave; L1's rounded entries
  never sum above S = floor(Gamma / C)). Exact: ``low == high``.
* baseline (Sec. 5.1): count key floor(alpha_0 Gamma / C) plus each query's CRR, which is the floor or
  the ceiling of alpha_l Gamma / C x clip(v) / C_l. Random: unless the rounding is reproducible (a
  simulation seed), the norm is only known to lie in [count + sum floor, count + sum ceil].
* a row no recorded release used (or ``history`` is None): any of the known configurations and
  today's may have costed it; the interval spans them all (simulation: today's only, as before).
* a row no recorded release used from before the history's declared ``start_us`` (the time the
  measurement began: no trigger before it registered a contribution, as when an advertiser starts
  using the API): it cost nothing, ``low == high == 0``. A declaration, never inferred: a history
  whose recorded releases hold a row from before it is refused.

``bounding.bound_sorted`` then runs one Alg. 1 over lower and upper norms: with every interval exact
it is Alg. 1; otherwise it keeps a period row only when it fits whatever the earlier rows really
cost (never an under-count of the budget, at the price of keeping less).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from araopt.errors import InvalidInput
from araopt.io.conversions import Conversions
from araopt.io.rowset import RowSet, contained, conversion_row_ids, sorted_unique
from araopt.mechanism.encoding import check_values, count_scale, encode, query_scales
from araopt.mechanism.params import Encoding, Params


@dataclass(frozen=True)
class ReleaseHistory:
    """Earlier releases: the configuration each used and the conversions it released.

    ``configurations``: distinct parameter sets of earlier releases; ``releases``: per release, the
    index of its configuration and the sorted distinct row ids (``araopt.io.rowset``) it released;
    ``names``: per release, its name (the ledger entry's id), or none at all.
    """

    configurations: tuple[Params, ...]
    releases: tuple[tuple[int, np.ndarray], ...]
    names: tuple[str, ...] = ()
    start_us: int | None = None
    """When the measurement began (microseconds since the epoch): a conversion before it that no recorded
    release used registered no contribution and cost no budget. None: unknown (such a conversion may
    have cost any known configuration's)."""

    def __post_init__(self) -> None:
        if self.names and len(self.names) != len(self.releases):
            raise InvalidInput(f"{len(self.names)} names for {len(self.releases)} releases")
        for index, ids in self.releases:
            if not 0 <= index < len(self.configurations):
                raise InvalidInput(f"a release names configuration {index}, there are {len(self.configurations)}")
            if not bool(np.all(ids[1:] > ids[:-1])):
                raise InvalidInput("a release's row ids must be sorted and distinct")

    @classmethod
    def of(cls, releases: Sequence[tuple[Params, np.ndarray]], names: Sequence[str] = (),
           start_us: int | None = None) -> ReleaseHistory:
        """From (configuration, row ids) per release (and their ``names``, the measurement's ``start_us``);
        equal configurations are stored once."""
        configs: list[Params] = []
        out = []
        for config, ids in releases:
            if config not in configs:
                configs.append(config)
            out.append((configs.index(config), sorted_unique(ids)))
        return cls(tuple(configs), tuple(out), tuple(names), None if start_us is None else int(start_us))

    def held(self, row_ids: np.ndarray) -> np.ndarray:
        """Per release, how many of its rows ``row_ids`` hold (each distinct id once)."""
        rows = RowSet(sorted_unique(row_ids), None, None)
        return np.array([np.count_nonzero(rows.contained_in(released)) for _, released in self.releases],
                        dtype=np.int64)

    def summary(self) -> dict[str, object]:
        """What a run records: how many earlier releases, and each configuration's count limit and arms."""
        return {"releases": sum(1 for _, ids in self.releases if len(ids)),
                "configurations": [{"encoding": c.encoding, "count_limit": c.count_limit,
                                    "arm_count_limits": [] if c.exploration is None
                                    else [a.count_limit for a in c.exploration.arms]} for c in self.configurations]}

    def configurations_of(self, row_ids: np.ndarray) -> np.ndarray:
        """(n, k) bool: which configurations released each row (all False: no recorded release)."""
        ids = np.asarray(row_ids, dtype=np.uint64)
        used = np.zeros((len(ids), len(self.configurations)), dtype=bool)
        # the rows searched in sorted order (one sort for every release: a sorted search is ~3x faster)
        order = np.argsort(ids, kind="stable")
        keys = ids[order]
        for index, released in self.releases:
            used[order, index] |= contained(keys, released)
        return used


def norm_bounds(values: np.ndarray, impression_id: np.ndarray, config: Params,
                uniforms: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) int64: the L1 norm of each record's contribution under ``config`` (see module doc).

    ``uniforms``: the records' rounding uniforms when they are reproducible (simulation); a baseline
    record's norm is then exact. L-inf and L1 norms never depend on them."""
    vals = check_values(values, config.num_queries)
    n = vals.shape[0]
    if config.encoding != Encoding.BASELINE:
        if config.exploration is None:
            norm = np.full(n, config.per_conversion_budget, dtype=np.int64)
        else:  # arm a costs floor(Gamma / C_a); index -1 (the main configuration) is the last entry
            per_arm = np.array([config.for_arm(a).per_conversion_budget for a in range(config.exploration.num_arms)]
                               + [config.per_conversion_budget], dtype=np.int64)
            norm = per_arm[config.exploration.assign(impression_id)]
        return norm, norm
    if uniforms is not None:
        norm = encode(vals, config, uniforms=uniforms).sum(axis=1)
        return norm, norm
    thresholds = np.array([q.clip_threshold for q in config.queries], dtype=np.float64)
    scales = query_scales(config).astype(np.float64)
    low = np.full(n, count_scale(config), dtype=np.int64)
    high = low.copy()
    for col in range(vals.shape[1]):  # the encoder's arithmetic (encoding._encode_chunk), so floor/ceil match it
        omega = np.minimum(vals[:, col], thresholds[col])
        omega /= thresholds[col]
        omega *= scales[col]
        low += np.floor(omega).astype(np.int64)
        high += np.ceil(omega).astype(np.int64)
    return low, high


def lifetime_norms(conversions: Conversions, params: Params, contributions: np.ndarray,
                   history: ReleaseHistory | None = None,
                   uniforms: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) L1 norm of every record for Alg. 1 over an impression's life: a period row's is its
    realised contribution's (``contributions``, encoded with today's ``params``); a lookback row's is
    its norm under the configuration(s) that released it (``history``), and under every known one and
    today's when no recorded release used it, nothing when that row is from before the history's
    ``start_us``. ``uniforms``: reproducible rounding (simulation)."""
    realised = contributions.sum(axis=1, dtype=np.int64)
    low, high = realised.copy(), realised.copy()
    back = np.flatnonzero(~conversions.period_mask())
    if len(back) == 0:
        return low, high
    ids, values = conversions.impression_id[back], conversions.values[back]
    configs: tuple[Params, ...] = () if history is None else history.configurations
    used = (np.zeros((len(back), 0), dtype=bool) if history is None
            else history.configurations_of(conversion_row_ids(ids, conversions.conversion_time[back])))
    unrecorded = ~used.any(axis=1)
    candidates = [*configs, params]
    lo = np.full(len(back), np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.zeros(len(back), dtype=np.int64)
    for index, config in enumerate(candidates):
        mask = unrecorded.copy() if index == len(configs) else (used[:, index] | unrecorded)
        rows = np.flatnonzero(mask)
        # seeded uniforms are keyed by the record's content, not the parameters: an earlier seeded day drew these
        c_lo, c_hi = norm_bounds(values[rows], ids[rows], config, None if uniforms is None else uniforms[back[rows]])
        lo[rows] = np.minimum(lo[rows], c_lo)
        hi[rows] = np.maximum(hi[rows], c_hi)
    if history is not None and history.start_us is not None:
        before = conversions.conversion_time[back] < history.start_us
        if bool(np.any(before & ~unrecorded)):
            raise InvalidInput("the release history records a release of a conversion from before its declared "
                               "measurement start: the start cannot be later than the first release")
        lo[before], hi[before] = 0, 0
    low[back], high[back] = lo, hi
    return low, high
