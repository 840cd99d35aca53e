"""The ``araopt`` console command: ``araopt <command> [options]`` (``araopt --help``, ``--version``).

Dispatch only. ``araopt <command> --help`` is answered from the option registry
(``pipelines.options``) without importing the command's module (Beam, scipy, pandas), so it is fast.
"""
from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Sequence

from . import options


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("araopt")
    except PackageNotFoundError:  # a source checkout that was not installed
        return "0.1.0 (not installed)"


def usage() -> str:
    lines = ["usage: araopt <command> [options]   (araopt <command> --help for details; araopt --version)",
             "", "commands:"]
    lines += [f"  {name:<14} {spec.summary}" for name, spec in options.COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``araopt <command> [options]``: exit 0 on success, 2 on an error (one line), 130 on Ctrl-C (one line)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    if args[0] in ("--version", "-V"):
        print(f"araopt {version()}")
        return 0
    name, rest = args[0], args[1:]
    spec = options.COMMANDS.get(name)
    if spec is None:
        print(f"araopt: error: unknown command {name!r}; commands: {', '.join(options.COMMANDS)}", file=sys.stderr)
        return 2
    if "-h" in rest or "--help" in rest:  # answered from the registry alone
        return options.cli_main(lambda a: (options.build_parser(name).parse_args(a), 0)[1], rest, f"araopt {name}")
    try:  # importing Beam, scipy and pandas takes seconds: Ctrl-C then is one line too
        module = importlib.import_module(spec.module)
    except KeyboardInterrupt:
        print(f"araopt {name}: interrupted", file=sys.stderr)
        return 130
    # the imported modules' objects (Beam, pandas, scipy) live as long as the command: kept out of the cyclic
    # collector's reach while it runs, a full collection does not traverse them again (~0.45 CPU-s of a
    # 10M-row measure); given back after, for a process that runs several commands (tests)
    gc.freeze()
    try:
        return int(getattr(module, spec.function)(rest) or 0)
    finally:
        gc.unfreeze()


if __name__ == "__main__":
    sys.exit(main())
