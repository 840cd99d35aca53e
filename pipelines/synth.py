"""The data commands: ``synth``, ``fit-synthetic``, ``split`` and ``load-criteo`` (Sec. 5.2-5.3).

Options come from the registry (``pipelines.options``). Each ``run_*`` takes argv (without the
subcommand), prints one sentence and returns 0; bad input is one ``araopt <cmd>: error: ...`` line on
stderr and exit status 2. ``python -m pipelines.synth <subcommand> ...`` runs the same functions.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from araopt.errors import InvalidParameters

from . import options
from .values import split_columns

# ---------------------------------------------------------------------------------------------- synth

def run_synth(argv: Sequence[str] | None = None) -> int:
    def body(a: argparse.Namespace, _: list[str]) -> int:
        from araopt.data import synthetic
        from araopt.io.folders import check_parent_folder

        preset = synthetic.get_preset(a.preset)
        overrides = {k: v for k, v in (("b", a.b), ("lam", a.lam), ("mu", a.mu), ("sigma", a.sigma),
                                       ("k_min", a.k_min), ("k_max", a.k_max),
                                       ("attribution_window_days", a.attribution_window_days),
                                       ("impressions_per_user", a.impressions_per_user)) if v is not None}
        if overrides:
            preset = dataclasses.replace(preset, **overrides)  # re-validates
        scale = (synthetic.scale_for_target_conversions(preset, a.target_conversions)
                 if a.target_conversions is not None else (a.scale or 1.0))
        expected = synthetic.expected_sizes(preset, scale)
        if expected["conversions"] > a.max_conversions:
            raise InvalidParameters(f"expected {expected['conversions']:.3g} conversions per split exceeds "
                                    f"--max-conversions {a.max_conversions:.3g}; lower --scale")
        splits = synthetic.SPLITS if a.split == "both" else (a.split,)
        check_parent_folder(a.output, splits, a.overwrite)
        print(f"{preset.name}: scale {scale:.6g} -> support [{expected['k_min']}, {expected['k_max']}], "
              f"expected {expected['impressions']:,.0f} impressions and {expected['conversions']:,.0f} "
              f"conversions per split", file=sys.stderr)
        manifests = synthetic.write_synthetic(
            a.output, preset, seed=a.seed, scale=scale, days=a.days, splits=splits, start_date=a.start_date,
            overwrite=a.overwrite, chunk_rows=a.chunk_rows, max_rows_per_file=a.rows_per_file,
            power_law_method=a.power_law_sampler, by_conversion_date=a.partition_by == "conversion-date")
        written = "; ".join(f"{s}: {m['conversions']:,} conversions of {m['impressions']:,} impressions in "
                            f"{len(m['files'])} file(s)" for s, m in manifests.items())
        print(f"araopt synth: wrote {preset.name} (seed {a.seed}) under {a.output}: {written} "
              f"(sizes in each split's _manifest.json)")
        return 0

    return options.run_command("synth", body, argv)


# ---------------------------------------------------------------------------------------------- fit

def run_fit_synthetic(argv: Sequence[str] | None = None) -> int:
    def body(a: argparse.Namespace, _: list[str]) -> int:
        from araopt.data import synthetic
        from araopt.data.fit import fit_synthetic_report
        from araopt.io.folders import check_output_file

        check_output_file(a.output, a.overwrite)
        values = split_columns(a.values, "--values")
        if len(values) != 1:
            raise InvalidParameters(f"fit-synthetic models one value column, got --values {a.values!r}")
        fit = fit_synthetic_report(
            a.input, name=a.name, slice_columns=list(split_columns(a.slices, "--slices")),
            value_column=values[0], impression_column=a.impression_column, k_min=a.k_min, k_max=a.k_max,
            attribution_window_days=a.attribution_window_days)
        synthetic.save_preset(fit.preset, a.output, fit=fit.diagnostics(), overwrite=a.overwrite)
        p = fit.preset
        for note in fit.notes:
            print(f"araopt fit-synthetic: note: {note}", file=sys.stderr)
        print(f"araopt fit-synthetic: wrote preset {p.name!r} to {a.output}: b = {p.b:.4g}, lam = {p.lam:.4g}, "
              f"mu = {p.mu:.4g}, sigma = {p.sigma:.4g} (k in [{p.k_min}, {p.k_max}]) from {fit.n_conversions:,} "
              f"conversions of {fit.n_impressions:,} impressions in {fit.n_slices:,} slices (standard errors in the file)")
        return 0

    return options.run_command("fit-synthetic", body, argv)


# ---------------------------------------------------------------------------------------------- split

def run_split(argv: Sequence[str] | None = None) -> int:
    def body(a: argparse.Namespace, _: list[str]) -> int:
        from araopt.data import split

        cut = split.parse_cut_time(a.cut_time) if a.cut_time is not None else None
        fraction = None if cut is not None else (0.5 if a.train_fraction is None else a.train_fraction)
        result = split.split_by_time(a.input, a.output, train_fraction=fraction, cut_time=cut,
                                     time_column=a.time_column, overwrite=a.overwrite)
        print(f"araopt split: {result.train_rows:,} rows before {result.cut_time.isoformat()} ({result.time_column}) "
              f"to {a.output}/train, {result.test_rows:,} from then on to {a.output}/test")
        return 0

    return options.run_command("split", body, argv)


# ---------------------------------------------------------------------------------------------- criteo

def run_load_criteo(argv: Sequence[str] | None = None) -> int:
    def body(a: argparse.Namespace, _: list[str]) -> int:
        from araopt.data import criteo

        stats = criteo.convert_criteo(a.input, a.output, include_non_converting=a.include_non_converting,
                                      overwrite=a.overwrite)
        reasons = ", ".join(f"{k} {v:,}" for k, v in stats.dead_letter_reasons.items()) or "none"
        print(f"araopt load-criteo: {stats.lines:,} lines -> {stats.conversions:,} conversions in {a.output} "
              f"({stats.non_converting_kept:,} non-converting clicks kept, {stats.non_converting_dropped:,} dropped); "
              f"{stats.dead_letters:,} dead letters ({reasons}) in {a.output}/_dead_letters-*.parquet")
        return 0

    return options.run_command("load-criteo", body, argv)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipelines.synth <subcommand> ...``: the same as ``araopt <subcommand> ...``."""
    return options.subcommand_main("pipelines.synth", {"synth": run_synth, "fit-synthetic": run_fit_synthetic,
                                                       "split": run_split, "load-criteo": run_load_criteo}, argv)


if __name__ == "__main__":
    sys.exit(main())
