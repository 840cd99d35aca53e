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
import json
import re
import sys
from collections.abc import Sequence

import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from araopt.errors import InvalidInput, InvalidParameters
from araopt.io import outputs
from araopt.io.partitions import DAY_US, partition_day
from araopt.ledger.ledger import MEASUREMENT_START
from araopt.ledger.verify import ReleaseVerifier, release_parameters
from araopt.mechanism.exploration import Exploration
from araopt.mechanism.keys import KeyDomain
from araopt.mechanism.params import Params
from araopt.optimize.private import FirstParty, ReleaseRecord
from araopt.optimize.private_inputs import (
    FirstPartyLog,
    PrivateTuning,
    check_not_data_derived,
    check_release_domain,
    check_secure_release,
    checked_release_files,
    first_party_log,
    refuse_joined_inputs,
    release_facts,
    release_record,
    service_release_record,
    tune_on_releases,
    tuning_window,
)
from araopt.version import ParameterVersion

DATE_COMPONENT = re.compile(r"(?:^|/)date=[^/]*/?$")
"""A release folder: ROOT/date=<day>/ (its day read by ``partitions.partition_day``, malformed ones refused)."""


def read_first_party(pattern: str, values: Sequence[str], domain: KeyDomain, last_day: str | None = None
                     ) -> FirstPartyLog:
    """Every Parquet file under ``pattern``, read (local or ``gs://``) and made a first-party log by
    ``optimize.private_inputs.first_party_log`` (a joined log refused, bad rows counted, rows after
    ``last_day`` left out)."""
    from transforms.io import match_files

    paths = match_files(pattern)
    if not paths:
        raise InvalidInput(f"--first-party {pattern!r}: no Parquet files found")

    def tables():
        for path in paths:
            with FileSystems.open(path) as fh:
                yield path, pq.read_table(fh)

    return first_party_log(list(tables()), values, domain, last_day)


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
    files = checked_release_files(release_dir, manifest,
                                  lambda name: _read(FileSystems.join(release_dir, name), "release file"))
    facts = release_facts(files)
    check_secure_release(release_dir, facts)
    entry = verifier.check_release(folder, day, files, facts, manifest)
    check_release_domain(release_dir, facts, domain)
    params = release_parameters(facts, domain, release_dir)
    record = release_record(release_dir, files, facts, params, domain, first_party)
    if entry.get(MEASUREMENT_START) is not None:  # measure --measurement-start: its days since the start
        days = dt.date.fromisoformat(day).toordinal() - (dt.date(1970, 1, 1).toordinal()
                                                         + int(entry[MEASUREMENT_START]) // DAY_US)
        record = dataclasses.replace(record, days_since_start=days)
    return record, params


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
    return (service_release_record(report.main.estimate, report.main.std_error, [e.estimate for e in report.arms],
                                   [e.std_error for e in report.arms], params, domain, first_party,
                                   retention_checksum(params)), params)


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


def tune_privately(releases_root: str, first_party_pattern: str, domain: KeyDomain, values: Sequence[str],
                   epsilon: float, as_of: str, window_days: int, max_count_limit: int, verifier: ReleaseVerifier,
                   exploration: Exploration | None = None, measurement_start: str | None = None) -> PrivateTuning:
    """Privacy-safe tuning for the release after ``as_of`` (``optimize.private_inputs.tune_on_releases``)
    from the releases of the ``window_days`` days up to ``as_of`` (each checked by ``verifier`` against
    the ledger and the store) and the first-party conversions of those days; with no release yet, the
    cold start on the first-party conversions of the window. The arm plan is ``exploration``
    (configuration: the previous published version's, or an explicit option), else the default; never
    what a release folder says. ``measurement_start`` (ISO date): the measurement's declared start."""
    check_not_data_derived(domain, "the declared domain")
    first, _ = tuning_window(as_of, window_days)
    log = read_first_party(first_party_pattern, values, domain, last_day=as_of)
    folders = release_folders(releases_root, first, as_of)
    read = [read_release(folder, date, domain, log.of_day(date), verifier) for date, folder in folders]
    if not read:
        print(f"araopt: no release in {first}..{as_of} under {releases_root}: the cold start (L-inf, clips at the "
              f"first-party values' 95% quantile, exploration arms on)", file=sys.stderr)
    return tune_on_releases([record for record, _ in read], [d for d, _ in folders], log, domain, values, epsilon,
                            as_of, window_days, max_count_limit, exploration, read[-1][1] if read else None,
                            measurement_start)


def start_of(args: object) -> str | None:
    """``--measurement-start`` as an ISO date (None: not given)."""
    start = getattr(args, "measurement_start", None)
    return None if start is None else start.isoformat()


def check_mode(args: object) -> bool:
    """True for privacy-safe tuning (``--private``, whose inputs must all be given and which takes no
    joined log), False for tuning on a joined ``--history``."""
    private = bool(getattr(args, "private", False))
    if not private:
        if getattr(args, "releases", None) or getattr(args, "first_party", None):
            raise InvalidParameters("--releases and --first-party are inputs of privacy-safe tuning: add --private")
        if getattr(args, "measurement_start", None) is not None:
            raise InvalidParameters("--measurement-start tells privacy-safe tuning how to read its releases: add "
                                    "--private (measure takes it for the lifetime cap)")
        if not getattr(args, "history", None):
            raise InvalidParameters("give --history (tuning on a joined log) or --private with --releases, --first-party "
                                    "and --domain (privacy-safe tuning)")
        return False
    refuse_joined_inputs([flag for flag, name in (("--history", "history"), ("--lookback", "lookback"))
                          if getattr(args, name, None)])
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
