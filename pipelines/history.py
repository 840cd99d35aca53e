"""Running ``optimize``'s history job to the driver: a history's statistics, tuning and calibration in
one Beam job (``compute_tuned_history``; as the tuning workflow's backend: ``BeamBackend``), and its
statistics alone (``compute_statistics``), both the graph of ``transforms.tuning.build_history``. Both
validate every row the same way as ``araopt measure`` (dead letter with a reason, the rejected-share
gate); small logs in memory: ``pipelines.inputs.load_conversions``.
"""
from __future__ import annotations

import os
import pickle
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from araopt.errors import InvalidParameters
from araopt.optimize.workflow import HistoryRun

if TYPE_CHECKING:  # typing only: keep `araopt <command> --help` fast

    from araopt.io.conversions import ValidationCounts
    from araopt.optimize.statistics import StatisticsSpec, SufficientStatistics
    from araopt.version import ParameterVersion
    from transforms.io import InputFiles

    from .runner import TranslatedJob


@dataclass(frozen=True)
class StatisticsRun:
    """The statistics of a history and its row accounting."""

    statistics: SufficientStatistics
    counts: ValidationCounts
    inputs: InputFiles
    dead_letter: str | None = None  # where the rejected rows are (a .parquet file or a pattern of shards)


def _run_to_driver(pipeline_args: Sequence[str], shuffle: str, build: Callable[[Any, str | None], Mapping[str, Any]],
                   job: str = "job", file_suffix: str = "") -> dict[str, Any] | TranslatedJob:
    """Run a Beam job whose ``build(pipeline, shuffle_dir)`` returns singleton PCollections by name,
    and bring their values back to the driver (pickled through the temp location). On a dry run
    (``--dry_run``) the job is only translated: its description is returned instead."""
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    from araopt.io.spill import remove_dir
    from transforms.statistics import SaveElement

    from .runner import make_runner, pipeline_options, run_pipeline, spill_folder

    opts = pipeline_options(list(pipeline_args))
    pipeline = beam.Pipeline(runner=make_runner(opts), options=opts)  # Beam checks its options here
    temp_root = opts.view_as(GoogleCloudOptions).temp_location or tempfile.gettempdir()
    run_dir = FileSystems.join(temp_root, f"araopt-job-{os.getpid()}-{uuid.uuid4().hex}")
    spill = None
    try:
        spill = spill_folder(opts, shuffle)
        shuffle_dir = spill.path
        if "://" not in run_dir:
            os.makedirs(run_dir, mode=0o700, exist_ok=True)
        outputs = build(pipeline, shuffle_dir)
        paths = {name: FileSystems.join(run_dir, f"{name}.pkl") for name in outputs}
        for name, pcoll in outputs.items():
            _ = pcoll | f"Save{name.title()}" >> beam.ParDo(SaveElement(paths[name]))
        translated = run_pipeline(pipeline, opts, job, file_suffix)
        if translated is not None:
            return translated
        values = {}
        for name, path in paths.items():
            with FileSystems.open(path) as fh:
                values[name] = pickle.loads(fh.read())
        return values
    finally:
        if spill is not None:
            spill.remove()
        remove_dir(run_dir)


def _history_job(inputs: InputFiles, spec: StatisticsSpec, pipeline_args: Sequence[str], max_rejected_fraction: float,
                 num_shards: int | None, shuffle: str, dead_letter: str | None, lookback: InputFiles | None, job: str,
                 file_suffix: str, choose: Callable[..., Any] | None = None
                 ) -> tuple[dict[str, Any], str | None] | TranslatedJob:
    """Run ``transforms.tuning.build_history`` to the driver: its values and where the dead letter is (on a
    dry run: the translated job); a history with too many rejected rows is refused after the job
    (``check_rejected_share``)."""
    from araopt.io.conversions import check_rejected_share
    from transforms.io import auto_shards
    from transforms.tuning import build_history

    from .runner import is_local_runner, pipeline_options, worker_writable

    shards = num_shards or auto_shards(inputs, lookback)
    opts = pipeline_options(list(pipeline_args))
    local = is_local_runner(opts)
    dead_letter = worker_writable(opts, dead_letter) if dead_letter else None

    def build(pipeline: Any, shuffle_dir: str | None) -> Mapping[str, Any]:
        return build_history(pipeline, inputs.paths, spec, dead_letter, shards, shuffle_dir, local,
                             lookback.paths if lookback else (), choose, max_rejected_fraction)

    values = _run_to_driver(pipeline_args, shuffle, build, job, file_suffix)
    if not isinstance(values, dict):
        return values
    check_rejected_share(values["counts"], max_rejected_fraction, what="history")
    return values, None if dead_letter is None else dead_letter + (".parquet" if local else "-*.parquet")


def compute_statistics(pattern: str | InputFiles, spec: StatisticsSpec, pipeline_args: Sequence[str] = (),
                       max_rejected_fraction: float = 0.10, num_shards: int | None = None, shuffle: str = "auto",
                       dead_letter: str | None = None, lookback: InputFiles | None = None, job: str = "statistics",
                       file_suffix: str = "") -> StatisticsRun | TranslatedJob:
    """The Beam statistics pipeline (ReadAndValidate, grouped by impression -> the statistics combiner),
    run to completion; the result comes back to the driver (on a dry run: the translated job). Refuses
    bad input before any work and a history with too many rejected rows after (``check_rejected_share``).
    ``lookback``: earlier conversions read only to give the history's conversions their lifetime ranks."""
    from transforms.io import InputFiles, check_input

    inputs = pattern if isinstance(pattern, InputFiles) else check_input(pattern, spec.slice_columns, spec.value_columns)
    ran = _history_job(inputs, spec, pipeline_args, max_rejected_fraction, num_shards, shuffle, dead_letter, lookback,
                       job, file_suffix)
    if not isinstance(ran, tuple):
        return ran
    values, where = ran
    return StatisticsRun(values["statistics"], values["counts"], inputs, where)


@dataclass(frozen=True)
class TunedHistoryRun(HistoryRun["SufficientStatistics", Any, Any]):
    """A history's statistics, what ``choose`` made of them (None when the history was refused: too many
    rejected rows) and one ``CalibrationStatistics`` per candidate version it returned, in its order (the
    workflow's ``HistoryRun``), with the job's row accounting, its inputs and where its dead letter is:
    from one read and one shuffle of the history."""

    counts: ValidationCounts
    inputs: InputFiles
    dead_letter: str | None = None


def compute_tuned_history(inputs: InputFiles, spec: StatisticsSpec,
                          choose: Callable[[SufficientStatistics, ValidationCounts],
                                           tuple[Any, tuple[ParameterVersion, ...]]],
                          pipeline_args: Sequence[str] = (), max_rejected_fraction: float = 0.10,
                          num_shards: int | None = None, shuffle: str = "auto", dead_letter: str | None = None,
                          lookback: InputFiles | None = None, job: str = "history",
                          file_suffix: str = "") -> TunedHistoryRun | TranslatedJob:
    """One Beam job over a history, as ``nightly``'s: read and validate, group by impression once, the
    statistics; ``choose(statistics, counts)`` (a picklable callable, run once in the job) returns its
    result and the candidate parameter versions, calibrated on the same grouped shards. The result comes
    back to the driver (on a dry run: the translated job); a history with too many rejected rows is
    refused after the job (``check_rejected_share``) without being tuned."""

    ran = _history_job(inputs, spec, pipeline_args, max_rejected_fraction, num_shards, shuffle, dead_letter, lookback,
                       job, file_suffix, choose)
    if not isinstance(ran, tuple):
        return ran
    values, where = ran
    return TunedHistoryRun(statistics=values["statistics"], chosen=values["chosen"], calibration=values["calibration"],
                           counts=values["counts"], inputs=inputs, dead_letter=where)


@dataclass(frozen=True)
class BeamBackend:
    """The tuning workflow's Beam backend (``optimize.workflow.TuningBackend``) on a joined history:
    ``compute_tuned_history``'s one job (read, validate, group by impression once; the statistics;
    ``choose(statistics, counts)`` once, behind the rejected-share gate, with the job's row accounting,
    e.g. ``AraTuning.choose``; the candidates calibrated on the same shards), its ``TunedHistoryRun``
    brought back to the driver. A history with too many rejected rows is refused after the job. On a
    dry run (``dry_run``) nothing runs: ``translate`` gives the translated job."""

    inputs: InputFiles
    pipeline_args: tuple[str, ...] = ()
    max_rejected_fraction: float = 0.10
    num_shards: int | None = None
    shuffle: str = "auto"
    dead_letter: str | None = None  # where the rejected rows go (without the .parquet suffix)
    lookback: InputFiles | None = None
    job: str = "history"
    file_suffix: str = ""

    @property
    def dry_run(self) -> bool:
        """Whether the pipeline options ask only to translate the job (Beam's ``--dry_run``)."""
        from .runner import is_dry_run, pipeline_options

        return is_dry_run(pipeline_options(list(self.pipeline_args)))

    def _run(self, spec: StatisticsSpec, choose: Callable[..., tuple[Any, tuple[ParameterVersion, ...]]]
             ) -> TunedHistoryRun | TranslatedJob:
        return compute_tuned_history(self.inputs, spec, choose, self.pipeline_args, self.max_rejected_fraction,
                                     self.num_shards, self.shuffle, self.dead_letter, self.lookback, self.job,
                                     self.file_suffix)

    def statistics_and_calibration(self, spec: StatisticsSpec,
                                   choose: Callable[..., tuple[Any, tuple[ParameterVersion, ...]]]) -> TunedHistoryRun:
        run = self._run(spec, choose)
        if not isinstance(run, TunedHistoryRun):
            raise InvalidParameters("--dry_run translates the history job without running it: nothing to tune "
                                    "(BeamBackend.translate)")
        return run

    def translate(self, spec: StatisticsSpec, choose: Callable[..., tuple[Any, tuple[ParameterVersion, ...]]]
                  ) -> TranslatedJob:
        """The job ``statistics_and_calibration`` would run, translated for its runner (``--dry_run``)."""
        from .runner import TranslatedJob

        job = self._run(spec, choose)
        if not isinstance(job, TranslatedJob):
            raise InvalidParameters("the history job ran: translating it needs --dry_run")
        return job
