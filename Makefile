# The two commands: `make demo` runs the main job, `make test` runs the tests.
# Both create .venv in the repo if it is missing and install meshcast into it.
VENV   := .venv
PY     := $(VENV)/bin/python
# The pinned CPU build used for development and CI (see DEVELOPERS.md / README for GPU installs).
TORCH  := torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/meshcast demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q --durations=15

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache .hypothesis
