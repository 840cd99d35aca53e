"""The jobs' command-line plumbing, stdlib only (so `araopt <command> --help` needs no heavy import):
one-line errors, the parser class every command uses."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, NoReturn, Sequence


class UserError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


TRACEBACK_FLAG = "--traceback"


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
        print(f"{prog}: error: {_first_line(exc)}", file=sys.stderr)
        return 2


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (no usage dump), exit code 2, and which never takes
    an abbreviation of an option for the option (``--sim 3`` is not ``--simulation-seed 3``)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.add_argument(TRACEBACK_FLAG, action="store_true", help="on failure, also print the Python traceback")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def run_parsed(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
               body: Callable[[argparse.Namespace], int]) -> int:
    """Parse ``argv`` with ``parser`` and run ``body(args)`` under :func:`cli_main`'s error handling."""
    return cli_main(lambda a: body(parser.parse_args(a)), argv, parser.prog)


