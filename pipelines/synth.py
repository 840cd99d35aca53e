"""CLI for the data module: ``synth``, ``fit-synthetic``, ``split`` and ``load-criteo`` (Sec. 5.2-5.3).

Each ``run_*`` takes argv (without the subcommand) and returns an exit code: 0 on success, and 2 on
bad input, with a one-line ``araopt <cmd>: error: ...`` on stderr and no traceback.
``python -m pipelines.synth <subcommand> ...`` runs the same functions.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from datetime import date
from typing import Callable, Sequence

from araopt import criteo, split, synthetic

from .options import OneLineParser, run_parsed

_Parser = OneLineParser
_run = run_parsed


def _positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return x


def _positive_int(text: str) -> int:
    try:
        x = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if x < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return x


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a YYYY-MM-DD date: {text!r}") from None


# ---------------------------------------------------------------------------------------------- synth

_PRESET_LINES = "\n".join(
    f"  {p.name:<18} b={p.b:<5g} lam={p.lam:<3g} mu={p.mu:<5g} sigma={p.sigma:<5g} "
    f"~{synthetic.expected_sizes(p)['conversions']:,.0f} conversions/split at scale 1"
    for p in synthetic.PRESETS.values()
)

SYNTH_EPILOG = f"""\
model (paper Sec. 5.3): 256 slices (campaignId 16 x geography 8 x productCategory 2);
  impressions per slice ~ PowerLaw(b, k_min, k_max) (Def. 5.1, exact sampler by default);
  conversions per impression ~ Poisson(lam), zero-conversion impressions leave no row;
  conversionType ~ uniform{{0..4}}; value ~ LogNormal(mu, sigma).
presets (Table synthetic-datasets; k_min=1, k_max=10000, 30-day attribution window):
{_PRESET_LINES}
--scale S multiplies the power-law support: k_min' = max(1, round(S*k_min)),
  k_max' = max(k_min', round(S*k_max)); b, lam, mu, sigma are unchanged. Expected size grows
  about linearly in S (exactly so for b near 0; synth-criteo E[impressions/slice] is 1.44 at S=1
  and 20.3 at S=10). The expected size is printed before generating.
--target-conversions N picks the smallest S whose expected conversions per split reach N.
output: OUT/train/ and OUT/test/ (independent draws of the same seed), each with
  part-NNNNN.parquet (flat; impressions on --start-date) or, with --days N,
  date=YYYY-MM-DD/part-NNNNN.parquet. An impression and all its conversions are in the
  partition of the impression date; conversions fall within the attribution window after the
  impression. OUT/<split>/_manifest.json records the parameters and sizes.
  Schema: schemas/conversion_log.arrow.json. An OUT that already holds data is refused unless
  --overwrite, which then replaces only the split directories.
"""


def build_synth_parser(prog: str = "araopt synth") -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description="Generate a synthetic conversion log (train and test).",
                epilog=SYNTH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", required=True,
                   help=f"preset name ({', '.join(synthetic.PRESETS)}) or a preset .json written by fit-synthetic")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--scale", type=_positive_float, default=None,
                      help="multiply the power-law support [k_min, k_max] by this factor (default 1; see below)")
    size.add_argument("--target-conversions", type=_positive_float, default=None,
                      help="choose the scale whose expected conversions per split reach this number")
    p.add_argument("--seed", type=int, default=0, help="RNG seed (default 0); the same seed and options give the same rows")
    p.add_argument("--out", required=True, help="output directory (gets train/ and test/)")
    p.add_argument("--days", type=_positive_int, default=None,
                   help="date-partition the output over N days starting at --start-date (date=YYYY-MM-DD/)")
    p.add_argument("--start-date", type=_date, default=synthetic.DEFAULT_START_DATE,
                   help=f"first impression date, YYYY-MM-DD (default {synthetic.DEFAULT_START_DATE})")
    p.add_argument("--split", choices=("both", "train", "test"), default="both",
                   help="which split(s) to write (default both)")
    p.add_argument("--b", type=float, default=None, help="override the power-law shape b (> 0)")
    p.add_argument("--lam", type=float, default=None, help="override the Poisson rate lam (>= 0)")
    p.add_argument("--mu", type=float, default=None, help="override the log-normal mu")
    p.add_argument("--sigma", type=float, default=None, help="override the log-normal sigma (> 0)")
    p.add_argument("--k-min", type=int, default=None, help="override the power-law k_min (>= 1; preset default 1)")
    p.add_argument("--k-max", type=int, default=None,
                   help="override the power-law k_max (>= k_min; preset default 10000)")
    p.add_argument("--window-days", type=int, default=None, help="override the attribution window (default 30)")
    p.add_argument("--power-law-sampler", choices=("exact", "clauset"), default="exact",
                   help="exact: Def. 5.1 by inverse CDF (default); clauset: the paper's Clauset et al. "
                        "App. D continuous approximation (biased for small k, see araopt/synthetic.py)")
    p.add_argument("--chunk-rows", type=_positive_int, default=1_000_000,
                   help="rows per in-memory chunk / Parquet row group (bounds memory; default 1000000)")
    p.add_argument("--rows-per-file", type=_positive_int, default=8_000_000,
                   help="start a new part file after this many rows (default 8000000)")
    p.add_argument("--max-conversions", type=_positive_float, default=2e9,
                   help="refuse when the expected conversions per split exceed this (default 2e9)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT/train and OUT/test if present")
    return p


def run_synth(argv: Sequence[str] | None = None) -> int:
    parser = build_synth_parser()

    def body(a: argparse.Namespace) -> int:
        preset = synthetic.get_preset(a.preset)
        overrides = {k: v for k, v in (("b", a.b), ("lam", a.lam), ("mu", a.mu), ("sigma", a.sigma),
                                       ("k_min", a.k_min), ("k_max", a.k_max),
                                       ("attribution_window_days", a.window_days)) if v is not None}
        if overrides:
            preset = dataclasses.replace(preset, **overrides)  # re-validates
        scale = (synthetic.scale_for_target_conversions(preset, a.target_conversions)
                 if a.target_conversions is not None else (a.scale or 1.0))
        expected = synthetic.expected_sizes(preset, scale)
        if expected["conversions"] > a.max_conversions:
            raise ValueError(f"expected {expected['conversions']:.3g} conversions per split exceeds "
                             f"--max-conversions {a.max_conversions:.3g}; lower --scale")
        splits = synthetic.SPLITS if a.split == "both" else (a.split,)
        synthetic.check_output_dir(a.out, splits, a.overwrite)
        print(f"{preset.name}: scale {scale:.6g} -> support [{expected['k_min']}, {expected['k_max']}], "
              f"expected {expected['impressions']:,.0f} impressions and {expected['conversions']:,.0f} "
              f"conversions per split", file=sys.stderr)
        manifests = synthetic.write_synthetic(
            a.out, preset, seed=a.seed, scale=scale, days=a.days, splits=splits, start_date=a.start_date,
            overwrite=a.overwrite, chunk_rows=a.chunk_rows, max_rows_per_file=a.rows_per_file,
            power_law_method=a.power_law_sampler)
        for s, m in manifests.items():
            print(json.dumps({"split": s, "out": f"{a.out}/{s}", "impressions": m["impressions"],
                              "conversions": m["conversions"], "files": len(m["files"])}))
        return 0

    return _run(parser, argv, body)


# ---------------------------------------------------------------------------------------------- fit

def build_fit_parser(prog: str = "araopt fit-synthetic") -> argparse.ArgumentParser:
    p = _Parser(prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Fit the Sec. 5.3 model (b, lam, mu, sigma) to a conversion log by maximum likelihood "
                            "and write a preset JSON that `araopt synth --preset FILE` accepts.",
                epilog="b: MLE over distinct impressions per slice, support [min, max] observed (or --k-min/--k-max);\n"
                       "lam: zero-truncated Poisson MLE (zero-conversion impressions are unobserved);\n"
                       "mu, sigma: MLE of log(value) over values > 0. Standard errors go in the file's \"fit\" key.")
    p.add_argument("--input", required=True, help="conversion log: a Parquet file or directory (searched recursively)")
    p.add_argument("--out", required=True, help="preset JSON file to write")
    p.add_argument("--name", default="fitted", help="preset name stored in the file (default 'fitted')")
    p.add_argument("--slice-columns", default=",".join(synthetic.IMPRESSION_FEATURE_NAMES),
                   help="comma-separated impression features defining a slice (default campaignId,geography,"
                        "productCategory; partner_id for Criteo)")
    p.add_argument("--value-column", default="value", help="value column (default value)")
    p.add_argument("--impression-column", default="impression_id", help="impression key column (default impression_id)")
    p.add_argument("--k-min", type=int, default=None, help="known power-law k_min (default: the smallest slice)")
    p.add_argument("--k-max", type=int, default=None, help="known power-law k_max (default: the largest slice)")
    p.add_argument("--window-days", type=int, default=30, help="attribution window stored in the preset (default 30)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    return p


def run_fit_synthetic(argv: Sequence[str] | None = None) -> int:
    parser = build_fit_parser()

    def body(a: argparse.Namespace) -> int:
        if os.path.exists(a.out) and not a.overwrite:
            raise ValueError(f"{a.out} already exists; pass --overwrite to replace it")
        slices = [c.strip() for c in a.slice_columns.split(",") if c.strip()]
        fit = synthetic.fit_synthetic_report(
            a.input, name=a.name, slice_columns=slices, value_column=a.value_column,
            impression_column=a.impression_column, k_min=a.k_min, k_max=a.k_max,
            attribution_window_days=a.window_days)
        synthetic.save_preset(fit.preset, a.out, fit=fit.diagnostics(), overwrite=a.overwrite)
        p, se = fit.preset, fit.stderr
        print(json.dumps({"out": a.out, "b": p.b, "lam": p.lam, "mu": p.mu, "sigma": p.sigma, "k_min": p.k_min,
                          "k_max": p.k_max, "stderr": se, "slices": fit.n_slices,
                          "impressions": fit.n_impressions, "conversions": fit.n_conversions}))
        for note in fit.notes:
            print(f"{parser.prog}: note: {note}", file=sys.stderr)
        return 0

    return _run(parser, argv, body)


# ---------------------------------------------------------------------------------------------- split

def build_split_parser(prog: str = "araopt split") -> argparse.ArgumentParser:
    p = _Parser(prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Time-based split of a conversion log: train = earlier rows, test = later rows.",
                epilog="train: time < cut; test: time >= cut. With --train-fraction q the cut is the time at\n"
                       "sorted position round(q*n) (equal times stay together). Writes OUT/train/ and OUT/test/.")
    p.add_argument("--input", required=True, help="conversion log: a Parquet file or directory")
    p.add_argument("--out", required=True, help="output directory (gets train/ and test/)")
    rule = p.add_mutually_exclusive_group()
    rule.add_argument("--train-fraction", type=float, default=None,
                      help="fraction of rows (by time) that go to train, 0 < q < 1 (default 0.5)")
    rule.add_argument("--cut-time", default=None, help="explicit cut, ISO-8601 (naive = UTC), e.g. 2024-01-15T00:00:00Z")
    p.add_argument("--time-column", default="conversion_time",
                   help="timestamp column to split on (default conversion_time; impression_time keeps impressions whole)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT/train and OUT/test if present")
    return p


def run_split(argv: Sequence[str] | None = None) -> int:
    parser = build_split_parser()

    def body(a: argparse.Namespace) -> int:
        cut = split.parse_cut_time(a.cut_time) if a.cut_time is not None else None
        fraction = None if cut is not None else (0.5 if a.train_fraction is None else a.train_fraction)
        result = split.split_by_time(a.input, a.out, train_fraction=fraction, cut_time=cut,
                                     time_column=a.time_column, overwrite=a.overwrite)
        print(json.dumps({"out": a.out, **result.as_dict()}))
        return 0

    return _run(parser, argv, body)


# ---------------------------------------------------------------------------------------------- criteo

def build_load_criteo_parser(prog: str = "araopt load-criteo") -> argparse.ArgumentParser:
    p = _Parser(prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Convert the Criteo Sponsored Search Conversion Log (23 tab-separated columns, no header, "
                            "-1 = missing) into the conversion-log contract.",
                epilog="slice: partner_id; values: product_price_x_sale, SalesAmountInEuro; one row per click\n"
                       "(count limit 1). Rows whose value is unknown go to OUT/_dead_letters-*.parquet with the\n"
                       "line number and reason. See araopt/criteo.py for the exact mapping.")
    p.add_argument("--input", required=True, help="Criteo TSV file (.gz/.bz2 accepted)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--include-non-converting", action="store_true",
                   help="keep Sale=0 clicks (value 0, conversion_time = click time); default: converted rows only")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it is an earlier araopt output")
    return p


def run_load_criteo(argv: Sequence[str] | None = None) -> int:
    parser = build_load_criteo_parser()

    def body(a: argparse.Namespace) -> int:
        stats = criteo.convert_criteo(a.input, a.out, include_non_converting=a.include_non_converting,
                                      overwrite=a.overwrite)
        print(json.dumps({"out": a.out, **stats.as_dict()}))
        return 0

    return _run(parser, argv, body)


COMMANDS: dict[str, Callable[[Sequence[str] | None], int]] = {
    "synth": run_synth, "fit-synthetic": run_fit_synthetic, "split": run_split, "load-criteo": run_load_criteo,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        usage = f"usage: python -m pipelines.synth {{{','.join(COMMANDS)}}} ..."
        if argv and argv[0] not in ("-h", "--help"):
            print(f"pipelines.synth: error: unknown command {argv[0]!r}; {usage}", file=sys.stderr)
            return 2
        print(usage)
        return 0 if argv else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
