"""Mutation testing of araopt's privacy-critical core (``make mutation``; not run by CI).

A small AST mutator (see docs/mutation.md). For each module it enumerates mutants with these
operators (the mutmut 3 families that change behaviour, plus dropped assignments and arguments):

* comparison flips ``<``/``<=``, ``>``/``>=``, ``==``/``!=``, ``is``/``is not``, ``in``/``not in``;
* arithmetic and bit swaps ``+``/``-``, ``*``/``/``, ``//`` -> ``/``, ``%`` -> ``/``, ``**`` -> ``*``,
  ``<<``/``>>``, ``&``/``|``, ``^`` -> ``&`` (also in augmented assignments), ``x op= y`` -> ``x = y``;
* ``and``/``or``, dropped ``not``, dropped unary minus, ``True``/``False``, ``break``/``continue``;
* ``min``/``max`` swaps (builtins and numpy: minimum/maximum, min/max, argmin/argmax, amin/amax);
* dropped assignments and expression statements (-> ``pass``), dropped call arguments (each
  positional or keyword argument in turn), negated ``if``/``while``/ternary conditions;
* numeric constants +1 and -1, string constants outside ``raise`` -> ``"XX" + s + "XX"``.

Docstrings, annotations, imports and ``raise`` messages are not mutated. Every mutant is run in a
forked child of one warm parent (numpy, scipy, hypothesis, pytest imported once): the child serves
the mutated source for the module through an import hook and runs ``pytest -x`` on the module's
test files with ``HYPOTHESIS_PROFILE=mutation`` (derandomized, ``database=None``: a fresh, empty
hypothesis database for every mutant, so one mutant's failing example never leaks into the next).
A mutant is *killed* if the tests fail (or time out, or the module fails to import), *survived*
if they pass. Everything runs in a private temporary copy of the checkout, never in the tree.

Usage::

    python tools/mutation.py                      # all five modules
    python tools/mutation.py bounding noise       # some modules
    python tools/mutation.py --json out.json      # also write every mutant's outcome
    python tools/mutation.py --root /tmp/snapshot # mutate another checkout (e.g. an old commit)
"""
from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import importlib.abc
import importlib.util
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

MODULES: dict[str, dict] = {
    "mechanism.bounding": {"tests": ["tests/test_bounding.py", "tests/test_lifetime_budget.py"]},
    "mechanism.lifetime": {"tests": ["tests/test_lifetime_budget.py"]},
    "mechanism.noise": {"tests": ["tests/test_noise.py"]},
    "mechanism.encoding": {"tests": ["tests/test_encoding.py"]},
    "mechanism.report": {"tests": ["tests/test_report.py", "tests/test_mechanism.py"]},
    "optimize.error_model": {"tests": ["tests/test_error_model.py", "tests/test_mechanism.py"],
                             "functions": ["rmsre_tau"]},
}
"""Module (below araopt/, dotted; its last part alone also names it) -> the test files run against its
mutants (missing files are skipped) and, optionally,
the only functions whose bodies are mutated."""

def _source_path(root: Path, module: str) -> Path:
    return root / "araopt" / (module.replace(".", "/") + ".py")


def _module_name(name: str) -> str:
    """A module of ``MODULES`` by its dotted name or its last part (``bounding``)."""
    return next((m for m in MODULES if name in (m, m.rsplit(".", 1)[-1])), name)


EQUIVALENTS_FILE = REPO / "docs" / "mutation.md"
"""Mutants judged equivalent are listed there as ``- `` <key> `` — reason`` lines."""

CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
            ast.Mod: ast.Div, ast.Pow: ast.Mult, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
            ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitAnd}
MINMAX = {"min": "max", "max": "min", "minimum": "maximum", "maximum": "minimum", "amin": "amax",
          "amax": "amin", "argmin": "argmax", "argmax": "argmin", "fmin": "fmax", "fmax": "fmin"}
SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
          ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
          ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>",
          ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.And: "and", ast.Or: "or"}


@dataclasses.dataclass
class Mutant:
    module: str
    index: int  # position of the node in ast.walk order
    op: str  # operator id understood by ``apply``
    arg: object  # operator argument (which call argument, which comparison, ...)
    line: int
    function: str
    description: str

    @property
    def key(self) -> str:
        """Stable-ish identity: module, function, what changes, and the original code."""
        return f"{self.module}.{self.function}: {self.description}"


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.add(id(body[0]))
        if isinstance(node, (ast.Module, ast.ClassDef)):  # attribute docstrings: a string after an assignment
            for prev, stmt in zip(node.body, node.body[1:], strict=False):
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                        and isinstance(stmt.value.value, str) and isinstance(prev, (ast.Assign, ast.AnnAssign)):
                    out.add(id(stmt))
    return out


def _skipped_subtrees(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: docstrings, annotations, imports, raise statements' messages."""
    skip: set[int] = set()

    def add(sub: ast.AST | None) -> None:
        if sub is not None:
            skip.update(id(n) for n in ast.walk(sub))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            add(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            add(node.returns)
            for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                add(a.annotation)
        elif isinstance(node, ast.AnnAssign):
            add(node.annotation)
        elif isinstance(node, ast.Raise):
            add(node.exc)
    for doc in _docstring_nodes(tree):
        skip.add(doc)
    for node in ast.walk(tree):
        if id(node) in _docstring_nodes(tree):
            add(node)
    return skip


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    out = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            out[id(child)] = node
    return out


def _function_of(node: ast.AST, parents: dict[int, ast.AST]) -> str:
    names = []
    cur = parents.get(id(node))
    while cur is not None:
        if isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(cur.name)
        cur = parents.get(id(cur))
    return ".".join(reversed(names)) or "<module>"


def _short(node: ast.AST, limit: int = 70) -> str:
    text = ast.unparse(node).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def enumerate_mutants(module: str, source: str, functions: list[str] | None = None) -> list[Mutant]:
    tree = ast.parse(source)
    skip = _skipped_subtrees(tree)
    parents = _parents(tree)
    out: list[Mutant] = []
    for index, node in enumerate(ast.walk(tree)):
        if id(node) in skip:
            continue
        func = _function_of(node, parents)
        if functions is not None and func.split(".")[0] not in functions:
            continue
        line = getattr(node, "lineno", 0)

        def add(op: str, arg: object, desc: str, index: int = index, line: int = line, func: str = func) -> None:
            out.append(Mutant(module, index, op, arg, line, func, desc))

        if isinstance(node, ast.Compare):
            for k, cop in enumerate(node.ops):
                if type(cop) in CMP_SWAP:
                    add("cmp", k, f"`{SYMBOL[type(cop)]}` -> `{SYMBOL[CMP_SWAP[type(cop)]]}` in `{_short(node)}`")
        elif isinstance(node, ast.BinOp) and type(node.op) in BIN_SWAP:
            add("bin", None, f"`{SYMBOL[type(node.op)]}` -> `{SYMBOL[BIN_SWAP[type(node.op)]]}` in `{_short(node)}`")
        elif isinstance(node, ast.BoolOp):
            other = "or" if isinstance(node.op, ast.And) else "and"
            add("boolop", None, f"`{SYMBOL[type(node.op)]}` -> `{other}` in `{_short(node)}`")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            add("unary", None, f"drop `{'not' if isinstance(node.op, ast.Not) else '-'}` in `{_short(node)}`")
        elif isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool):
                add("const", not v, f"`{v}` -> `{not v}` in `{_short(parents[id(node)])}`")
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                ctx = _short(parents[id(node)])
                add("const", v + 1, f"`{v!r}` -> `{v + 1!r}` in `{ctx}`")
                add("const", v - 1, f"`{v!r}` -> `{v - 1!r}` in `{ctx}`")
            elif isinstance(v, str) and not isinstance(parents.get(id(node)), ast.JoinedStr):
                add("const", "XX" + v + "XX", f"string {v!r} -> {'XX' + v + 'XX'!r} in `{_short(parents[id(node)])}`")
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in MINMAX:
                add("minmax", None, f"`{name}` -> `{MINMAX[name]}` in `{_short(node)}`")
            for k, a in enumerate(node.args):
                add("dropargpos", k, f"drop argument `{_short(a, 40)}` of `{_short(node)}`")
            for k, kw in enumerate(node.keywords):
                add("dropargkw", k, f"drop keyword `{_short(kw, 40)}` of `{_short(node)}`")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            if isinstance(parents.get(id(node)), ast.Module) and not isinstance(node, ast.Expr):
                pass  # dropping a module-level definition only raises NameError
            else:
                add("drop", None, f"drop statement `{_short(node)}`")
            if isinstance(node, ast.AugAssign):
                if type(node.op) in BIN_SWAP:
                    add("augop", None,
                        f"`{SYMBOL[type(node.op)]}=` -> `{SYMBOL[BIN_SWAP[type(node.op)]]}=` in `{_short(node)}`")
                add("augassign", None, f"`{SYMBOL.get(type(node.op), '?')}=` -> `=` in `{_short(node)}`")
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            add("negate", None, f"negate condition `{_short(node.test)}`")
        elif isinstance(node, (ast.Break, ast.Continue)):
            add("breakcont", None, f"`{'break' if isinstance(node, ast.Break) else 'continue'}` swapped")
    return out


def apply(source: str, mutant: Mutant) -> str:
    tree = ast.parse(source)
    node = list(ast.walk(tree))[mutant.index]
    parents = _parents(tree)
    op, arg = mutant.op, mutant.arg
    if op == "cmp":
        node.ops[arg] = CMP_SWAP[type(node.ops[arg])]()
    elif op == "bin":
        node.op = BIN_SWAP[type(node.op)]()
    elif op == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif op == "unary":
        _replace(parents[id(node)], node, node.operand)
    elif op == "const":
        node.value = arg
    elif op == "minmax":
        if isinstance(node.func, ast.Attribute):
            node.func.attr = MINMAX[node.func.attr]
        else:
            node.func.id = MINMAX[node.func.id]
    elif op == "dropargpos":
        del node.args[arg]
    elif op == "dropargkw":
        del node.keywords[arg]
    elif op == "drop":
        _replace(parents[id(node)], node, ast.Pass())
    elif op == "augop":
        node.op = BIN_SWAP[type(node.op)]()
    elif op == "augassign":
        target = copy.deepcopy(node.target)
        target.ctx = ast.Store()
        _replace(parents[id(node)], node, ast.Assign(targets=[target], value=node.value, lineno=node.lineno))
    elif op == "negate":
        node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
    elif op == "breakcont":
        _replace(parents[id(node)], node, ast.Continue() if isinstance(node, ast.Break) else ast.Break())
    else:
        raise ValueError(op)
    return ast.unparse(ast.fix_missing_locations(tree))


def _replace(parent: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for field, value in ast.iter_fields(parent):
        if isinstance(value, list):
            for k, item in enumerate(value):
                if item is old:
                    value[k] = new
                    return
        elif value is old:
            setattr(parent, field, new)
            return
    raise LookupError("node not found in its parent")


# ---- running ------------------------------------------------------------------------------------------
class _MutantFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the mutated source for one module (no bytecode is written)."""

    def __init__(self, fullname: str, source: str, filename: str):
        self.fullname, self.source, self.filename = fullname, source, filename

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.fullname:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=self.filename)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__file__ = self.filename
        exec(compile(self.source, self.filename, "exec"), module.__dict__)


def _warm_imports() -> None:
    """Import the heavy third-party dependencies once in the parent (children inherit them)."""
    import hypothesis
    import hypothesis.extra.numpy  # noqa: F401
    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow
    import pyarrow.parquet  # noqa: F401
    import pytest  # noqa: F401
    import scipy.optimize
    import scipy.stats  # noqa: F401
    for name in ("jsonschema", "fastavro", "randomgen", "tqdm"):
        try:
            __import__(name)
        except ImportError:
            pass


class _FastestFirst:
    """pytest plugin: record each test's duration (unmutated run), then run the fastest tests first
    so that ``-x`` stops a killed mutant early. Only the order changes, never the set of tests."""

    def __init__(self, durations: dict[str, float], record: bool):
        self.durations, self.record = durations, record

    def pytest_collection_modifyitems(self, session, config, items):
        if not self.record:
            items.sort(key=lambda item: self.durations.get(item.nodeid, 0.0))

    def pytest_runtest_logreport(self, report):
        if self.record:
            self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration


def run_one(root: Path, module: str, source: str | None, tests: list[str], timeout: float,
            durations: dict[str, float] | None = None) -> tuple[str, float]:
    """Fork; the child runs pytest -x on ``tests`` with ``source`` (None: unmutated) as araopt.<module>.

    ``durations``: with ``source`` None it is filled with each test's duration (sent back through a
    file); otherwise the tests run fastest first."""
    start = time.monotonic()
    log = root / ".mutation-child.log"
    pid = os.fork()
    if pid == 0:  # child
        try:
            fd = os.open(str(log), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.setpgid(0, 0)
            if source is not None:
                sys.meta_path.insert(0, _MutantFinder(f"araopt.{module}", source, str(_source_path(root, module))))
            import pytest

            plugin = _FastestFirst(dict(durations or {}), record=source is None)
            code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(root), *tests],
                               plugins=[plugin])
            if source is None:
                (root / ".mutation-durations.json").write_text(json.dumps(plugin.durations))
            os._exit(int(code))
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            os._exit(3)
    deadline = start + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return "timeout", time.monotonic() - start
        time.sleep(0.02)
    code = os.waitstatus_to_exitcode(status)
    elapsed = time.monotonic() - start
    if source is None and durations is not None and (root / ".mutation-durations.json").exists():
        durations.update(json.loads((root / ".mutation-durations.json").read_text()))
    if code == 0:
        return "survived", elapsed
    if code == 1:
        return "killed", elapsed
    return f"error({code})", elapsed  # collection/import error, crash: the mutant is detected too


def load_equivalents(path: Path = EQUIVALENTS_FILE) -> dict[str, str]:
    """Lines ``- `` key `` — reason`` of docs/mutation.md's equivalent-mutant lists."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        m = re.match(r"^- `` (.+) `` — (.+)$", line.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


def private_copy(source_root: Path) -> Path:
    dest = Path(tempfile.mkdtemp(prefix="araopt-mutation-"))
    for name in ("araopt", "tests"):
        shutil.copytree(source_root / name, dest / name,
                        ignore=shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc"))
    for name in ("pytest.ini", "setup.py"):
        if (source_root / name).exists():
            shutil.copy2(source_root / name, dest / name)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", metavar="MODULE", help=f"any of {', '.join(MODULES)} (default: all)")
    ap.add_argument("--root", type=Path, default=REPO, help="checkout to mutate (copied first; default: this one)")
    ap.add_argument("--json", type=Path, help="write every mutant's outcome here")
    ap.add_argument("--limit", type=int, help="only the first N mutants per module (smoke test)")
    ap.add_argument("--list", action="store_true", help="only list the mutants")
    ap.add_argument("--match", help="only the mutants whose key contains this text (re-check survivors)")
    args = ap.parse_args(argv)
    modules = [_module_name(m) for m in args.modules] or list(MODULES)
    unknown = sorted(set(modules) - set(MODULES))
    if unknown:
        ap.error(f"unknown module(s) {unknown}; choose from {list(MODULES)}")
    equivalents = load_equivalents()

    if args.list:
        for module in modules:
            src = _source_path(args.root, module).read_text()
            for m in enumerate_mutants(module, src, MODULES[module].get("functions")):
                print(f"{m.line:4d} {m.key}")
        return 0

    root = private_copy(args.root.resolve())
    os.chdir(root)
    sys.path.insert(0, str(root))
    sys.path.insert(1, str(root / "tests"))
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__name__", type(f).__name__).lower()]
    origin = importlib.util.find_spec("araopt").origin
    if not origin or not Path(origin).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"araopt resolves to {origin}, not to the private copy {root}")
    os.environ["HYPOTHESIS_PROFILE"] = "mutation"
    os.environ.setdefault("PYTHONHASHSEED", "0")
    _warm_imports()
    results: list[dict] = []
    summary = []
    try:
        for module in modules:
            cfg = MODULES[module]
            tests = [t for t in cfg["tests"] if (root / t).exists()]
            source = _source_path(root, module).read_text()
            mutants = enumerate_mutants(module, source, cfg.get("functions"))
            if args.match:
                mutants = [m for m in mutants if args.match in m.key]
            if args.limit:
                mutants = mutants[: args.limit]
            durations: dict[str, float] = {}
            outcome, _ = run_one(root, module, None, tests, 900, durations)  # the unmutated module, timed per test
            if outcome == "survived":  # and its unparsed source, which every mutant is a variant of
                outcome, base_time = run_one(root, module, ast.unparse(ast.parse(source)), tests, 900, durations)
            if outcome != "survived":
                print(f"{module}: the unmutated module fails its tests ({outcome}); see {root / '.mutation-child.log'}")
                return 2
            timeout = 3 * base_time + 10
            print(f"== {module}: {len(mutants)} mutants, tests {' '.join(tests)} "
                  f"({base_time:.1f} s, timeout {timeout:.0f} s)", flush=True)
            survivors = []
            counts: dict[str, int] = {}
            for k, m in enumerate(mutants):
                try:
                    mutated = apply(source, m)
                except Exception as exc:  # noqa: BLE001  (e.g. an invalid tree)
                    outcome, elapsed = f"invalid({type(exc).__name__})", 0.0
                else:
                    outcome, elapsed = run_one(root, module, mutated, tests, timeout, durations)
                kind = "survived" if outcome == "survived" else ("invalid" if outcome.startswith("invalid") else "killed")
                counts[kind] = counts.get(kind, 0) + 1
                results.append({"key": m.key, "module": module, "line": m.line, "outcome": outcome,
                                "seconds": round(elapsed, 2), "equivalent": equivalents.get(m.key)})
                if kind == "survived":
                    survivors.append(m)
                if (k + 1) % 50 == 0:
                    print(f"   {k + 1}/{len(mutants)} ({counts})", flush=True)
            valid = len(mutants) - counts.get("invalid", 0)
            killed = counts.get("killed", 0)
            equiv = sum(1 for m in survivors if m.key in equivalents)
            score = 100.0 * killed / valid if valid else 100.0
            adjusted = 100.0 * killed / (valid - equiv) if valid - equiv else 100.0
            summary.append((module, valid, killed, len(survivors), equiv, score, adjusted))
            print(f"-- {module}: {killed}/{valid} killed = {score:.1f}%; {len(survivors)} survive "
                  f"({equiv} listed as equivalent; score without them {adjusted:.1f}%)", flush=True)
            for m in survivors:
                tag = f"EQUIVALENT: {equivalents[m.key]}" if m.key in equivalents else "SURVIVED"
                print(f"   line {m.line:4d}  {tag}\n      `{m.key}`", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    print("\nmodule        mutants  killed  survived  equivalent  score   score excl. equivalent")
    for module, valid, killed, surv, equiv, score, adjusted in summary:
        print(f"{module:<13} {valid:7d} {killed:7d} {surv:9d} {equiv:11d}  {score:5.1f}%  {adjusted:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
