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

from araopt.io import outputs
from araopt.io.conversions import IMPRESSION_ID, time_as_micros
from araopt.mechanism.exploration import Exploration
from araopt.mechanism.keys import KeyDomain
from araopt.optimize.private import DAY_US, FirstParty, ReleaseRecord, cold_start, private_tune
from araopt.version import ParameterVersion, Provenance

from .options import UserError

DATE_FOLDER = re.compile(r"date=(\d{4}-\d{2}-\d{2})/?$")


@dataclass(frozen=True)
class FirstPartyLog:
    """The advertiser's conversions without the impression join: per conversion its UTC day and values,
    and how many rows were read and refused (with their reasons)."""

    day: np.ndarray
    values: np.ndarray
    rows_read: int
    rejected: dict[str, int]

    def of_day(self, day: str) -> FirstParty:
        number = int(np.datetime64(day, "D").astype(np.int64))
        return FirstParty.of(day, self.values[self.day == number])

    def between(self, first: str, last: str) -> FirstParty:
        lo, hi = (int(np.datetime64(d, "D").astype(np.int64)) for d in (first, last))
        return FirstParty.of(last, self.values[(self.day >= lo) & (self.day <= hi)])


def read_first_party(pattern: str, values: Sequence[str], domain: KeyDomain) -> FirstPartyLog:
    """Every Parquet file under ``pattern``; a joined log (impression_id or an impression-side slice
    column) is refused; rows with a missing time or a missing, negative or non-finite value are
    refused and counted (rows read = rows used + rows refused)."""
    from transforms.io import match_files

    paths = match_files(pattern)
    if not paths:
        raise UserError(f"--first-party {pattern!r}: no Parquet files found")
    impression_side = [c for c in domain.slice_columns if c not in domain.conversion_slice_columns]
    days, vals, read, rejected = [], [], 0, {"missing_time": 0, "invalid_value": 0}
    for path in paths:
        with FileSystems.open(path) as fh:
            table = pq.read_table(fh)
        joined = [c for c in (IMPRESSION_ID, *impression_side) if c in table.column_names]
        if joined:
            raise UserError(f"--first-party {path}: has column(s) {joined}: that is a joined impression->conversion "
                            f"log, which privacy-safe tuning never reads (give conversions with their time, values "
                            f"and conversion-side slices only)")
        missing = [c for c in ("conversion_time", *values) if c not in table.column_names]
        if missing:
            raise UserError(f"--first-party {path}: missing column(s) {missing}")
        read += table.num_rows
        micros, valid_time, _ = time_as_micros(table.column("conversion_time"))
        columns = [pc.cast(table.column(c), pa.float64()).to_numpy(zero_copy_only=False) for c in values]
        matrix = np.column_stack(columns) if columns else np.zeros((table.num_rows, 0))
        good_value = np.isfinite(matrix).all(axis=1) & (matrix >= 0).all(axis=1)
        rejected["missing_time"] += int((~valid_time).sum())
        rejected["invalid_value"] += int((valid_time & ~good_value).sum())
        keep = valid_time & good_value
        days.append(np.floor_divide(micros[keep], DAY_US))
        vals.append(matrix[keep])
    return FirstPartyLog(np.concatenate(days).astype(np.int64), np.concatenate(vals), read,
                         {k: v for k, v in rejected.items() if v})


def _read(path: str, what: str) -> bytes:
    try:
        with FileSystems.open(path) as fh:
            return bytes(fh.read())
    except Exception as exc:  # noqa: BLE001 - any read failure is one line
        raise UserError(f"cannot read {what} {path}: {exc}") from None


def read_release(folder: str, domain: KeyDomain, first_party: FirstParty) -> ReleaseRecord:
    """One release folder as the privacy-safe tuner sees it: araopt's (``folder``/release/) or an
    Aggregation Service job's (``folder``/summary_report*.avro with the ``params.json`` its
    registrations were exported from)."""
    if FileSystems.match([FileSystems.join(folder, "summary_report*.avro")])[0].metadata_list:
        return read_aggregation_service_release(folder, domain, first_party)
    release_dir = FileSystems.join(folder, outputs.RELEASE_DIR)
    manifest = json.loads(_read(FileSystems.join(release_dir, outputs.MANIFEST), "release manifest"))
    listed = {entry["path"]: entry for entry in manifest.get("files", [])}
    files: dict[str, bytes] = {}
    for name in (outputs.RELEASE_JSON, outputs.ESTIMATES_CSV, outputs.EXPLORATION_CSV):
        entry = listed.get(f"{outputs.RELEASE_DIR}/{name}") or listed.get(name)
        if entry is None:
            if name == outputs.EXPLORATION_CSV:
                continue
            raise UserError(f"{release_dir}: the manifest lists no {name}")
        data = _read(FileSystems.join(release_dir, name), "release file")
        if outputs.sha256_hex(data) != entry.get("sha256"):
            raise UserError(f"{release_dir}/{name}: its sha256 differs from the manifest's (a changed or partial "
                            f"release)")
        files[name] = data
    facts = json.loads(files[outputs.RELEASE_JSON])
    if facts.get("simulation") or not facts.get("differentially_private"):
        raise UserError(f"{release_dir}: not a differentially private release (a simulation): privacy-safe tuning "
                        f"reads only releases made with secure noise")
    if facts.get("domain_layout_sha256") != domain.layout_checksum():
        raise UserError(f"{release_dir}: released over another domain than the declared one (layout checksum "
                        f"differs): privacy-safe tuning needs every release over the declared domain")
    estimates = pd.read_csv(io.BytesIO(files[outputs.ESTIMATES_CSV]))
    queries = ["count", *[q["column"] for q in facts["queries"]]]
    shape = (domain.num_slices, len(queries))
    if len(estimates) != shape[0] * shape[1] or list(estimates["query"][:shape[1]]) != queries:
        raise UserError(f"{release_dir}: estimates.csv does not hold {shape[0]} slices x {queries}")
    main = estimates["capped_estimate"].to_numpy(dtype=np.float64).reshape(shape)
    main_variance = estimates["capped_std_error"].to_numpy(dtype=np.float64).reshape(shape) ** 2
    exploration = None if facts.get("exploration") is None else Exploration.from_json(facts["exploration"], release_dir)
    arms = np.zeros((0, shape[1]))
    arms_variance = np.zeros((0, shape[1]))
    if exploration is not None:
        if outputs.EXPLORATION_CSV not in files:
            raise UserError(f"{release_dir}: the release has exploration arms but no {outputs.EXPLORATION_CSV}")
        frame = pd.read_csv(io.BytesIO(files[outputs.EXPLORATION_CSV]))
        arm_shape = (exploration.num_arms, shape[1])
        arms = frame["estimate"].to_numpy(dtype=np.float64).reshape(arm_shape)
        arms_variance = frame["std_error"].to_numpy(dtype=np.float64).reshape(arm_shape) ** 2
    return ReleaseRecord(int(facts["count_limit"]), exploration, str(facts["retention_checksum"]),
                         domain_keys(domain), main, main_variance, arms, arms_variance, first_party)


def read_aggregation_service_release(folder: str, domain: KeyDomain, first_party: FirstParty) -> ReleaseRecord:
    """An Aggregation Service summary report (Avro, noised by the service) over the declared domain and
    the exploration arms' keys, read with the parameter version its registrations came from: Alg. 4
    per main key at C, per arm key at the arm's C_a. A bucket outside the layout is refused; a missing
    bucket counts as 0 (the service leaves out no domain bucket when given the output domain)."""
    from araopt.calibration import retention_checksum
    from araopt.io import avro
    from araopt.mechanism.report import reconstruct
    from araopt.publication import histogram_buckets

    version = ParameterVersion.from_bytes(_read(FileSystems.join(folder, "params.json"), "parameter file"),
                                          f"{folder}/params.json")
    params = version.params
    buckets, metrics = avro.read_summary_report(FileSystems.join(folder, "summary_report*.avro"))
    layout = histogram_buckets(params, domain)
    index = {b: i for i, b in enumerate(layout)}
    unknown = [b for b in buckets if b not in index]
    if unknown:
        raise UserError(f"{folder}: {len(unknown)} bucket(s) of the summary report are not in the declared domain "
                        f"and arms (e.g. 0x{unknown[0]:x})")
    flat = np.zeros(len(layout))
    flat[[index[b] for b in buckets]] = metrics
    width, m = domain.num_columns, domain.num_slices
    noisy = flat.reshape(-1, width)
    main = reconstruct(noisy[:m], params)
    exploration = params.exploration
    arms = np.zeros((0, width))
    arms_variance = np.zeros((0, width))
    if exploration is not None:
        arm_estimates = [reconstruct(noisy[m + a:m + a + 1], params.for_arm(a)) for a in range(exploration.num_arms)]
        arms = np.vstack([e.estimate for e in arm_estimates])
        arms_variance = np.vstack([e.std_error for e in arm_estimates]) ** 2
    return ReleaseRecord(params.count_limit, exploration, retention_checksum(params), domain_keys(domain),
                         main.estimate, main.std_error**2, arms, arms_variance, first_party)


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
            m = DATE_FOLDER.search(folder)
            if m and first <= m.group(1) <= last:
                found.add((m.group(1), folder))
    dates = [d for d, _ in found]
    twice = sorted({d for d in dates if dates.count(d) > 1})
    if twice:
        raise UserError(f"{root}: more than one release for {twice}")
    return sorted(found)


@dataclass(frozen=True)
class PrivateTuning:
    """The parameter version and what it was learnt from."""

    version: ParameterVersion
    dates: tuple[str, ...]
    cold_start: bool
    first_party: FirstPartyLog


def tune_privately(releases_root: str, first_party_pattern: str, domain: KeyDomain, values: Sequence[str],
                   epsilon: float, as_of: str, window_days: int, max_count_limit: int,
                   exploration: Exploration | None = None) -> PrivateTuning:
    """Privacy-safe tuning for the release after ``as_of`` from the releases of the ``window_days``
    days up to ``as_of`` and the first-party conversions of those days; with no release yet, the
    cold start on the first-party conversions of the window."""
    first = (dt.date.fromisoformat(as_of) - dt.timedelta(days=window_days - 1)).isoformat()
    log = read_first_party(first_party_pattern, values, domain)
    folders = release_folders(releases_root, first, as_of)
    records = [read_release(folder, domain, log.of_day(date)) for date, folder in folders]
    provenance = {"as_of": as_of, "window": [first, as_of], "release_dates": [d for d, _ in folders],
                  "first_party_rows_read": log.rows_read, "first_party_rows_rejected": log.rejected}
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
    return PrivateTuning(version, tuple(d for d, _ in folders), not records, log)


def check_mode(args: object) -> bool:
    """True for privacy-safe tuning (``--private``, whose inputs must all be given and which takes no
    joined log), False for tuning on a joined ``--history``."""
    private = bool(getattr(args, "private", False))
    if not private:
        if getattr(args, "releases", None) or getattr(args, "first_party", None):
            raise UserError("--releases and --first-party are inputs of privacy-safe tuning: add --private")
        if not getattr(args, "history", None):
            raise UserError("give --history (tuning on a joined log) or --private with --releases, --first-party "
                            "and --domain (privacy-safe tuning)")
        return False
    joined = [flag for flag, name in (("--history", "history"), ("--lookback", "lookback")) if getattr(args, name, None)]
    if joined:
        raise UserError(f"--private reads no joined impression->conversion log: drop {' and '.join(joined)}")
    missing = [flag for flag, name in (("--releases", "releases"), ("--first-party", "first_party"),
                                       ("--domain", "domain")) if not getattr(args, name, None)]
    if missing:
        raise UserError(f"--private needs {', '.join(missing)}")
    return True


def load_declared_domain(path: str, slices: Sequence[str], values: Sequence[str],
                         conversion_slice_columns: Sequence[str] = ()) -> KeyDomain:
    """The declared domain file of privacy-safe tuning (never derived from conversions)."""
    from .measure import read_domain

    domain = read_domain(path, slices, tuple(values), None, False, conversion_slice_columns)
    if tuple(domain.slice_columns) != tuple(slices):
        raise UserError(f"--domain {path}: slices {list(domain.slice_columns)}, --slices says {list(slices)}")
    return domain


def describe(tuning: PrivateTuning) -> str:
    """One line on what the version was learnt from."""
    params = tuning.version.params
    arms = params.exploration.total_share if params.exploration is not None else 0.0
    learnt = ("the cold start (no release yet)" if tuning.cold_start else
              f"{len(tuning.dates)} release(s) {tuning.dates[0]}..{tuning.dates[-1]}")
    refused = sum(tuning.first_party.rejected.values())
    return (f"privacy-safe: learnt from {learnt} and {tuning.first_party.rows_read - refused:,} first-party "
            f"conversions ({refused:,} refused: {tuning.first_party.rejected or 'none'}); C = {params.count_limit}, "
            + ", ".join(f"{q.column} clipped at {q.clip_threshold:.4g}" for q in params.queries)
            + f"; {arms:.1%} of impressions in exploration arms")
