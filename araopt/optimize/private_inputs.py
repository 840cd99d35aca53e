"""What privacy-safe tuning (``optimize.private``) learns from, decided once, engine-free: the first-party
conversions (no joined log: refused), a past release as the tuner sees it (araopt's published files or
an Aggregation Service report reconstructed with Alg. 4 per key), the declared domain (never derived
from conversions), and the tuning itself over them (the cold start without a release). ``pipelines.private``
only finds and reads the files (local or ``gs://``) and hands them here.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from araopt.errors import InvalidInput, PrivacyRefusal
from araopt.io import outputs
from araopt.io.conversions import IMPRESSION_ID, time_as_micros
from araopt.mechanism.exploration import Exploration, default_exploration
from araopt.mechanism.keys import DATA, HISTORY, KeyDomain
from araopt.mechanism.params import Params
from araopt.optimize.error_model import recorded_without_signal, without_signal_note
from araopt.optimize.private import DAY_US, FirstParty, ReleaseRecord, cold_start, private_tune
from araopt.version import ParameterVersion, Provenance


@dataclass(frozen=True)
class FirstPartyLog:
    """The advertiser's conversions without the impression join: per conversion its UTC day and values,
    and how many rows were read and refused (with their reasons)."""

    day: np.ndarray
    values: np.ndarray
    rows_read: int
    rejected: dict[str, int]
    after_last_day: int = 0  # rows of days after the last day asked for (--as-of): read, never used

    def of_day(self, day: str) -> FirstParty:
        number = int(np.datetime64(day, "D").astype(np.int64))
        return FirstParty.of(day, self.values[self.day == number])

    def between(self, first: str, last: str) -> FirstParty:
        lo, hi = (int(np.datetime64(d, "D").astype(np.int64)) for d in (first, last))
        return FirstParty.of(last, self.values[(self.day >= lo) & (self.day <= hi)])


def first_party_log(tables: Sequence[tuple[str, pa.Table]], values: Sequence[str], domain: KeyDomain,
                    last_day: str | None = None) -> FirstPartyLog:
    """The first-party log of ``tables`` ((path, table) per file): a joined log (impression_id or an
    impression-side slice column) is refused; rows with a missing time or a missing, negative or
    non-finite value are refused and counted; with ``last_day`` (the as-of date) rows of later days
    are counted and left out, so a backtest never sees its future (rows read = rows used + refused +
    after the last day)."""
    impression_side = [c for c in domain.slice_columns if c not in domain.conversion_slice_columns]
    days, vals, read, rejected = [], [], 0, {"missing_time": 0, "invalid_value": 0}
    after = 0
    cut = None if last_day is None else int(np.datetime64(last_day, "D").astype(np.int64))
    for path, table in tables:
        joined = [c for c in (IMPRESSION_ID, *impression_side) if c in table.column_names]
        if joined:
            raise PrivacyRefusal(f"--first-party {path}: has column(s) {joined}: that is a joined impression->conversion "
                                 f"log, which privacy-safe tuning never reads (give conversions with their time, values "
                                 f"and conversion-side slices only)")
        missing = [c for c in ("conversion_time", *values) if c not in table.column_names]
        if missing:
            raise InvalidInput(f"--first-party {path}: missing column(s) {missing}")
        read += table.num_rows
        micros, valid_time, _ = time_as_micros(table.column("conversion_time"))
        columns = [pc.cast(table.column(c), pa.float64()).to_numpy(zero_copy_only=False) for c in values]
        matrix = np.column_stack(columns) if columns else np.zeros((table.num_rows, 0))
        good_value = np.isfinite(matrix).all(axis=1) & (matrix >= 0).all(axis=1)
        rejected["missing_time"] += int((~valid_time).sum())
        rejected["invalid_value"] += int((valid_time & ~good_value).sum())
        keep = valid_time & good_value
        day = np.floor_divide(micros, DAY_US)
        if cut is not None:
            later = keep & (day > cut)
            after += int(later.sum())
            keep &= ~later
        days.append(day[keep])
        vals.append(matrix[keep])
    return FirstPartyLog(np.concatenate(days).astype(np.int64), np.concatenate(vals), read,
                         {k: v for k, v in rejected.items() if v}, after)


RELEASE_NAMES = (outputs.RELEASE_JSON, outputs.ESTIMATES_CSV, outputs.EXPLORATION_CSV)
"""The files of a release folder's ``release/`` the tuner reads (the exploration table only with arms)."""


def refuse_joined_inputs(given: Sequence[str]) -> None:
    """Privacy-safe tuning reads no joined impression->conversion log (as :func:`first_party_log` refuses
    one given as the first-party log): refused when options giving one were passed (``given``: their
    flags, e.g. ``--history``, ``--lookback``)."""
    if given:
        raise PrivacyRefusal(f"--private reads no joined impression->conversion log: drop {' and '.join(given)}")


def checked_release_files(release_dir: str, manifest: Mapping[str, Any], read: Callable[[str], bytes]
                          ) -> dict[str, bytes]:
    """The release files the tuner reads, each checked against the release's manifest (its sha256):
    ``read(name)`` gives a file's bytes."""
    listed = {entry["path"]: entry for entry in manifest.get("files", [])}
    files: dict[str, bytes] = {}
    for name in RELEASE_NAMES:
        entry = listed.get(f"{outputs.RELEASE_DIR}/{name}") or listed.get(name)
        if entry is None:
            if name == outputs.EXPLORATION_CSV:
                continue
            raise InvalidInput(f"{release_dir}: the manifest lists no {name}")
        data = read(name)
        if outputs.sha256_hex(data) != entry.get("sha256"):
            raise InvalidInput(f"{release_dir}/{name}: its sha256 differs from the manifest's (a changed or partial "
                               f"release)")
        files[name] = data
    return files


def check_secure_release(release_dir: str, facts: Mapping[str, Any]) -> None:
    """Privacy-safe tuning reads only releases made with secure noise (never a simulation's)."""
    if facts.get("simulation") or not facts.get("differentially_private"):
        raise PrivacyRefusal(f"{release_dir}: not a differentially private release (a simulation): privacy-safe tuning "
                             f"reads only releases made with secure noise")


def check_release_domain(release_dir: str, facts: Mapping[str, Any], domain: KeyDomain) -> None:
    """Privacy-safe tuning reads only releases over the declared domain (the same layout checksum)."""
    if facts.get("domain_layout_sha256") != domain.layout_checksum():
        raise InvalidInput(f"{release_dir}: released over another domain than the declared one (layout checksum "
                           f"differs): privacy-safe tuning needs every release over the declared domain")


def release_record(release_dir: str, files: Mapping[str, bytes], facts: Mapping[str, Any], params: Params,
                   domain: KeyDomain, first_party: FirstParty) -> ReleaseRecord:
    """One of araopt's releases (its checked ``files``, ``release.json``'s ``facts``, the public
    ``params`` it was made with) as the tuner sees it: the noised capped estimates per slice and arm."""
    estimates = pd.read_csv(io.BytesIO(files[outputs.ESTIMATES_CSV]))
    queries = ["count", *[q["column"] for q in facts["queries"]]]
    shape = (domain.num_slices, len(queries))
    if len(estimates) != shape[0] * shape[1] or list(estimates["query"][:shape[1]]) != queries:
        raise InvalidInput(f"{release_dir}: estimates.csv does not hold {shape[0]} slices x {queries}")
    main = estimates["capped_estimate"].to_numpy(dtype=np.float64).reshape(shape)
    main_variance = estimates["capped_std_error"].to_numpy(dtype=np.float64).reshape(shape) ** 2
    exploration = None if facts.get("exploration") is None else Exploration.from_json(facts["exploration"], release_dir)
    arms = np.zeros((0, shape[1]))
    arms_variance = np.zeros((0, shape[1]))
    if exploration is not None:
        if outputs.EXPLORATION_CSV not in files:
            raise InvalidInput(f"{release_dir}: the release has exploration arms but no {outputs.EXPLORATION_CSV}")
        frame = pd.read_csv(io.BytesIO(files[outputs.EXPLORATION_CSV]))
        arm_shape = (exploration.num_arms, shape[1])
        arms = frame["estimate"].to_numpy(dtype=np.float64).reshape(arm_shape)
        arms_variance = frame["std_error"].to_numpy(dtype=np.float64).reshape(arm_shape) ** 2
    if exploration != params.exploration or int(facts["count_limit"]) != params.count_limit:
        raise InvalidInput(f"{release_dir}: release.json is inconsistent")
    return ReleaseRecord(params.count_limit, exploration, str(facts["retention_checksum"]), domain_keys(domain), main,
                         main_variance, arms, arms_variance, first_party, clip_thresholds(params))


def release_facts(files: Mapping[str, bytes]) -> dict[str, Any]:
    """``release.json`` of a release's checked files."""
    return dict(json.loads(files[outputs.RELEASE_JSON]))


def service_release_record(main_estimate: np.ndarray, main_std_error: np.ndarray, arm_estimates: Sequence[np.ndarray],
                           arm_std_errors: Sequence[np.ndarray], params: Params, domain: KeyDomain,
                           first_party: FirstParty, retention: str) -> ReleaseRecord:
    """An Aggregation Service report, reconstructed (Alg. 4 per main key at C, per arm key at the arm's
    C_a: ``ara.reconstruct.reconstruct_summary_report``), as the tuner sees it."""
    width = domain.num_columns
    arms = np.vstack(list(arm_estimates)) if len(arm_estimates) else np.zeros((0, width))
    arms_variance = np.vstack(list(arm_std_errors)) ** 2 if len(arm_std_errors) else np.zeros((0, width))
    return ReleaseRecord(params.count_limit, params.exploration, retention, domain_keys(domain), main_estimate,
                         main_std_error**2, arms, arms_variance, first_party, clip_thresholds(params))


def clip_thresholds(params: Params) -> tuple[float, ...]:
    """The release's clip threshold per value query (public parameters): the tuner reads each slice's
    value level from its clipped mean against them (``araopt.optimize.heterogeneity``)."""
    return tuple(q.clip_threshold for q in params.queries)


def domain_keys(domain: KeyDomain) -> tuple[tuple[Any, ...], ...]:
    values = domain.slice_values()
    return tuple(tuple(values[c][i] for c in domain.slice_columns) for i in range(domain.num_slices))


def check_not_data_derived(domain: KeyDomain, source: str) -> None:
    """Privacy-safe tuning publishes its domain in the parameter version, and every release with that
    version is made over it: a domain derived from a conversion log (origin ``data``, e.g. a key map
    written by ``export-ara --conversions``) would publish which slices occur in the data. A domain of
    origin ``history`` (a joined version's training slices, e.g. a release's key map over it) is refused
    too: it is learnt from a joined history and does not carry where that history ended, so no release
    over it could be checked (``mechanism.release.check_learnt_window`` would refuse every one)."""
    if domain.origin == DATA:
        raise PrivacyRefusal(f"{source}: the domain was derived from a conversion log (key map origin 'data', e.g. "
                             f"written by export-ara --conversions): privacy-safe tuning takes only a declared domain "
                             f"(a .csv/.json list of the campaigns' slices, or a key map of origin 'declared')")
    if domain.origin == HISTORY:
        raise PrivacyRefusal(f"{source}: the domain is a joined parameter version's training slices (key map origin "
                             f"'history', e.g. a release's key_map.json over such a version): privacy-safe tuning takes "
                             f"only a declared domain (a .csv/.json list of the campaigns' slices, or a key map of "
                             f"origin 'declared')")


@dataclass(frozen=True)
class PrivateTuning:
    """The parameter version and what it was learnt from."""

    version: ParameterVersion
    dates: tuple[str, ...]
    cold_start: bool
    first_party: FirstPartyLog
    last_release: Params | None = None  # the parameters of the last release learnt from (checked: the ledger)


def tuning_window(as_of: str, window_days: int) -> tuple[str, str]:
    """The first and last day of the ``window_days`` days up to ``as_of`` (ISO dates)."""
    return (dt.date.fromisoformat(as_of) - dt.timedelta(days=window_days - 1)).isoformat(), as_of


def tune_on_releases(records: Sequence[ReleaseRecord], dates: Sequence[str], log: FirstPartyLog,
                     domain: KeyDomain, values: Sequence[str], epsilon: float, as_of: str, window_days: int,
                     max_count_limit: int, exploration: Exploration | None = None,
                     last_release: Params | None = None, measurement_start: str | None = None) -> PrivateTuning:
    """Privacy-safe tuning for the release after ``window``'s last day from its releases (``records``,
    of ``dates``) and first-party conversions; with no release, the cold start on the first-party
    conversions of the window. The arm plan is ``exploration`` (configuration), else the default. The
    version carries no clock: the same inputs give the same bytes. ``measurement_start`` (ISO date): the
    measurement's declared start, each record's ``days_since_start`` (a release before it is refused)."""
    check_not_data_derived(domain, "the declared domain")
    records = with_measurement_start(records, dates, measurement_start)
    first, _ = tuning_window(as_of, window_days)
    exploration = exploration if exploration is not None else default_exploration()
    provenance = {"as_of": as_of, "window": [first, as_of], "release_dates": list(dates),
                  "cold_start": not records, "first_party_rows_read": log.rows_read,
                  "first_party_rows_rejected": log.rejected, "first_party_rows_after_as_of": log.after_last_day,
                  "measurement_start": measurement_start_of(records, dates) or measurement_start}
    if not records:
        version = cold_start(log.between(first, as_of), epsilon, domain, values, exploration)
    else:
        version = private_tune(records, epsilon, domain, values, window=window_days,
                               max_count_limit=max_count_limit, exploration=exploration).version
    extra = {**(version.provenance.extra if version.provenance is not None else {}), **provenance}
    version = dataclasses.replace(version, provenance=dataclasses.replace(
        version.provenance or Provenance(), created_at=None, extra=extra))
    return PrivateTuning(version, tuple(dates), not records, log, last_release)


def measurement_start_of(records: Sequence[ReleaseRecord], dates: Sequence[str]) -> str | None:
    """The measurement start ``records`` (of ``dates``) were read with (ISO date; None: none)."""
    return next(iter(_starts(records, dates)), None)


def _starts(records: Sequence[ReleaseRecord], dates: Sequence[str]) -> set[str]:
    """The measurement starts (ISO dates) ``records`` (of ``dates``) say by their days since the start."""
    return {(dt.date.fromisoformat(d) - dt.timedelta(days=r.days_since_start)).isoformat()
            for r, d in zip(records, dates, strict=True) if r.days_since_start is not None}


def with_measurement_start(records: Sequence[ReleaseRecord], dates: Sequence[str],
                           measurement_start: str | None) -> list[ReleaseRecord]:
    """``records`` (of ``dates``) each with its days since the measurement's start: the one declared here,
    else the one their ledger entries recorded (``measure --measurement-start``); None: neither. Two
    starts (the releases' own, or theirs and this one) are refused."""
    declared = _starts(records, dates) | ({measurement_start} if measurement_start is not None else set())
    if len(declared) > 1:
        raise InvalidInput(f"the releases learnt from and --measurement-start give more than one measurement start "
                           f"({', '.join(sorted(declared))}): a measurement has one start")
    if not declared:
        return list(records)
    measurement_start = declared.pop()
    start = dt.date.fromisoformat(measurement_start)
    days = [(dt.date.fromisoformat(d) - start).days for d in dates]
    early = [d for d, n in zip(dates, days, strict=True) if n < 0]
    if early:
        raise InvalidInput(f"the release of {early[0]} is before --measurement-start {measurement_start}: a release "
                           f"cannot precede the measurement's start")
    return [dataclasses.replace(r, days_since_start=n) for r, n in zip(records, days, strict=True)]


def describe(tuning: PrivateTuning) -> str:
    """One line on what the version was learnt from."""
    params = tuning.version.params
    arms = params.exploration.total_share if params.exploration is not None else 0.0
    learnt = ("the cold start (no release yet)" if tuning.cold_start else
              f"{len(tuning.dates)} release(s) {tuning.dates[0]}..{tuning.dates[-1]}")
    refused = sum(tuning.first_party.rejected.values())
    later = tuning.first_party.after_last_day
    return (f"privacy-safe: learnt from {learnt} and {tuning.first_party.rows_read - refused - later:,} first-party "
            f"conversions ({refused:,} refused: {tuning.first_party.rejected or 'none'}"
            + (f"; {later:,} after the as-of date, not read" if later else "") + f"); C = {params.count_limit}, "
            + ", ".join(f"{q.column} clipped at {q.clip_threshold:.4g}" for q in params.queries)
            + f"; {arms:.1%} of impressions in exploration arms"
            + (f"; {check}" if (check := _model_check(tuning)) else "")
            + (f"; {note}" if (note := without_signal_note(recorded_without_signal(tuning.version))) else ""))


def _model_check(tuning: PrivateTuning) -> str:
    """What the tuner's check of its model against the last release said (a fallback says why)."""
    provenance = tuning.version.provenance
    return str(provenance.extra.get("model_check", "")) if provenance is not None else ""
