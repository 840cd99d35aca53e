"""The inputs of privacy-safe tuning (``araopt optimize --private``, ``araopt nightly --private``) and the
tuning itself (``araopt.optimize.private``): past releases, first-party conversions, the declared domain.

    RELEASES/date=YYYY-MM-DD/release/   measure's publishable folder of that day's release (secure noise), or
    RELEASES/date=YYYY-MM-DD/summary_report*.avro + params.json   an Aggregation Service job's report and
                                        the parameter version its registrations were exported from
    FIRST_PARTY/...                     Parquet: conversion_time, the value columns, conversion-side slices;
                                        never impression_id nor an impression-side slice (a joined log)

Only release/ files are read (never private/, never a simulation/ folder): the release's manifest is
checked (every file's sha256), its release.json gives the public parameters it was made with, its
estimates.csv and exploration.csv the noised capped estimates. Every release must be over the declared
domain (same layout checksum).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from araopt.errors import InvalidInput, InvalidParameters, PrivacyRefusal
from araopt.io import outputs
from araopt.io.conversions import IMPRESSION_ID, time_as_micros
from araopt.mechanism.exploration import Exploration, default_exploration
from araopt.mechanism.keys import DATA, KeyDomain
from araopt.mechanism.params import Params
from araopt.optimize.private import DAY_US, FirstParty, ReleaseRecord, cold_start, private_tune
from araopt.version import ParameterVersion, Provenance

from .partitions import partition_day
from .verified_releases import ReleaseVerifier, release_parameters

DATE_COMPONENT = re.compile(r"(?:^|/)date=[^/]*/?$")
"""A release folder: ROOT/date=<day>/ (its day read by ``partitions.partition_day``, malformed ones refused)."""


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


def read_first_party(pattern: str, values: Sequence[str], domain: KeyDomain, last_day: str | None = None
                     ) -> FirstPartyLog:
    """Every Parquet file under ``pattern``; a joined log (impression_id or an impression-side slice
    column) is refused; rows with a missing time or a missing, negative or non-finite value are
    refused and counted; with ``last_day`` (the as-of date) rows of later days are counted and left
    out, so a backtest never sees its future (rows read = rows used + refused + after the last day)."""
    from transforms.io import match_files

    paths = match_files(pattern)
    if not paths:
        raise InvalidInput(f"--first-party {pattern!r}: no Parquet files found")
    impression_side = [c for c in domain.slice_columns if c not in domain.conversion_slice_columns]
    days, vals, read, rejected = [], [], 0, {"missing_time": 0, "invalid_value": 0}
    after = 0
    cut = None if last_day is None else int(np.datetime64(last_day, "D").astype(np.int64))
    for path in paths:
        with FileSystems.open(path) as fh:
            table = pq.read_table(fh)
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


def _read(path: str, what: str) -> bytes:
    try:
        with FileSystems.open(path) as fh:
            return bytes(fh.read())
    except Exception as exc:  # noqa: BLE001 - any read failure is one line
        raise InvalidInput(f"cannot read {what} {path}: {exc}") from None


def read_release(folder: str, day: str, domain: KeyDomain, first_party: FirstParty,
                 verifier: ReleaseVerifier) -> tuple[ReleaseRecord, Params]:
    """One release folder as the privacy-safe tuner sees it, checked against the ledger and the store
    (``verifier``), and the public parameters it was made with: araopt's (``folder``/release/) or an
    Aggregation Service job's (``folder``/summary_report*.avro with the ``params.json`` its
    registrations were exported from)."""
    if FileSystems.match([FileSystems.join(folder, "summary_report*.avro")])[0].metadata_list:
        return read_aggregation_service_release(folder, domain, first_party, verifier)
    release_dir = FileSystems.join(folder, outputs.RELEASE_DIR)
    manifest = json.loads(_read(FileSystems.join(release_dir, outputs.MANIFEST), "release manifest"))
    listed = {entry["path"]: entry for entry in manifest.get("files", [])}
    files: dict[str, bytes] = {}
    for name in (outputs.RELEASE_JSON, outputs.ESTIMATES_CSV, outputs.EXPLORATION_CSV):
        entry = listed.get(f"{outputs.RELEASE_DIR}/{name}") or listed.get(name)
        if entry is None:
            if name == outputs.EXPLORATION_CSV:
                continue
            raise InvalidInput(f"{release_dir}: the manifest lists no {name}")
        data = _read(FileSystems.join(release_dir, name), "release file")
        if outputs.sha256_hex(data) != entry.get("sha256"):
            raise InvalidInput(f"{release_dir}/{name}: its sha256 differs from the manifest's (a changed or partial "
                               f"release)")
        files[name] = data
    facts = json.loads(files[outputs.RELEASE_JSON])
    if facts.get("simulation") or not facts.get("differentially_private"):
        raise PrivacyRefusal(f"{release_dir}: not a differentially private release (a simulation): privacy-safe tuning "
                             f"reads only releases made with secure noise")
    verifier.check_release(folder, day, files, facts, manifest)
    if facts.get("domain_layout_sha256") != domain.layout_checksum():
        raise InvalidInput(f"{release_dir}: released over another domain than the declared one (layout checksum "
                           f"differs): privacy-safe tuning needs every release over the declared domain")
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
    params = release_parameters(facts, domain, release_dir)
    if exploration != params.exploration or int(facts["count_limit"]) != params.count_limit:
        raise InvalidInput(f"{release_dir}: release.json is inconsistent")
    return (ReleaseRecord(params.count_limit, exploration, str(facts["retention_checksum"]), domain_keys(domain), main,
                          main_variance, arms, arms_variance, first_party, clip_thresholds(params)), params)


def read_aggregation_service_release(folder: str, domain: KeyDomain, first_party: FirstParty,
                                     verifier: ReleaseVerifier) -> tuple[ReleaseRecord, Params]:
    """An Aggregation Service summary report (Avro, noised by the service) over the declared domain and
    the exploration arms' keys, read with the parameter version its registrations came from, through
    ``araopt reconstruct``'s mapper (``ara.reconstruct.reconstruct_summary_report``: Alg. 4 per main key
    at C, per arm key at the arm's C_a). Tuning needs every bucket of the output domain: a report with
    an unknown, missing or inexact bucket is refused (the service leaves out no bucket of the output
    domain it is given)."""
    from araopt.ara.reconstruct import reconstruct_summary_report
    from araopt.calibration import retention_checksum
    from araopt.io import avro

    raw = _read(FileSystems.join(folder, "params.json"), "parameter file")
    verifier.check_service_release(folder, outputs.sha256_hex(raw))
    params = ParameterVersion.from_bytes(raw, f"{folder}/params.json").params
    buckets, metrics = avro.read_summary_report(FileSystems.join(folder, "summary_report*.avro"))
    report = reconstruct_summary_report(buckets, metrics, params, domain)
    if not report.complete:
        c = report.counters
        example = f" (e.g. 0x{c.unknown[0][0]:x})" if c.unknown else ""
        raise InvalidInput(f"{folder}: the summary report is not over the declared domain and arms: "
                           f"{c.unknown_buckets} bucket(s) outside it{example}, {c.missing_buckets} missing, "
                           f"{c.huge_metrics} beyond ±2^53 (privacy-safe tuning needs every bucket)")
    width = domain.num_columns
    arms = np.vstack([e.estimate for e in report.arms]) if report.arms else np.zeros((0, width))
    arms_variance = np.vstack([e.std_error for e in report.arms]) ** 2 if report.arms else np.zeros((0, width))
    return (ReleaseRecord(params.count_limit, params.exploration, retention_checksum(params), domain_keys(domain),
                          report.main.estimate, report.main.std_error**2, arms, arms_variance, first_party,
                          clip_thresholds(params)), params)


def clip_thresholds(params: Params) -> tuple[float, ...]:
    """The release's clip threshold per value query (public parameters): the tuner reads each slice's
    value level from its clipped mean against them (``araopt.optimize.heterogeneity``)."""
    return tuple(q.clip_threshold for q in params.queries)


def domain_keys(domain: KeyDomain) -> tuple[tuple, ...]:
    values = domain.slice_values()
    return tuple(tuple(values[c][i] for c in domain.slice_columns) for i in range(domain.num_slices))


def release_folders(root: str, first: str, last: str) -> list[tuple[str, str]]:
    """(date, folder) of every ``root``/date=YYYY-MM-DD/ with first <= date <= last that holds a
    release manifest, by date."""
    patterns = [(FileSystems.join(root, "date=*", outputs.RELEASE_DIR, outputs.MANIFEST), 2),
                (FileSystems.join(root, "date=*", "summary_report*.avro"), 1)]
    found = set()
    for pattern, depth in patterns:
        for match in FileSystems.match([pattern])[0].metadata_list:
            folder = match.path.rsplit("/", depth)[0]
            day = partition_day(folder + "/") if DATE_COMPONENT.search(folder) else None
            if day is not None and first <= day <= last:
                found.add((day, folder))
    dates = [d for d, _ in found]
    twice = sorted({d for d in dates if dates.count(d) > 1})
    if twice:
        raise InvalidInput(f"{root}: more than one release for {twice}")
    return sorted(found)


@dataclass(frozen=True)
class PrivateTuning:
    """The parameter version and what it was learnt from."""

    version: ParameterVersion
    dates: tuple[str, ...]
    cold_start: bool
    first_party: FirstPartyLog
    last_release: Params | None = None  # the parameters of the last release learnt from (checked: the ledger)


def tune_privately(releases_root: str, first_party_pattern: str, domain: KeyDomain, values: Sequence[str],
                   epsilon: float, as_of: str, window_days: int, max_count_limit: int, verifier: ReleaseVerifier,
                   exploration: Exploration | None = None) -> PrivateTuning:
    """Privacy-safe tuning for the release after ``as_of`` from the releases of the ``window_days``
    days up to ``as_of`` (each checked by ``verifier`` against the ledger and the store) and the
    first-party conversions of those days; with no release yet, the cold start on the first-party
    conversions of the window. The arm plan is ``exploration`` (configuration: the previous published
    version's, or an explicit option), else the default; never what a release folder says."""
    check_not_data_derived(domain, "the declared domain")
    first = (dt.date.fromisoformat(as_of) - dt.timedelta(days=window_days - 1)).isoformat()
    log = read_first_party(first_party_pattern, values, domain, last_day=as_of)
    folders = release_folders(releases_root, first, as_of)
    read = [read_release(folder, date, domain, log.of_day(date), verifier) for date, folder in folders]
    records = [record for record, _ in read]
    last = read[-1][1] if read else None
    exploration = exploration if exploration is not None else default_exploration()
    provenance = {"as_of": as_of, "window": [first, as_of], "release_dates": [d for d, _ in folders],
                  "cold_start": not records, "first_party_rows_read": log.rows_read,
                  "first_party_rows_rejected": log.rejected, "first_party_rows_after_as_of": log.after_last_day}
    if not records:
        print(f"araopt: no release in {first}..{as_of} under {releases_root}: the cold start (L-inf, clips at the "
              f"first-party values' 95% quantile, exploration arms on)", file=sys.stderr)
        version = cold_start(log.between(first, as_of), epsilon, domain, values, exploration)
    else:
        version = private_tune(records, epsilon, domain, values, window=window_days, max_count_limit=max_count_limit,
                               exploration=exploration).version
    extra = {**(version.provenance.extra if version.provenance is not None else {}), **provenance}
    # no clock in the file: the same inputs give the same bytes
    version = dataclasses.replace(version, provenance=dataclasses.replace(
        version.provenance or Provenance(), created_at=None, extra=extra))
    return PrivateTuning(version, tuple(d for d, _ in folders), not records, log, last)


def check_mode(args: object) -> bool:
    """True for privacy-safe tuning (``--private``, whose inputs must all be given and which takes no
    joined log), False for tuning on a joined ``--history``."""
    private = bool(getattr(args, "private", False))
    if not private:
        if getattr(args, "releases", None) or getattr(args, "first_party", None):
            raise InvalidParameters("--releases and --first-party are inputs of privacy-safe tuning: add --private")
        if not getattr(args, "history", None):
            raise InvalidParameters("give --history (tuning on a joined log) or --private with --releases, --first-party "
                                    "and --domain (privacy-safe tuning)")
        return False
    joined = [flag for flag, name in (("--history", "history"), ("--lookback", "lookback")) if getattr(args, name, None)]
    if joined:
        raise PrivacyRefusal(f"--private reads no joined impression->conversion log: drop {' and '.join(joined)}")
    missing = [flag for flag, name in (("--releases", "releases"), ("--first-party", "first_party"),
                                       ("--domain", "domain")) if not getattr(args, name, None)]
    if missing:
        raise InvalidParameters(f"--private needs {', '.join(missing)}")
    return True


def load_declared_domain(path: str, slices: Sequence[str], values: Sequence[str],
                         conversion_slice_columns: Sequence[str] = ()) -> KeyDomain:
    """The declared domain file of privacy-safe tuning (never derived from conversions)."""
    from .inputs import read_domain

    domain = read_domain(path, slices, tuple(values), None, False, conversion_slice_columns)
    check_not_data_derived(domain, f"--domain {path}")
    if tuple(domain.slice_columns) != tuple(slices):
        raise InvalidParameters(f"--domain {path}: slices {list(domain.slice_columns)}, --slices says {list(slices)}")
    return domain


def check_not_data_derived(domain: KeyDomain, source: str) -> None:
    """Privacy-safe tuning publishes its domain in the parameter version, and every release with that
    version is made over it: a domain derived from a conversion log (origin ``data``, e.g. a key map
    written by ``export-ara --conversions``) would publish which slices occur in the data."""
    if domain.origin == DATA:
        raise PrivacyRefusal(f"{source}: the domain was derived from a conversion log (key map origin 'data', e.g. "
                             f"written by export-ara --conversions): privacy-safe tuning takes only a declared domain "
                             f"(a .csv/.json list of the campaigns' slices, or a key map of origin 'declared' or "
                             f"'history')")


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
            + (f"; {check}" if (check := _model_check(tuning)) else ""))


def _model_check(tuning: PrivateTuning) -> str:
    """What the tuner's check of its model against the last release said (a fallback says why)."""
    provenance = tuning.version.provenance
    return str(provenance.extra.get("model_check", "")) if provenance is not None else ""
