"""The objective of Alg. 5 is one enum with one default: ``constants.OBJECTIVE`` (what tuning minimises),
and where only the paper's error models apply (Thm. 4.2 / Relaxation 4.5) ``OBJECTIVE.error_model``.
Its values are the strings files and command lines always used."""
from __future__ import annotations

import importlib
import inspect
import json
import pkgutil

import pytest

import araopt
from araopt.constants import OBJECTIVE, Objective
from araopt.errors import InvalidParameters
from araopt.optimize.error_model import ERROR_MODELS, check_error_model
from araopt.optimize.search import check_objective


def test_the_values_are_the_strings_files_and_flags_use():
    assert [str(o) for o in Objective] == ["exact", "relaxed", "corrected"]
    assert json.dumps({"objective": Objective.CORRECTED}) == '{"objective": "corrected"}'
    assert check_objective("relaxed") is Objective.RELAXED


def test_the_corrected_objective_models_its_capped_estimate_exactly():
    """Sec. 4: the corrected estimator divides Alg. 4's estimate, whose error is Thm. 4.2's."""
    assert Objective.CORRECTED.error_model is Objective.EXACT
    assert Objective.EXACT.error_model is Objective.EXACT
    assert Objective.RELAXED.error_model is Objective.RELAXED
    assert OBJECTIVE is Objective.CORRECTED


def test_the_error_models_refuse_the_corrected_objective_and_unknown_names():
    assert ERROR_MODELS == (Objective.EXACT, Objective.RELAXED)
    with pytest.raises(InvalidParameters, match="objective must be one of"):
        check_error_model(Objective.CORRECTED)
    with pytest.raises(InvalidParameters, match="objective must be one of"):
        check_objective("approximate")


def _objective_defaults() -> list[tuple[str, object]]:
    found = []
    for info in pkgutil.walk_packages(araopt.__path__, "araopt."):
        module = importlib.import_module(info.name)
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ != info.name:
                continue
            for p in inspect.signature(fn).parameters.values():
                if p.name in ("objective", "kind") and "Objective" in str(p.annotation):
                    found.append((f"{info.name}.{name}({p.name})", p.default))
    return found


def test_every_default_objective_is_the_one_default():
    """No function defaults its objective to a literal: the default is OBJECTIVE, or its error model
    where only the paper's error models apply."""
    defaults = _objective_defaults()
    assert len(defaults) >= 10  # tune, optimize, the error models, the baselines, the evaluation
    wrong = [(where, d) for where, d in defaults
             if d is not inspect.Parameter.empty and d not in (OBJECTIVE, OBJECTIVE.error_model)]
    assert not wrong
    assert all(d is inspect.Parameter.empty or isinstance(d, Objective) for _, d in defaults)


def test_the_command_line_offers_every_objective_and_defaults_to_the_one_default():
    from pipelines import options

    parser = options.build_parser("optimize")
    action = next(a for a in parser._actions if a.dest == "objective")
    assert action.default is OBJECTIVE
    assert set(action.choices) == set(Objective)
