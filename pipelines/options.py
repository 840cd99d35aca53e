"""The one option registry of every ``araopt`` command, and the command-line plumbing (stdlib only,
so ``araopt <command> --help`` imports nothing heavy).

``OPTIONS`` declares every flag once, with its help and default; ``COMMANDS`` says which flags each
command takes (with per-command help or defaults where the meaning narrows), its description and an
example. Parsers are built from them (``build_parser``), and so is the Flex Template metadata of
the two deployable jobs (``TEMPLATE_OPTIONS``, ``python -m deploy.gen_metadata``). A Flex Template
passes parameters as ``--<snake_case_name>=value``; both spellings are accepted.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, NoReturn

from araopt import constants as core  # stdlib only: every default below is the core's
from araopt.errors import one_line

from .values import _date, _positive_float, _positive_int, parse_bool

__all__ = [
    "COMMANDS", "OPTIONS", "OPTIONS_BY_JOB", "TEMPLATE_OPTIONS", "CliOption", "Command", "OneLineParser",
    "add_options", "build_parser", "cli_main", "command_options", "run_command",
]

OptionType = Literal["str", "int", "float", "bool", "positive_int", "positive_float", "date", "list"]

_GCS_ONLY: Final = r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/\S*)?$"
_COLUMNS: Final = r"^[A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)*$"
_POSITIVE_INT: Final = r"^[1-9][0-9]*$"
_NON_NEGATIVE_INT: Final = r"^[0-9]+$"
_POSITIVE_DECIMAL: Final = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$"
_NON_EMPTY: Final = r"^\S+$"
_BOOL: Final = r"^(true|false)$"
_AS_OF: Final = r"^([0-9]{4}-[0-9]{2}-[0-9]{2}|today|yesterday)$"
_DATES: Final = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(\.\.[0-9]{4}-[0-9]{2}-[0-9]{2}|(,[0-9]{4}-[0-9]{2}-[0-9]{2})*)$"

PRESET_NAMES: Final = ("synth-criteo", "synth-real-estate", "synth-travel")
"""The synthetic presets of ``araopt.data.synthetic.PRESETS`` (a test keeps the two in step)."""


@dataclass(frozen=True)
class CliOption:
    """One flag, declared once. ``name`` is the argparse dest and the Flex Template parameter name."""

    name: str
    help: str
    type: OptionType = "str"
    default: Any = None
    required: bool = False
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    aliases: tuple[str, ...] = ()
    label: str | None = None  # Flex Template label
    regex: str | None = None  # checked by the CLI and by Dataflow at template launch
    gcs_only: bool = False  # a path that must be gs:// in a template (the CLI also takes local paths)
    action: str | None = None  # "append" for repeatable options
    nargs: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def template_flag(self) -> str:
        return "--" + self.name

    @property
    def template_regexes(self) -> tuple[str, ...]:
        return (_GCS_ONLY,) if self.gcs_only else ((self.regex,) if self.regex else ())


def _o(*args: Any, **kwargs: Any) -> CliOption:
    return CliOption(*args, **kwargs)


_ALL: Final[tuple[CliOption, ...]] = (
    # ---- inputs and outputs ---------------------------------------------------------------------
    _o("input", "Conversion log (Parquet): a file, a directory (every *.parquet below it) or a glob, local or "
       "gs://; names starting with _ or . are skipped.", required=True, metavar="LOG", label="Conversions",
       regex=_NON_EMPTY, gcs_only=True),
    _o("history", "Conversion history (Parquet): a file, directory or glob, local or gs://; nightly reads its "
       "date=YYYY-MM-DD/ partitions.", required=True, metavar="LOG", label="Conversion history",
       regex=_NON_EMPTY, gcs_only=True),
    _o("params", "Parameter file (.json, local or gs://), a parameter store (its 'latest' version) or "
       "STORE/versions/<version>[/params.json] (read as the store's: its ledger records the release).",
       required=True, metavar="PARAMS", label="Parameters", regex=_NON_EMPTY,
       gcs_only=True),
    _o("output", "Where the results go; an existing result is replaced only with --overwrite.", required=True,
       metavar="PATH", aliases=("--out",), label="Output directory", regex=_NON_EMPTY, gcs_only=True),
    _o("overwrite", "Replace an existing result at --output (the whole result, never a part).", type="bool"),
    _o("slices", "Comma-separated slice columns (the report's slices).", required=True, metavar="COLS",
       label="Slice columns", regex=_COLUMNS),
    _o("values", "Comma-separated value columns (the value queries).", required=True, metavar="COLS",
       label="Value columns", regex=_COLUMNS),
    # ---- privacy and parameters -------------------------------------------------------------------
    _o("epsilon", "Privacy budget epsilon of the Aggregation Service, in [2^-20, 64].", type="float",
       metavar="E", label="Epsilon", regex=_POSITIVE_DECIMAL),
    _o("encoding", "HistogramContribution version: linf (Alg. 3) or l1 (Alg. 6).", default=core.ENCODING,
       choices=("linf", "l1"), metavar="linf|l1", label="Encoding", regex=r"^(linf|l1)$"),
    _o("objective", "What the optimizer minimises: corrected = the predicted error of the TRUE totals, choosing "
       "between the paper's estimator and the one corrected by retention ratios calibrated on the history; exact = "
       "the paper's estimator (Thm. 4.2 with the exact discrete Laplace variance, rounding and floors); relaxed = "
       "the paper's Relaxation 4.5.", default=core.OBJECTIVE, choices=tuple(core.Objective)),
    _o("max_count_limit", "Largest count limit C tried (20: Chrome's limit of aggregatable reports per source).",
       type="positive_int", default=core.MAX_COUNT_LIMIT, metavar="N", label="Max count limit", regex=_POSITIVE_INT),
    _o("tau", "RMSRE_tau thresholds as NAME=VALUE pairs, e.g. count=5,value=200; every query not named keeps "
       "the default rule: count 5, each value query 5 x its median per conversion in the history (Sec. 5.1).",
       metavar="Q=T,..."),
    _o("special_days", "Declared special days (holidays, sales) as YYYY-MM-DD,...: the calibration gives them "
       "their own effect on the retention ratios (beside the day-of-week effects) and a release of such a day "
       "uses it; recorded in the parameter version.", metavar="DATES", label="Special days",
       regex=r"^([0-9]{4}-[0-9]{2}-[0-9]{2})?(,[0-9]{4}-[0-9]{2}-[0-9]{2})*$"),
    _o("special_day_loss_factor", "On a declared special day the calibration's history holds nothing like (or fewer "
       "than three of), what Alg. 1 loses per kept unit may be up to this many times the history's, or as many "
       "times less: the intervals cover that band (a sale's bigger baskets are not visible in its release). "
       "Recorded in the calendar; >= 1.", type="float", default=core.SPECIAL_DAY_LOSS_FACTOR, metavar="K",
       label="Special-day loss factor",
       regex=_POSITIVE_DECIMAL),
    _o("l1_rounding", "Rounding of the L1 encoding written to the file: randomized (unbiased) or floor "
       "(the paper's Alg. 6).", default=core.L1_ROUNDING, choices=("randomized", "floor")),
    _o("api", "The browser API: ara (the Attribution Reporting API) or attribution (W3C Attribution Level 1). "
       "measure / reconstruct: default the parameter version's (a different one is refused); optimize / nightly / "
       "evaluate: default ara; with attribution, --epsilon(s) is the per-site epoch budget.",
       choices=("ara", "attribution"), metavar="ara|attribution", label="API", regex=r"^(ara|attribution)$"),
    _o("simulation_seed", "SIMULATION MODE: seeded, key-deterministic rounding and noise; the output is NOT "
       "private and is marked SIMULATION.", type="int", metavar="SEED"),
    _o("override_epsilon", "Allow an --epsilon different from the parameter file's (recorded).", type="bool",
       label="Override epsilon", regex=_BOOL),
    # ---- measure ------------------------------------------------------------------------------------
    _o("domain", "The declared output domain: a key map JSON (key_map.json from measure or export-ara) or a "
       ".csv/.json file listing slice values; default: the domain the parameter version carries.",
       metavar="FILE", label="Output domain", regex=_NON_EMPTY, gcs_only=True),
    _o("lookback", "Earlier conversions (Parquet: a file, directory or glob, e.g. the 30 days before): they "
       "consume each impression's contribution budget in ContributionCapping (Alg. 1), as the browser caps a "
       "source over its whole life, but are never released or counted. Each costs what the release that used "
       "it spent (its count limit and arm plan, from the ledger; never released: the most a known configuration "
       "or today's would). Without it, conversions of impressions "
       "that converted before the input are capped as if the input held their first conversions.",
       metavar="LOG", label="Lookback", regex=_NON_EMPTY, gcs_only=True),
    _o("release_period", "Days of conversions each release covers (tuning and predictions are for one release "
       "of this length: its noise is the same whatever its length, its volume is not).", type="positive_float",
       default=core.RELEASE_PERIOD_DAYS, metavar="DAYS", label="Release period (days)", regex=_POSITIVE_DECIMAL),
    _o("lookback_days", "Days of partitions before the window read only to rank each impression's conversions "
       "over its whole life (as the browser caps a source); 0 = none.", type="int", default=core.LOOKBACK_DAYS,
       metavar="N",
       label="Lookback (days)", regex=_NON_NEGATIVE_INT),
    _o("debug_run", "Also write the unnoised values and the noise (Aggregation Service debug run) into the "
       "operator-private folder.", type="bool", label="Debug run", regex=_BOOL),
    _o("max_slices", "Refuse a domain with more slices than this.", type="positive_int", default=core.MAX_SLICES,
       metavar="N", label="Max slices", regex=_POSITIVE_INT),
    _o("allow_rerelease", "Release conversions the release ledger says were released before (counted and "
       "recorded).",
       type="bool", label="Allow re-release", regex=_BOOL),
    _o("check_ledgers", "Other release ledgers to check, read only, as URI,... (another parameter store's root, or "
       "a --ledger folder): a release of conversions one of them records as released is warned of on stderr and "
       "counted in the run summary (each store records its releases in its own ledger only).", metavar="URIS",
       label="Other ledgers to check", regex=_NON_EMPTY),
    _o("ledger", "Where releases are recorded when the parameters do not come from a store (a store's releases "
       "are recorded in its own ledger); default $ARAOPT_LEDGER or ~/.local/state/araopt.", metavar="URI",
       label="Release ledger", regex=_NON_EMPTY, gcs_only=True),
    _o("params_version", "Version to resolve in a parameter store.", default="latest", metavar="VERSION"),
    _o("max_rejected_fraction", "Fail before releasing or publishing if more than this share of rows is "
       "invalid (the Aggregation Service's own rule is 10%). The gate is sharp: exactly this share passes, one "
       "more invalid row fails the job, so whether a release happens can flip on one row.", type="float",
       default=core.MAX_REJECTED_FRACTION, metavar="F"),
    _o("num_shards", "Impression shards of the group-by (default: about 250,000 rows per shard, at least 16).",
       type="positive_int", metavar="N"),
    _o("shuffle", "Group-by-impression shuffle: files (spilled Arrow files; the default locally), memory (a "
       "plain GroupByKey; the default on Dataflow), or auto.", default="auto", choices=("auto", "memory", "files")),
    # ---- nightly --------------------------------------------------------------------------------
    _o("as_of", "Last day of history to use, YYYY-MM-DD, or 'yesterday'/'today' (UTC, resolved at launch).",
       required=True, metavar="YYYY-MM-DD", label="As-of date", regex=_AS_OF),
    _o("window_days", "Number of days of history ending at the as-of date.", type="positive_int", required=True,
       metavar="N", label="Window (days)", regex=_POSITIVE_INT),
    _o("store", "Parameter store (a local folder or gs://BUCKET/PREFIX): versions/<as-of>-<run id>/params.json "
       "and the 'latest' pointer.", required=True, metavar="URI", label="Parameter store", regex=_NON_EMPTY,
       gcs_only=True),
    _o("run_id", "Run identifier (default: a fresh random id).", metavar="ID"),
    _o("allow_large_change", "Publish even when the new parameters move more than the change guards allow.",
       type="bool", label="Allow large change", regex=_BOOL),
    _o("max_threshold_change_factor", "Largest allowed factor between a new and the previous clip threshold.",
       type="positive_float", default=core.MAX_THRESHOLD_CHANGE_FACTOR, metavar="F", label="Max threshold change factor",
       regex=_POSITIVE_DECIMAL),
    _o("max_count_limit_change", "Largest allowed change of the count limit.", type="int",
       default=core.MAX_COUNT_LIMIT_CHANGE, metavar="N",
       label="Max count limit change", regex=_NON_NEGATIVE_INT),
    # ---- evaluate -------------------------------------------------------------------------------
    _o("train", "Training log (repeat for several datasets).", required=True, metavar="LOG", action="append"),
    _o("test", "Test log (one per --train).", required=True, metavar="LOG", action="append"),
    _o("name", "A name for the result.", metavar="NAME"),
    _o("epsilons", "Comma-separated epsilons, each in [2^-20, 64].", default=",".join(f"{e:g}" for e in core.EPSILONS),
       metavar="E,..."),
    _o("monte_carlo", "Mechanism runs per (epsilon, method) for an empirical RMSRE_tau beside the prediction; 0 = off.",
       type="int", default=0, metavar="N"),
    _o("seed", "Random seed (simulations and generators only; never used for privacy noise).", type="int",
       default=0, metavar="SEED"),
    _o("methods", "Subset of optimized_linf,optimized_l1,baseline_q95,baseline_q99,corrected (corrected: the "
       "released estimates of the true totals, calibrated on the training log).",
       default="optimized_linf,optimized_l1,baseline_q95,baseline_q99,corrected", metavar="M,..."),
    _o("no_gap", "Skip the generalization gap (tuning on the test log).", type="bool"),
    _o("measurement_start", "The first day the advertiser measured with the API (UTC): the triggers before it "
       "registered no contribution, so ContributionCapping (Alg. 1) costs the lookback's conversions of earlier days "
       "nothing (a release of a conversion before it, by the ledger or this input, is refused). Default: unknown "
       "(such a conversion costs the dearest configuration the ledger knows).", type="date", metavar="YYYY-MM-DD"),
    _o("fresh_start", "Replay: the advertiser starts measuring on the first replayed day, so the conversions before "
       "it cost no budget (default: as the release path costs them when the start is unknown, at any configuration a "
       "method released since, or today's).", type="bool"),
    _o("no_progress", "No progress on stderr (a line per stage of a long job, and the optimizer's bar on a "
       "terminal).", type="bool"),
    # ---- privacy-safe tuning ----------------------------------------------------------------
    _o("private", "Privacy-safe tuning: learn only from past DP releases (--releases), the advertiser's first-party "
       "conversions without the impression join (--first-party) and the declared domain (--domain); a joined log "
       "(--history) is refused.", type="bool", label="Privacy-safe tuning", regex=_BOOL),
    _o("releases", "With --private: a folder of past releases, RELEASES/date=YYYY-MM-DD/ each a measure output "
       "(only its release/ folder is read, its manifest checked; simulations are refused).", metavar="ROOT",
       label="Past releases", regex=_NON_EMPTY, gcs_only=True),
    _o("first_party", "With --private: the advertiser's conversions (Parquet: conversion_time, the value columns, "
       "conversion-side slices; impression_id or an impression-side slice makes it a joined log and is refused).",
       metavar="LOG", label="First-party conversions", regex=_NON_EMPTY, gcs_only=True),
    # ---- replay -------------------------------------------------------------------------------
    _o("replay_days", "Replay the last N days of the log (default: every day with --window-days days before it).",
       type="positive_int", metavar="N"),
    _o("exploration_share", "Share of impressions in each of the privacy-safe mode's seven exploration arms "
       "(C = 1, 2, 3, 5, 8, 12, 20).", type="positive_float", default=core.EXPLORATION_ARM_SHARE, metavar="F"),
    # ---- synthetic data, split, Criteo --------------------------------------------------------
    _o("preset", f"Preset name ({', '.join(PRESET_NAMES)}) or a preset .json written by fit-synthetic.",
       required=True, metavar="PRESET"),
    _o("scale", "Multiply the power-law support [k_min, k_max] by this factor (1 if neither --scale nor "
       "--target-conversions).", type="positive_float", metavar="S"),
    _o("target_conversions", "Choose the smallest scale whose expected conversions per split reach this number.",
       type="positive_float", metavar="N"),
    _o("days", "Date-partition the output over N days starting at --start-date (date=YYYY-MM-DD/).",
       type="positive_int", metavar="N"),
    _o("start_date", "First impression date, YYYY-MM-DD.", type="date", default="2024-01-01", metavar="YYYY-MM-DD"),
    _o("partition_by", "With --days: date partitions by impression date (each holds whole impressions) or by "
       "conversion date (a daily export: measure a day with the days before as --lookback).",
       default="impression-date", choices=("impression-date", "conversion-date")),
    _o("split", "Which split(s) to write.", default="both", choices=("both", "train", "test")),
    _o("b", "Override the power-law shape b (> 0).", type="float"),
    _o("lam", "Override the Poisson rate lam (>= 0).", type="float"),
    _o("mu", "Override the log-normal mu.", type="float"),
    _o("sigma", "Override the log-normal sigma (> 0).", type="float"),
    _o("k_min", "Power-law k_min (>= 1).", type="int"),
    _o("k_max", "Power-law k_max (>= k_min).", type="int"),
    _o("attribution_window_days", "Attribution window in days.", type="positive_int", metavar="DAYS"),
    _o("impressions_per_user", "Mean impressions per browser (browser_id: the W3C Attribution target's privacy "
       "unit; preset default 3).", type="positive_float", metavar="N"),
    _o("power_law_sampler", "exact: Def. 5.1 by inverse CDF; clauset: the paper's Clauset et al. approximation "
       "(off by 34% at P(2)/P(1) for b = 2.88).", default="exact", choices=("exact", "clauset")),
    _o("chunk_rows", "Rows per in-memory chunk / Parquet row group (bounds memory).", type="positive_int",
       default=1_000_000, metavar="N"),
    _o("rows_per_file", "Start a new part file after this many rows.", type="positive_int", default=8_000_000,
       metavar="N"),
    _o("max_conversions", "Refuse when the expected conversions per split exceed this.", type="positive_float",
       default=2e9, metavar="N"),
    _o("impression_column", "Impression key column.", default="impression_id", metavar="COL"),
    _o("train_fraction", "Fraction of rows (by time) that go to train, 0 < q < 1 (0.5 without --cut-time).",
       type="float", metavar="Q"),
    _o("cut_time", "Explicit cut, ISO-8601 (naive = UTC), e.g. 2024-01-15T00:00:00Z.", metavar="TIME"),
    _o("time_column", "Timestamp column to split on (impression_time keeps impressions whole).",
       default="conversion_time", metavar="COL"),
    _o("include_non_converting", "Keep Sale=0 clicks (value 0, conversion_time = click time).", type="bool"),
    # ---- ARA -----------------------------------------------------------------------------------
    _o("conversions", "Parquet conversion log (file, directory or glob).", metavar="LOG"),
    _o("key_map", "Key map JSON declaring the output domain (from export-ara or measure).", metavar="FILE"),
    _o("destination", "The advertiser site of the source registrations: an https:// URL (http:// only for "
       "localhost), reduced to its site (scheme + registrable domain) as Chrome does.",
       default=core.DESTINATION, metavar="URL"),
    _o("summary_report", "The Aggregation Service's summary report: Avro file(s), a directory or a glob (for an "
       "attribution parameter version: the aggregated histograms, CSV with query,histogram_index,noisy_sum).",
       required=True, metavar="AVRO", nargs="+"),
    _o("confidence", "Confidence level of the intervals.", type="float", default=core.CONFIDENCE, metavar="LEVEL"),
    # ---- demo ------------------------------------------------------------------------------------
    _o("conversions_per_day", "Synthetic conversions per day.", type="positive_int", default=150_000, metavar="N"),
)

OPTIONS: Final[Mapping[str, CliOption]] = {o.name: o for o in _ALL}
if len(OPTIONS) != len(_ALL):  # pragma: no cover - a registry bug, caught at import
    raise RuntimeError("duplicate option names in the registry")


@dataclass(frozen=True)
class Command:
    """One subcommand: where it runs, what it says, which registry options it takes.

    ``options`` entries are option names, or (name, overrides) where overrides change ``help``,
    ``default`` or ``required`` for this command only. ``beam``: unknown ``--options`` are passed to
    Apache Beam. ``groups``: mutually exclusive option groups."""

    module: str
    function: str
    summary: str
    description: str
    examples: tuple[str, ...]
    options: tuple[str | tuple[str, Mapping[str, Any]], ...]
    beam: bool = False
    groups: tuple[tuple[str, ...], ...] = ()
    epilog: str = ""


_BEAM_EPILOG = ("Any other --option is passed to Apache Beam (e.g. --runner DataflowRunner --project P --region R "
                "--temp_location gs://... --setup_file ./setup.py; locally --direct_running_mode multi_processing "
                "--direct_num_workers 2).")

_PRIVATE_START_HELP = ("With --private: the first day the advertiser measured with the API (the day given to "
                       "measure --measurement-start): for 30 days after it the releases, arms included, keep "
                       "more than a settled count limit does, and the tuner reads them so; a release learnt "
                       "from before it is refused. Default: none.")

COMMANDS: Final[Mapping[str, Command]] = {
    "measure": Command(
        "pipelines.measure", "run", "the summary report ARA would release for a conversion log, and estimates (Beam)",
        "Encode (HistogramContribution, Alg. 3 / Alg. 6), cap (ContributionCapping, Alg. 1), sum per key over "
        "the declared domain, add discrete Laplace noise once per key (SummaryReport, Alg. 2) and reconstruct "
        "(ReconstructValues, Alg. 4). OUT/release/ may be published; OUT/private/ holds exact counts, the dead "
        "letter and the debug report and must not; OUT/release/MANIFEST.json is written last. A release needs a "
        "declared domain: --domain, or the one the parameter version carries.",
        ("araopt measure --input logs/date=2026-11-24/ --lookback-days 30 --params store/ --output out/",
         "araopt measure --input logs/ --params params.json --domain slices.csv --output out/ --debug-run"),
        ("input", "params", "output", "lookback",
         ("lookback_days", {"default": None,
                            "help": "Instead of --lookback: the N days of date=YYYY-MM-DD/ partitions before the "
                                    "input's first day, found beside the input's partitions (its folder's other "
                                    "date= folders, across month boundaries; symbolic links followed). They consume "
                                    "each impression's budget in ContributionCapping (Alg. 1) but are never "
                                    "released or counted; default: none."}),
         "domain", "epsilon", "override_epsilon", "debug_run", "max_slices",
         "allow_rerelease", "ledger", "check_ledgers", "params_version", "simulation_seed", "num_shards", "shuffle",
         "measurement_start", "max_rejected_fraction", "no_progress", "overwrite", "api"),
        beam=True),
    "optimize": Command(
        "pipelines.optimize", "run", "choose C, clip thresholds and budget fractions on history (Alg. 5)",
        "ParameterOptimization (Alg. 5) on a conversion history: sufficient statistics on Beam, the optimizer on "
        "the driver, the paper's baselines (Sec. 5.1) beside it. The parameter file records the predicted "
        "training RMSRE_tau of the result and of the baselines, and the history's key domain.",
        ("araopt optimize --history logs/ --slices campaignId,geography --values value --epsilon 8 "
         "--output params.json",),
        (("history", {"required": False, "help": "Conversion history (Parquet, joined: impression_id and every "
                                                 "slice): a file, directory or glob, local or gs://. Required "
                                                 "unless --private."}),
         "slices", "values", ("epsilon", {"required": True}), "output", "release_period", "api", "seed",
         ("lookback", {"help": "Earlier conversions (Parquet) read only to rank each history conversion within its "
                               "impression's whole life (as the browser caps a source); not part of the history."}),
         "private", "releases", "first_party",
         ("measurement_start", {"help": _PRIVATE_START_HELP}),
         ("domain", {"help": "With --private: the declared domain (a key map JSON of origin declared, e.g. the "
                             "key_map.json of a release over a declared domain, or a .csv/.json list of slice "
                             "values)."}),
         ("as_of", {"required": False, "help": "With --private: tune for the release after this day from the "
                                              "releases up to it (default: the latest release found)."}),
         ("window_days", {"required": False, "default": core.PRIVATE_WINDOW_DAYS,
                          "help": "With --private: days of past releases learnt from."}),
         ("ledger", {"help": "With --private: the release ledger measure recorded the releases in (each release "
                             "folder read must be one of its releases, unchanged, on its day); default "
                             "$ARAOPT_LEDGER or ~/.local/state/araopt, or the --store's ledger."}),
         ("store", {"required": False, "help": "With --private: the parameter store whose versions the releases "
                                               "were made with (each release's parameters must be one of its "
                                               "published versions; its ledger is the release ledger); needed to "
                                               "learn from Aggregation Service reports."}),
         ("exploration_share", {"default": None, "help": "With --private: share of impressions in each of the seven "
                                                        "exploration arms (C = 1, 2, 3, 5, 8, 12, 20); default "
                                                        f"{core.EXPLORATION_ARM_SHARE:g} (never taken from a "
                                                        "release folder)."}),
         "allow_large_change", "max_threshold_change_factor", "max_count_limit_change",
         "encoding", "max_count_limit", "objective", "tau", "special_days", "special_day_loss_factor",
         "l1_rounding", "max_rejected_fraction", "no_progress", "overwrite"),
        beam=True),
    "evaluate": Command(
        "pipelines.evaluate", "run", "test RMSRE_tau of optimized parameters vs the baselines, with plots",
        "Optimize on each training log, evaluate on its test log (exact expected RMSRE_tau; with --monte-carlo "
        "also the real mechanism), per epsilon and method; the generalization gap. Writes rmsre.csv, "
        "comparison.csv, generalization_gap.csv, count_limit.csv, rmsre.png and count_limit.png. In memory: each "
        "log is read once (the exact error model needs the records).",
        ("araopt evaluate --train data/train --test data/test --name synth-criteo --slices "
         "campaignId,geography,productCategory --values value --output eval/",),
        ("train", "test", ("name", {"help": "Dataset name (one per --train; default dataset1, ...).",
                                    "action": "append"}),
         "slices", "values", "epsilons", "output", "monte_carlo", "seed", "api", "max_count_limit", "objective", "tau",
         ("lookback", {"help": "Conversions before the training log (Parquet), read only to rank the training "
                               "conversions over their impressions' whole lives; the test log's lookback is the "
                               "training log (and this)."}),
         "methods", "no_gap", "max_rejected_fraction", "no_progress", "overwrite")),
    "nightly": Command(
        "pipelines.nightly", "run", "re-optimize on the last N days and publish to a parameter store",
        "One Beam job: the window's date partitions -> validate -> statistics -> optimizer and baselines, "
        "guardrails, the run report (JSON + PNG), and an immutable version published with a compare-and-swap "
        "of 'latest'. Re-running an as-of date on the same history publishes nothing.",
        ("araopt nightly --history logs/ --as-of yesterday --window-days 7 --store store/ --slices "
         "campaignId,geography --values value --epsilon 8",),
        (("history", {"required": False, "help": "Conversion history (Parquet, joined), its date=YYYY-MM-DD/ "
                                                 "partitions read. Required unless --private."}),
         "as_of", "window_days", "store", "slices", "values", ("epsilon", {"required": True}),
         "private", "releases", "first_party",
         ("measurement_start", {"help": _PRIVATE_START_HELP}),
         ("domain", {"help": "With --private: the declared domain (key map JSON or .csv/.json list of slice "
                             "values)."}),
         ("exploration_share", {"default": None, "help": "With --private: share of impressions in each of the seven "
                                                        "exploration arms (C = 1, 2, 3, 5, 8, 12, 20); default: the "
                                                        "arm plan of the store's latest version, else "
                                                        f"{core.EXPLORATION_ARM_SHARE:g} (never taken from a release "
                                                        "folder)."}),
         "release_period", "lookback_days", "encoding", "api", "seed",
         "max_count_limit", "allow_large_change", "max_threshold_change_factor", "max_count_limit_change", "run_id",
         "objective",
         "tau", "special_days", "special_day_loss_factor", "max_rejected_fraction", "num_shards", "shuffle",
         "no_progress"),
        beam=True),
    "synth": Command(
        "pipelines.synth", "run_synth", "the paper's synthetic conversion logs (Sec. 5.3)",
        "Generate a synthetic conversion log (train and test, independent draws of the same seed): 256 slices "
        "(campaignId 16 x geography 8 x productCategory 2); impressions per slice ~ PowerLaw(b, k_min, k_max); "
        "conversions per impression ~ Poisson(lam); value ~ LogNormal(mu, sigma).",
        ("araopt synth --preset synth-criteo --target-conversions 1000000 --seed 1 --output data/",),
        ("preset", "scale", "target_conversions", "seed", "output", "days", "start_date", "partition_by", "split", "b",
         "lam", "mu",
         "sigma", ("k_min", {"help": "Override the power-law k_min (>= 1; preset default 1)."}),
         ("k_max", {"help": "Override the power-law k_max (>= k_min; preset default 10000)."}),
         ("attribution_window_days", {"help": "Override the attribution window (preset default 30)."}),
         "impressions_per_user", "power_law_sampler", "chunk_rows", "rows_per_file", "max_conversions", "overwrite"),
        groups=(("scale", "target_conversions"),),
        epilog="presets (k_min=1, k_max=10000, 30-day window): synth-criteo b=2.88 lam=10 mu=4.19 sigma=1.16; "
               "synth-real-estate b=0.06 lam=10 mu=0.87 sigma=0.43; synth-travel b=1.14 lam=10 mu=1.95 sigma=1.14. "
               "Output: OUT/train/ and OUT/test/, each part-NNNNN.parquet or, with --days N, "
               "date=YYYY-MM-DD/part-NNNNN.parquet (by impression date: an impression and all its conversions in "
               "the partition of the impression date; with --partition-by conversion-date: each conversion in the "
               "partition of its own date), and _manifest.json."),
    "fit-synthetic": Command(
        "pipelines.synth", "run_fit_synthetic", "fit a synthetic preset (b, lambda, mu, sigma) to a conversion log",
        "Fit the Sec. 5.3 model by maximum likelihood and write a preset JSON that `araopt synth --preset FILE` "
        "accepts: b over distinct impressions per slice, lam zero-truncated Poisson, mu and sigma of log(value).",
        ("araopt fit-synthetic --input logs/ --slices campaignId,geography,productCategory --values value "
         "--output preset.json",),
        ("input", "output", ("name", {"help": "Preset name stored in the file.", "default": "fitted"}),
         ("slices", {"required": False, "default": "campaignId,geography,productCategory",
                     "help": "Comma-separated impression features defining a slice (partner_id for Criteo)."}),
         ("values", {"required": False, "default": "value", "help": "The value column."}),
         "impression_column",
         ("k_min", {"help": "Known power-law k_min (default: the smallest slice)."}),
         ("k_max", {"help": "Known power-law k_max (default: the largest slice)."}),
         ("attribution_window_days", {"default": 30, "help": "Attribution window stored in the preset."}),
         "overwrite")),
    "split": Command(
        "pipelines.synth", "run_split", "time-based train/test split of a conversion log",
        "train = rows with time < cut, test = rows with time >= cut; with --train-fraction q the cut is the time "
        "at sorted position round(q n) (equal times stay together). Writes OUT/train/ and OUT/test/.",
        ("araopt split --input logs/ --train-fraction 0.7 --output split/",),
        ("input", "output", "train_fraction", "cut_time", "time_column", "overwrite"),
        groups=(("train_fraction", "cut_time"),)),
    "load-criteo": Command(
        "pipelines.synth", "run_load_criteo", "the Criteo Sponsored Search Conversion Log mapped to the contract",
        "Convert the Criteo Sponsored Search Conversion Log (23 tab-separated columns, no header, -1 = missing): "
        "slice partner_id; values product_price_x_sale, SalesAmountInEuro; one row per click (count limit 1). "
        "Rows whose value is unknown go to OUT/_dead_letters-*.parquet with the line number and reason.",
        ("araopt load-criteo --input CriteoSearchData.gz --output criteo/",),
        (("input", {"help": "Criteo TSV file (.gz/.bz2 accepted)."}), "output", "include_non_converting", "overwrite")),
    "export-ara": Command(
        "pipelines.ara", "run_export_ara", "ARA source/trigger registration JSON and output domain from parameters",
        "From a parameter file to ARA registrations (docs/ara.md): key_map.json/.csv, sources.json (one "
        "Attribution-Reporting-Register-Source per slice of impression features), output_domain.avro, "
        "export.json and, with --conversions, the OPERATOR-PRIVATE private/triggers.jsonl (one trigger per "
        "conversion with its raw impression id and time: never publish). ARA limits are checked before anything is "
        "written.",
        ("araopt export-ara --params store/versions/2026-11-24-ab12/params.json --output export/",),
        ("params", "output", "key_map", ("conversions", {"help": "Parquet conversion log: write its triggers to the "
                                                                    "operator-private private/triggers.jsonl (and, "
                                                                    "without a declared domain, take its slices)."}),
         "destination", ("simulation_seed", {"help": "SIMULATION MODE: seeded rounding of the trigger values (as "
                                                     "measure --simulation-seed); NOT for real traffic."}),
         "overwrite")),
    "export-attribution": Command(
        "pipelines.attribution", "run_export_attribution",
        "W3C Attribution Level 1: the saveImpression / measureConversion calls from parameters",
        "From an Attribution parameter file (docs/attribution.md; its own format, araopt-attribution-params/1) to "
        "what the ad servers and the pages call: calls.json (per impression the saveImpression options, per "
        "conversion one measureConversion per query, in order), histogram_layout.csv (histogram index <-> "
        "impression-side slice), export.json and, with --conversions, the OPERATOR-PRIVATE private/events.jsonl "
        "(one line per browser instance in the spec's end-to-end format, with raw ids and times: never publish).",
        ("araopt export-attribution --params attribution.json --output export/",
         "araopt export-attribution --params attribution.json --output export/ --conversions log.parquet "
         "--simulation-seed 7"),
        (("params", {"help": "Attribution parameter file (.json, format araopt-attribution-params/1: per_site_budget, "
                             "queries with epsilon / max_value / clip, slice_columns, epoch_days, lookback_days, "
                             "credit)."}),
         "output",
         ("domain", {"help": "The histogram layout: a .csv/.json file listing the impression-side slice values "
                             "(histogram index = row order); default: the slices of --conversions."}),
         ("conversions", {"help": "Parquet conversion log with browser_id and impression_time: write each browser's "
                                  "events to the operator-private private/events.jsonl (needs --simulation-seed)."}),
         ("simulation_seed", {"help": "SIMULATION MODE: the value roundings and epoch starts of araopt's attribution "
                                      "measure with the same seed; NOT for real traffic."}),
         "overwrite")),
    "reconstruct": Command(
        "pipelines.ara", "run_reconstruct", "estimates from an Aggregation Service summary report (Avro)",
        "ReconstructValues (Alg. 4) on a real summary report: estimates with standard errors and confidence "
        "intervals per slice and query, through the key map. Unknown, missing or implausible buckets are "
        "counted and reported, never silently dropped.",
        ("araopt reconstruct --summary-report report.avro --params params.json --key-map key_map.json "
         "--output estimates.csv",),
        (("summary_report", {}), "params", "key_map",
         ("conversions", {"help": "Without --key-map: the key domain of this log's slices."}), "output",
         "confidence", ("epsilon", {"help": "Epsilon of the Aggregation Service job, if it differs from the "
                                            "parameter file's."}),
         "api", ("days", {"type": "str", "metavar": "DATES", "regex": _DATES,
                   "help": "The UTC conversion days the report covers, YYYY-MM-DD,... (or FIRST..LAST): the "
                           "calibration's day-of-week and special-day effects apply to them as measure applies them "
                           "to its input's date= partitions. Default: the date=YYYY-MM-DD/ folders the report "
                           "files lie in; without either, the effects are not applied (and the command says so)."}),
         "overwrite")),
    "replay": Command(
        "pipelines.replay", "run", "backtest: each tuning method's daily releases on a joined log, scored",
        "For each day of a joined daily log, in order, measure the day (simulation: seeded noise) with the "
        "parameters each method chose from what it could see before the day, and score the released estimates "
        "against the day's true totals (RMSRE_tau): private_safe (privacy-safe tuning on its own previous releases "
        "and first-party conversions only; day 1 a cold start), fully_informed (the nightly tuning on the raw "
        "window), baseline_q95, baseline_q99. Writes replay.csv, summary.json and replay.png: operator-private.",
        ("araopt replay --history logs/ --slices campaignId,geography --values value --epsilon 8 --output replay/",),
        ("history", "slices", "values", ("epsilon", {"required": True}), "output",
         ("window_days", {"required": False, "default": core.PRIVATE_WINDOW_DAYS,
                          "help": "Days of raw history the fully informed tuner sees (and past releases the "
                                  "privacy-safe tuner learns from) before each replayed day."}),
         "lookback_days", "replay_days", "exploration_share",
         ("domain", {"help": "The declared domain (key map JSON or .csv/.json list of slice values); default: "
                             "every slice of the log."}),
         "seed", "max_count_limit", "fresh_start", "max_rejected_fraction", "no_progress", "overwrite")),
    "demo": Command(
        "pipelines.demo", "run", "the README's main job: synthetic history -> nightly -> measure",
        "Generate days of synthetic conversions, run the nightly re-optimization on all but the last day into a "
        "local parameter store, measure the last day with the store's latest parameters (secure noise), print "
        "estimates with error bars and the predicted error against the baselines, and write the plots.",
        ("araopt demo --output demo-output",),
        (("output", {"required": False, "default": "demo-output",
                     "help": "Output folder (its data/, store/, measure/ and plots/ are replaced on every run)."}),
         "conversions_per_day", ("days", {"default": 16, "help": "Days of impressions generated (at least 15: a "
                                                         "7-day window, its 7-day lookback, the measured last day)."}),
         ("epsilon", {"default": 8.0}), ("seed", {"default": 2026}))),
}

def command_options(command: str) -> dict[str, CliOption]:
    """The options of ``command`` by name, with the command's overrides applied."""
    out = {}
    for entry in COMMANDS[command].options:
        name, overrides = (entry, {}) if isinstance(entry, str) else entry
        base = OPTIONS[name]
        known = {k: v for k, v in overrides.items() if k in CliOption.__dataclass_fields__}
        out[name] = CliOption(**{**base.__dict__, **known})
    return out


TEMPLATE_OPTIONS: Final[Mapping[str, tuple[str, ...]]] = {
    "nightly": ("history", "as_of", "window_days", "store", "slices", "values", "epsilon", "release_period",
                "lookback_days", "encoding", "max_count_limit", "allow_large_change", "max_threshold_change_factor",
                "max_count_limit_change"),
    "measure": ("input", "params", "output", "lookback", "lookback_days", "epsilon", "override_epsilon", "debug_run",
                "domain", "max_slices", "allow_rerelease", "ledger"),
}
"""The options of the Dataflow Flex Templates (metadata generated by ``python -m deploy.gen_metadata``)."""

TEMPLATE_BASE_OPTIONS: Final = frozenset({"history"})
"""Options a template takes as the registry declares them: the nightly template runs the Beam job on a
joined history (the privacy-safe mode, which needs no Beam, is not a template)."""

OPTIONS_BY_JOB: Final[Mapping[str, tuple[CliOption, ...]]] = {
    job: tuple(OPTIONS[name] if name in TEMPLATE_BASE_OPTIONS else command_options(job)[name] for name in names)
    for job, names in TEMPLATE_OPTIONS.items()}


# ---- types ----------------------------------------------------------------------------------------
_CONVERTERS: Final[Mapping[str, Callable[[str], Any]]] = {
    "str": str, "int": int, "float": float, "positive_int": _positive_int, "positive_float": _positive_float,
    "date": _date,
}


def _typed(option: CliOption) -> Callable[[str], Any]:
    pattern = re.compile(option.regex) if option.regex and not option.gcs_only else None
    convert = _CONVERTERS[option.type]

    def parse(text: str) -> Any:
        if pattern is not None and not pattern.fullmatch(text):
            raise argparse.ArgumentTypeError(f"{text!r} does not match {option.regex}")
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {option.type}, got {text!r}") from None

    parse.__name__ = option.type.replace("_", " ")  # shown in "invalid <type> value" messages
    return parse


# ---- parsers ---------------------------------------------------------------------------------------
TRACEBACK_FLAG = "--traceback"


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (exit code 2), that never takes an abbreviation of an
    option for the option (``--sim 3`` is not ``--simulation-seed 3``), and that knows --traceback."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.add_argument(TRACEBACK_FLAG, action="store_true", help="on failure, also print the Python traceback")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _help(option: CliOption, default: Any) -> str:
    text = option.help
    if default not in (None, False) and "default" not in text.lower():
        text = f"{text} (default: {default})"
    return text.replace("%", "%%")  # argparse formats help strings with %


def add_options(parser: argparse.ArgumentParser, opts: Sequence[CliOption]) -> None:
    """Add registry options (as resolved for a command) to a parser."""
    for option in opts:
        add_option(parser, option)


def add_option(parser: argparse.ArgumentParser | Any, option: CliOption, **overrides: Any) -> None:
    """Add one registry option (both spellings, ``--as-of`` and ``--as_of``, plus its aliases)."""
    option = CliOption(**{**option.__dict__, **{k: v for k, v in overrides.items() if k in CliOption.__dataclass_fields__}})
    names = [option.flag] + ([option.template_flag] if option.template_flag != option.flag else []) + list(option.aliases)
    default = option.default
    if option.type == "bool":
        parser.add_argument(*names, dest=option.name, nargs="?", const=True, default=bool(default), type=parse_bool,
                            metavar="true|false", help=_help(option, None))
        return
    kwargs: dict[str, Any] = {"dest": option.name, "default": default, "help": _help(option, default),
                              "metavar": option.metavar}
    if option.required:
        kwargs["required"] = True
    if option.choices:
        kwargs["choices"] = option.choices
        kwargs.pop("metavar")
    elif option.type != "str" or option.regex:
        kwargs["type"] = _typed(option)
    if option.action:
        kwargs["action"] = option.action
    if option.nargs:
        kwargs["nargs"] = option.nargs
    parser.add_argument(*names, **kwargs)


def build_parser(command: str) -> OneLineParser:
    """The parser of ``araopt <command>`` from the registry (no heavy import)."""
    spec = COMMANDS[command]
    examples = "\n".join(f"  {e}" for e in spec.examples)
    epilog = "\n\n".join(p for p in (f"example{'s' if len(spec.examples) > 1 else ''}:\n{examples}",
                                     spec.epilog, _BEAM_EPILOG if spec.beam else "") if p)
    parser = OneLineParser(prog=f"araopt {command}", description=spec.description, epilog=epilog,
                           formatter_class=_Formatter)
    grouped = {name: i for i, group in enumerate(spec.groups) for name in group}
    groups: dict[int, Any] = {}
    for entry in spec.options:
        name, overrides = (entry, {}) if isinstance(entry, str) else entry
        target: Any = parser
        if name in grouped:
            if grouped[name] not in groups:
                groups[grouped[name]] = parser.add_mutually_exclusive_group()
            target = groups[grouped[name]]
        add_option(target, OPTIONS[name], **overrides)
    return parser


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=110)

    def _fill_text(self, text: str, width: int, indent: str) -> str:  # wrap paragraphs, keep example lines
        import textwrap

        out = []
        for block in text.split("\n\n"):
            if block.startswith("example"):
                out.append(block)
            else:
                out.append(textwrap.fill(" ".join(block.split()), width, initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(out)


def parse(command: str, argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """(known options, the rest for Apache Beam) for Beam jobs; an argument that is neither an option of
    the command nor an Apache Beam option is a usage error (exit 2) before anything runs, for every command."""
    parser = build_parser(command)
    if COMMANDS[command].beam:
        args, rest = parser.parse_known_args(list(argv))
        beam_parser = _beam_parser()
        unknown = list(beam_parser.parse_known_args(rest)[1])
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)} (neither an option of araopt {command} nor an "
                         f"Apache Beam option){_did_you_mean(unknown, parser, beam_parser)}")
        return args, rest
    return parser.parse_args(list(argv)), []


def _beam_parser() -> argparse.ArgumentParser:
    """The parser Apache Beam builds from every pipeline option (``PipelineOptions.get_all_options``,
    abbreviations refused): what it does not parse, Beam would discard with a warning."""
    from apache_beam.options.pipeline_options import PipelineOptions

    parsers: list[argparse.ArgumentParser] = []
    PipelineOptions([]).get_all_options(add_extra_args_fn=parsers.append)
    return parsers[0]


def _did_you_mean(unknown: Sequence[str], *parsers: argparse.ArgumentParser) -> str:
    import difflib

    flags = [f for p in parsers for action in p._actions for f in action.option_strings if f.startswith("--")]
    hints = [f"{u.split('=', 1)[0]} -> {close[0]}" for u in unknown if u.startswith("--")
             for close in [difflib.get_close_matches(u.split("=", 1)[0], flags, n=1, cutoff=0.8)] if close]
    return f"; did you mean: {', '.join(hints)}" if hints else ""


# ---- running a command ----------------------------------------------------------------------------
def cli_main(run: Callable[[list[str]], int], argv: Sequence[str] | None, prog: str) -> int:
    """Run ``run(argv)``; any failure is one line on stderr and exit status 2 (``--traceback`` also
    prints the Python traceback, and Beam's own error log). argparse's --help exits 0."""
    args = list(sys.argv[1:] if argv is None else argv)
    show_traceback = TRACEBACK_FLAG in args
    args = [a for a in args if a != TRACEBACK_FLAG]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Beam logs a failed bundle's traceback at ERROR before raising it: keep stderr to one line
    logging.getLogger("apache_beam").setLevel(logging.WARNING if show_traceback else logging.CRITICAL)
    try:
        return run(args)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2, message already printed)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure of a command is one line for its user
        if show_traceback:
            import traceback

            traceback.print_exc()
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 2


def subcommand_main(prog: str, commands: Mapping[str, Callable[[list[str]], int]], argv: Sequence[str] | None) -> int:
    """``python -m pipelines.<module> <command> ...``: run one of the module's ``commands`` (the same as
    ``araopt <command> ...``, without going through ``pipelines.cli``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    usage = f"usage: {prog} {{{'|'.join(commands)}}} [options]"
    if not args or args[0] in ("-h", "--help"):
        print(usage, file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0] not in commands:
        print(f"{prog}: error: unknown command {args[0]!r}; one of {', '.join(commands)}", file=sys.stderr)
        return 2
    return int(commands[args[0]](args[1:]) or 0)


def run_command(command: str, body: Callable[[argparse.Namespace, list[str]], int], argv: Sequence[str] | None) -> int:
    """Parse ``argv`` for ``command`` from the registry and run ``body(args, beam_args)`` with one-line errors."""
    return cli_main(lambda a: body(*parse(command, a)), argv, f"araopt {command}")
