# One command each: `make run` starts a server on embedded defaults, `make test` runs the suite.
# Both install the project into .venv first when pyproject.toml changed since the last install.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

BENCH_STAMP := $(VENV)/.installed-bench
RESULTS := loadtest/results
# peers for `make bench-peers`: Debian's packages (nats-server lives in /usr/sbin)
PEER_BINARIES := redis-server nats-server
export PATH := $(PATH):/usr/sbin:/sbin

.PHONY: install run test browser fuzz lint typecheck bench bench-quick bench-peers peer-servers soak loadtest clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/headwater serve --host 127.0.0.1 --port 6650 --data-dir ./data

test: $(STAMP) browser
	$(BIN)/python -m pytest -q

# Debian's chromium, for tests/test_status_page.py (the status page in a headless browser).
# Installed when missing and possible (root, or sudo without a password, and apt-get); when not,
# an error says so, and tests/test_status_page.py fails saying why (never a silent skip).
browser:
	@if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then sudo=""; \
		elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; \
		else sudo=none; fi; \
		if [ "$$sudo" = none ] || ! command -v apt-get >/dev/null 2>&1; then \
			echo "error: chromium is not installed and cannot be installed here (needs root or" \
				"passwordless sudo, and apt-get): tests/test_status_page.py will fail;" \
				"run 'apt-get install chromium' as root to include it" >&2; \
		else \
			echo "installing chromium (Debian package) for tests/test_status_page.py"; \
			$$sudo apt-get update -qq && $$sudo apt-get install -y -qq chromium || \
				echo "error: apt-get could not install chromium (see above):" \
					"tests/test_status_page.py will fail" >&2; \
		fi; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The long run of the state-machine test (tests/test_statemachine.py): many more examples, and a
# failure is shrunk to a minimal program. HEADWATER_FUZZ_SEED=<n> replays a run.
fuzz: $(STAMP)
	HEADWATER_FUZZ=long $(BIN)/python -m pytest -q -s tests/test_statemachine.py -k test_state_machine --timeout 7200

# Benchmarks and load tests need the `bench` extra too (peer clients, matplotlib); locust is in dev.
$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# The full matrix, three runs per row (about 10 minutes on 2 cores); charts under docs/.
bench: $(BENCH_STAMP)
	$(BIN)/python -m loadtest.bench --output $(RESULTS)/bench-matrix.json --charts docs/

# Each row once, small counts: about a minute, to check that everything works.
bench-quick: $(BENCH_STAMP)
	$(BIN)/python -m loadtest.bench --quick

# Headwater next to Redis and NATS in one run, with the ratios.
bench-peers: $(BENCH_STAMP) peer-servers
	$(BIN)/python -m loadtest.peers --output $(RESULTS)/bench-peers.json --charts docs/

# Installs Debian's redis-server and nats-server when missing (needs root or sudo and apt-get).
peer-servers:
	@missing=""; for b in $(PEER_BINARIES); do command -v $$b >/dev/null 2>&1 || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing (Debian packages) for the peer benchmarks"; \
		if [ "$$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo=sudo; \
		else echo "error:$$missing not installed and neither root nor sudo: run 'apt-get install$$missing' as root" >&2; exit 1; fi; \
		command -v apt-get >/dev/null 2>&1 || { echo "error: no apt-get here: install$$missing by hand" >&2; exit 1; }; \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq$$missing || \
			{ echo "error: could not install$$missing with apt-get (see above)" >&2; exit 1; }; \
	fi

# A steady rate for 10 minutes (SOAK_SECONDS to change), sequence numbers checked, RSS/fds sampled.
SOAK_SECONDS ?= 600
soak: $(BENCH_STAMP)
	$(BIN)/python -m loadtest.soak --seconds $(SOAK_SECONDS) --output $(RESULTS)/soak.json --chart $(RESULTS)/soak.png

# locust headless against a server it starts; the HTML report goes to loadtest/results/.
LOCUST_USERS ?= 14
LOCUST_SECONDS ?= 30
loadtest: $(BENCH_STAMP)
	$(BIN)/python -m loadtest.locust_run --users $(LOCUST_USERS) --seconds $(LOCUST_SECONDS)

clean:
	rm -rf $(VENV) build *.egg-info
