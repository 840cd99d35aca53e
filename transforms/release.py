"""Writing a release under a run folder (local or gs://; the driver stages it and moves it into place):
the Aggregation Service Avro files (Beam's WriteToAvro, fastavro), the key map and the estimates in
the release folder; the debug report (``--debug-run``) in the operator-private folder. File names and
visibility come from ``araopt.io.outputs``, what each file says from ``araopt.publication``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from araopt.attribution.calibrate import Retention
from araopt.attribution.release import AttributionRelease
from araopt.errors import PrivacyRefusal
from araopt.io import avro, jsonio, outputs
from araopt.publication import (
    Publication,
    attribution_release_files,
    debug_records,
    domain_records,
    exploration_frame,
    private_accounting,
    release_json,
    summary_records,
)


def check_simulation_label(publication: Publication, simulation: bool) -> Publication:
    """A seeded release goes only into a simulation folder (``SIMULATION-`` names), and a simulation
    folder holds only seeded releases: seeded noise is not private, and a reader must not mistake one
    for the other. A release noised by a caller's generator (neither secure nor seeded) goes into neither."""
    seeded = publication.release.simulation_seed is not None
    if not seeded and not publication.release.secure_noise:
        raise PrivacyRefusal("this release was noised by a caller's generator (rng / noise_rng, for tests): neither "
                             "secure noise (a release) nor a simulation seed (a simulation); it is written as neither")
    if seeded != simulation:
        raise PrivacyRefusal("a release noised with a simulation seed is written only as a simulation (simulation="
                             "True)" if seeded else "a simulation folder holds only releases noised with a "
                             "simulation seed; this one has secure noise")
    return publication


def check_one_publication(count: int) -> None:
    """A release folder holds one release: two publications flattened into one writer would write every
    key twice, each noised on its own (their average halves the noise)."""
    if count != 1:
        raise PrivacyRefusal(f"WriteRelease writes exactly one release, got {count} publications (a graph that "
                             f"flattens or re-noises sums releases every key more than once)")


class _WriteSmallFiles(beam.DoFn):
    """Key map (JSON + CSV), estimates (Parquet + CSV) and release.json into the release folder."""

    def __init__(self, output: str, params_sha256: str, simulation: bool):
        self._output = output
        self._sha = params_sha256
        self._simulation = simulation

    def _put(self, name: str, data: bytes) -> None:
        with FileSystems.create(FileSystems.join(self._output, outputs.release_file(name, self._simulation))) as fh:
            fh.write(data)

    def process(self, publication: Publication, count: int) -> Iterator[str]:
        check_one_publication(count)
        check_simulation_label(publication, self._simulation)
        domain = publication.domain
        self._put(outputs.KEY_MAP_JSON, jsonio.dumps(domain.to_json(self._sha), indent=1).encode())
        self._put(outputs.KEY_MAP_CSV, outputs.csv_bytes(domain.key_table()))
        frame = publication.release_frame()
        self._put(outputs.ESTIMATES_PARQUET, outputs.parquet_bytes(frame))
        self._put(outputs.ESTIMATES_CSV, outputs.csv_bytes(frame))
        private_totals = publication.private_true_totals()
        if private_totals is not None:  # a joined history's calibration stays with the operator
            for name, data in ((outputs.TRUE_TOTALS_PARQUET, outputs.parquet_bytes(private_totals)),
                               (outputs.TRUE_TOTALS_CSV, outputs.csv_bytes(private_totals))):
                with FileSystems.create(FileSystems.join(self._output, outputs.private_file(name))) as fh:
                    fh.write(data)
        arms = exploration_frame(publication.release)
        if arms is not None:
            self._put(outputs.EXPLORATION_PARQUET, outputs.parquet_bytes(arms))
            self._put(outputs.EXPLORATION_CSV, outputs.csv_bytes(arms))
        self._put(outputs.RELEASE_JSON, jsonio.dumps(release_json(publication, self._sha), indent=1).encode())
        private = private_accounting(publication)
        with FileSystems.create(FileSystems.join(self._output, outputs.private_file(outputs.ACCOUNTING))) as fh:
            fh.write(jsonio.dumps(private, indent=1).encode())
        yield "done"


@beam.typehints.with_input_types(Publication)
@beam.typehints.with_output_types(str)
class WriteRelease(beam.PTransform):
    """A published release -> files under the run folder ``output`` (the layout: ``araopt.io.outputs``)."""

    def __init__(self, output: str, params_sha256: str, debug_run: bool = False, simulation: bool = False):
        super().__init__()
        self._output = output
        self._sha = params_sha256
        self._debug = debug_run
        self._simulation = simulation

    def _avro(self, pcoll: beam.PCollection[Publication], label: str, fn: Callable[[Any], list[dict[str, Any]]],
              record: str, relative: str, count: beam.pvalue.AsSingleton) -> beam.pvalue.PDone:
        stem = relative[: -len(".avro")]
        simulation = self._simulation

        def records(publication: Publication, n: int) -> list[dict[str, Any]]:
            check_one_publication(n)
            return fn(check_simulation_label(publication, simulation).release)

        return (
            pcoll
            | f"{label}Records" >> beam.FlatMap(records, count)
            | f"Write{label}" >> beam.io.WriteToAvro(
                FileSystems.join(self._output, stem), schema=avro.load_schema(record), num_shards=1,
                shard_name_template="", file_name_suffix=".avro")
        )

    def expand(self, release: beam.PCollection[Publication]) -> beam.PCollection[str]:
        count = beam.pvalue.AsSingleton(release | "CountPublications" >> beam.combiners.Count.Globally())
        self._avro(release, "SummaryReport", summary_records, avro.SUMMARY,
                   outputs.release_file(outputs.SUMMARY_REPORT, self._simulation), count)
        self._avro(release, "OutputDomain", domain_records, avro.DOMAIN,
                   outputs.release_file(outputs.OUTPUT_DOMAIN, self._simulation), count)
        if self._debug:
            self._avro(release, "DebugReport", debug_records, avro.DEBUG, outputs.private_file(outputs.DEBUG_REPORT),
                       count)
        return release | "WriteKeyMapAndEstimates" >> beam.ParDo(
            _WriteSmallFiles(self._output, self._sha, self._simulation), count)


class WriteAttributionRelease(beam.DoFn):
    """A W3C Attribution release -> its files in the staging folder ``staging``: what they hold, their
    names and the rules they are written under are the core's (``araopt.publication.attribution_release_files``)."""

    def __init__(self, staging: str, params_sha256: str, simulation: bool, debug_run: bool,
                 max_rejected_fraction: float, retention: Retention | None = None):
        self._staging, self._sha, self._simulation = staging, params_sha256, simulation
        self._debug, self._max_rejected, self._retention = debug_run, max_rejected_fraction, retention

    def process(self, rel: AttributionRelease) -> Iterator[str]:
        files = attribution_release_files(rel, self._sha, self._simulation, self._debug, self._max_rejected,
                                          self._retention)
        for relative, data in files.items():
            with FileSystems.create(FileSystems.join(self._staging, *relative.split("/"))) as fh:
                fh.write(data)
        yield "done"
