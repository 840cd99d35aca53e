"""Single source of truth for the job options of ``araopt nightly`` and ``araopt measure``.

The CLI's argparse parsers (:func:`add_options`) and the Flex Template metadata
(``python -m deploy.gen_metadata``) are both built from :data:`NIGHTLY_OPTIONS` and
:data:`MEASURE_OPTIONS`, and ``tests/test_deploy.py`` checks the committed metadata against them.

Naming: a Flex Template passes each parameter to the program as ``--<name>=<value>`` with the
parameter's metadata name, which is snake_case (``as_of``); on the command line people type
``--as-of``. :func:`add_options` accepts both spellings. Boolean switches accept ``--flag`` on the
command line and ``--flag=true|false`` from templates.

Stdlib only, so it can be imported by the CLI, the template entry point and the tests alike.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "MEASURE_OPTIONS",
    "NIGHTLY_OPTIONS",
    "OPTIONS_BY_JOB",
    "CliOption",
    "add_options",
    "parse_bool",
    "resolve_as_of",
]

OptionType = Literal["str", "int", "float", "bool"]

_GCS_ONLY: Final = r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/\S*)?$"
_COLUMNS: Final = r"^[A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)*$"
_POSITIVE_INT: Final = r"^[1-9][0-9]*$"
_NON_NEGATIVE_INT: Final = r"^[0-9]+$"
_POSITIVE_DECIMAL: Final = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$"
_NON_EMPTY: Final = r"^\S+$"
_BOOL: Final = r"^(true|false)$"
_AS_OF: Final = r"^([0-9]{4}-[0-9]{2}-[0-9]{2}|today|yesterday)$"


@dataclass(frozen=True)
class CliOption:
    """One job option.

    ``name`` is the Flex Template parameter name (snake_case) and the argparse ``dest``;
    ``regex`` is checked by both the CLI and Dataflow (template launch); ``gcs_only`` options are
    paths that must be ``gs://`` in a template (the CLI also accepts local paths).
    """

    name: str
    label: str
    help: str
    required: bool = False
    type: OptionType = "str"
    regex: str | None = None
    gcs_only: bool = False
    metavar: str | None = None

    @property
    def flag(self) -> str:
        """The command-line spelling, e.g. ``--as-of``."""
        return "--" + self.name.replace("_", "-")

    @property
    def template_flag(self) -> str:
        """The spelling a Flex Template uses, e.g. ``--as_of``."""
        return "--" + self.name

    @property
    def template_regexes(self) -> tuple[str, ...]:
        """Regexes Dataflow validates the template parameter against."""
        regexes = [self.regex] if self.regex else []
        if self.gcs_only:
            regexes = [_GCS_ONLY]
        return tuple(regexes)


NIGHTLY_OPTIONS: Final[tuple[CliOption, ...]] = (
    CliOption(
        "history", "Conversion history", "Glob of the conversion history files (Parquet), e.g. "
        "gs://BUCKET/history/*.parquet.", required=True, regex=_NON_EMPTY, gcs_only=True, metavar="GLOB",
    ),
    CliOption(
        "as_of", "As-of date", "Last day of history to use, YYYY-MM-DD, or 'yesterday'/'today' (UTC, resolved "
        "at launch; scheduled runs use 'yesterday').", required=True, regex=_AS_OF, metavar="YYYY-MM-DD",
    ),
    CliOption(
        "window_days", "Window (days)", "Number of days of history ending at the as-of date.",
        required=True, type="int", regex=_POSITIVE_INT, metavar="N",
    ),
    CliOption(
        "store", "Parameter store", "Parameter store URI (gs://BUCKET/PREFIX); the job publishes "
        "versions/<as-of>-<run id>/params.json there and moves 'latest'.", required=True,
        regex=_NON_EMPTY, gcs_only=True, metavar="URI",
    ),
    CliOption(
        "slices", "Slice columns", "Comma-separated history columns that define the report slices "
        "(aggregation key pieces).", required=True, regex=_COLUMNS, metavar="COLS",
    ),
    CliOption(
        "values", "Value columns", "Comma-separated history columns holding the values to measure.",
        required=True, regex=_COLUMNS, metavar="COLS",
    ),
    CliOption(
        "epsilon", "Epsilon", "Privacy budget epsilon of the Aggregation Service, in (0, 64].",
        required=True, type="float", regex=_POSITIVE_DECIMAL, metavar="E",
    ),
    CliOption(
        "encoding", "Encoding", "Contribution budget norm: linf or l1.", regex=r"^(linf|l1)$",
        metavar="linf|l1",
    ),
    CliOption(
        "max_count_limit", "Max count limit", "Upper bound for the optimized per-impression count limit.",
        type="int", regex=_POSITIVE_INT, metavar="N",
    ),
    CliOption(
        "allow_large_change", "Allow large change", "Publish even when the new parameters move more "
        "than the change guards allow (true/false).", type="bool", regex=_BOOL,
    ),
    CliOption(
        "max_threshold_change_factor", "Max threshold change factor", "Largest allowed factor between "
        "a new and the previous threshold before the job refuses to publish.", type="float",
        regex=_POSITIVE_DECIMAL, metavar="F",
    ),
    CliOption(
        "max_count_limit_change", "Max count limit change", "Largest allowed absolute change of the "
        "count limit before the job refuses to publish.", type="int", regex=_NON_NEGATIVE_INT, metavar="N",
    ),
)

MEASURE_OPTIONS: Final[tuple[CliOption, ...]] = (
    CliOption(
        "input", "Conversions", "Glob of the conversion log (Parquet) to measure.", required=True,
        regex=_NON_EMPTY, gcs_only=True, metavar="GLOB",
    ),
    CliOption(
        "params", "Parameters", "Parameter store URI (resolves 'latest'), STORE/versions/<version> for a "
        "named version, or a parameter file.", required=True, regex=_NON_EMPTY, gcs_only=True,
        metavar="PATH_OR_STORE_URI",
    ),
    CliOption(
        "output", "Output directory", "Directory for the summary report and run_summary.json.",
        required=True, regex=_NON_EMPTY, gcs_only=True, metavar="DIR",
    ),
    CliOption(
        "epsilon", "Epsilon", "Privacy budget epsilon of the release, in [2^-20, 64]; must equal the "
        "parameter file's epsilon unless override_epsilon is set.",
        type="float", regex=_POSITIVE_DECIMAL, metavar="E",
    ),
    CliOption(
        "override_epsilon", "Override epsilon", "Allow an epsilon different from the parameter file's "
        "(recorded in the run summary) (true/false).", type="bool", regex=_BOOL,
    ),
    CliOption(
        "debug_run", "Debug run", "Also write unnoised values and noise (Aggregation Service debug run) "
        "into the operator-private folder (true/false).", type="bool", regex=_BOOL,
    ),
    CliOption(
        "domain", "Output domain", "The declared output domain: a key map JSON (key_map.json, as written "
        "by measure or export-ara) or a .csv/.json file listing slice values; default: the domain the "
        "parameter version carries. Every domain key gets noise, also keys without conversions.",
        regex=_NON_EMPTY, gcs_only=True, metavar="FILE",
    ),
    CliOption(
        "max_slices", "Max slices", "Refuse a domain with more slices than this (default 100000).",
        type="int", regex=_POSITIVE_INT, metavar="N",
    ),
    CliOption(
        "allow_rerelease", "Allow re-release", "Release an input the release ledger already knows "
        "(true/false); each release is recorded.", type="bool", regex=_BOOL,
    ),
    CliOption(
        "ledger", "Release ledger", "Where releases are recorded (default: the parameter store, else "
        "$ARAOPT_LEDGER or ~/.local/state/araopt).", regex=_NON_EMPTY, gcs_only=True, metavar="URI",
    ),
)

OPTIONS_BY_JOB: Final[dict[str, tuple[CliOption, ...]]] = {"nightly": NIGHTLY_OPTIONS, "measure": MEASURE_OPTIONS}


def parse_bool(value: str | bool) -> bool:
    """``true``/``false`` (any case, also 1/0/yes/no) → bool; argparse type for switches."""
    if isinstance(value, bool):
        return value
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def resolve_as_of(value: str, today: _dt.date | None = None) -> str:
    """Turn ``today``/``yesterday`` (UTC) into YYYY-MM-DD; validate explicit dates."""
    today = today or _dt.datetime.now(_dt.UTC).date()
    if value == "today":
        return today.isoformat()
    if value == "yesterday":
        return (today - _dt.timedelta(days=1)).isoformat()
    try:
        return _dt.date.fromisoformat(value).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected YYYY-MM-DD, 'today' or 'yesterday', got {value!r}") from None


def _typed(option: CliOption) -> Callable[[str], object]:
    converters = {"str": str, "int": int, "float": float}
    pattern = re.compile(option.regex) if option.regex else None
    convert = converters[option.type]

    def parse(text: str) -> object:
        if pattern is not None and not pattern.fullmatch(text):
            raise argparse.ArgumentTypeError(f"{text!r} does not match {option.regex}")
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {option.type}, got {text!r}") from None

    parse.__name__ = option.type  # argparse shows it in "invalid <name> value" messages
    return parse


def add_options(parser: argparse.ArgumentParser, options: tuple[CliOption, ...]) -> None:
    """Add ``options`` to ``parser`` with both spellings (``--as-of`` and ``--as_of``).

    Values are checked against each option's regex and converted to its type. Required options are
    argparse-required; optional ones default to None (switches to False). Beam's own options are not
    declared here: parse with ``parse_known_args`` and hand the rest to PipelineOptions.
    """
    for option in options:
        names = [option.flag] if option.flag == option.template_flag else [option.flag, option.template_flag]
        if option.type == "bool":
            parser.add_argument(
                *names, dest=option.name, nargs="?", const=True, default=False, type=parse_bool,
                metavar="true|false", help=option.help,
            )
        else:
            parser.add_argument(
                *names, dest=option.name, required=option.required, default=None, type=_typed(option),
                metavar=option.metavar, help=option.help,
            )
