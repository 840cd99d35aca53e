"""`araopt` command line: thin dispatch to the pipelines (each parses its own options).

Subcommands: measure, optimize, evaluate, nightly, synth, fit-synthetic, split, load-criteo,
export-ara, reconstruct, demo. Errors in user input print one line and exit with status 2.
"""
from __future__ import annotations

import importlib
import sys

# subcommand -> (module, function, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "measure": ("pipelines.measure", "run", "simulate an ARA summary report for a conversion log and reconstruct estimates (Beam)"),
    "optimize": ("pipelines.optimize", "run_optimize", "choose C, clip thresholds and budget fractions on history (Alg. 6)"),
    "evaluate": ("pipelines.evaluate", "run_evaluate", "expected test RMSRE_tau of optimized parameters vs baselines, with plots"),
    "nightly": ("pipelines.nightly", "run", "re-optimize on the last N days and publish to a parameter store"),
    "synth": ("pipelines.synth", "run_synth", "generate the paper's synthetic conversion logs (Sec. 5.3)"),
    "fit-synthetic": ("pipelines.synth", "run_fit_synthetic", "fit a synthetic preset (b, lambda, mu, sigma) to a conversion log"),
    "split": ("pipelines.synth", "run_split", "time-based train/test split of a conversion log"),
    "load-criteo": ("pipelines.synth", "run_load_criteo", "convert the Criteo Sponsored Search Conversion Log to the contract"),
    "export-ara": ("pipelines.ara", "run_export_ara", "ARA source/trigger registration JSON and output domain from parameters"),
    "reconstruct": ("pipelines.ara", "run_reconstruct", "estimates from an Aggregation Service summary report (Avro)"),
    "demo": ("pipelines.demo", "run", "the README's main job: synthetic history -> nightly -> measure"),
}


def usage() -> str:
    lines = ["usage: araopt <command> [options]   (araopt <command> --help for details)", "", "commands:"]
    lines += [f"  {name:<14} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"araopt: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, func_name, _ = COMMANDS[name]
    module = importlib.import_module(module_name)
    return int(getattr(module, func_name)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
