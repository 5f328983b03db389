# One command each: `make run` starts a server on embedded defaults, `make test` runs the suite.
# Both install the project into .venv first when pyproject.toml changed since the last install.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test fuzz lint typecheck bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/headwater serve --host 127.0.0.1 --port 6650 --data-dir ./data

test: $(STAMP)
	$(BIN)/python -m pytest -q

# the randomized admin/pipelining test with many more examples than CI runs
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The long run of the state-machine test (tests/test_statemachine.py): many more examples, and a
# failure is shrunk to a minimal program. HEADWATER_FUZZ_SEED=<n> replays a run.
fuzz: $(STAMP)
	HEADWATER_FUZZ=long $(BIN)/python -m pytest -q -s tests/test_statemachine.py -k test_state_machine --timeout 7200

bench: $(STAMP)
	$(BIN)/python -m loadtest.bench

clean:
	rm -rf $(VENV) build *.egg-info
