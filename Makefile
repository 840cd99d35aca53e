# Two entry points (see README): `make demo` runs the main job end to end, `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= demo-output

.PHONY: venv demo test test-fast lint docs bench clean

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m pipelines.demo --output $(DEMO_DIR)

test: venv
	@$(PY) -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected" >&2; exit 1; fi; exit $$rc

# The fast lane: the core and transform unit tests on both cores, without the end-to-end jobs (marked slow), the
# Monte-Carlo, distribution and brute-force checks (statistical) and the plots (rendering); `make test` runs them all.
test-fast: venv
	@$(PY) -m pytest -q -m "not slow and not statistical and not rendering" -n 2; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected" >&2; exit 1; fi; exit $$rc

# Static checks (configuration in pyproject.toml): ruff on the whole tree, mypy on araopt/ (strict), transforms/,
# pipelines/, and the import contracts of the layers (import-linter).
lint: venv
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# The manual (docs/, mkdocs.yml) built strictly into site/: a broken link, anchor or a page missing from the nav fails
# (not --quiet: it hides the warnings that --strict turns into failures).
docs: venv
	$(PY) -m mkdocs build --strict

bench: venv
	$(PY) benchmarks/core.py

.PHONY: mutation
# Mutation testing of the privacy-critical core (docs/mutation.md; ~1 h on one core; not run by CI).
# Runs in a private temporary copy; e.g. `make mutation MUTATION_ARGS="bounding noise"`.
mutation: venv
	$(PY) tools/mutation.py $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache site
