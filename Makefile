# The README's two commands: `make demo` (set up, start nodus, run the examples) and
# `make test` (set up, run every test). Both work on a fresh machine with Python 3.11 and apt.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup system-deps browser-deps demo check test unit integration faults chaos bench down clean

$(BIN)/nodus: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(BIN)/nodus

# bubblewrap runs commands; skopeo and umoci resolve and unpack an Agent's spec.image;
# busybox-static is what the tests build their small images from.
system-deps:
	@{ command -v bwrap && command -v skopeo && command -v umoci && dpkg -s busybox-static; } >/dev/null 2>&1 || { \
		echo "installing bubblewrap (the sandbox), skopeo, umoci and busybox-static (images) with apt"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq bubblewrap skopeo umoci busybox-static; }

setup: $(BIN)/nodus system-deps

demo: setup
	$(BIN)/nodus up
	$(BIN)/nodus apply -f examples/hello/agent.yaml
	$(BIN)/nodus apply -f examples/hello/run.yaml
	$(BIN)/nodus wait agentrun/hello-agent-run --for=jsonpath='{.status.phase}'=Succeeded --timeout=2m
	$(BIN)/nodus get agentrun/hello-agent-run -o yaml
	$(BIN)/nodus agentrun answer hello-agent-run
	$(BIN)/nodus agentrun steps hello-agent-run
	$(BIN)/python examples/hello/main.py
	$(BIN)/python examples/agents/parallel-agents/main.py
	$(BIN)/nodus apply -f examples/agents/parallel-agents/agent.yaml
	$(BIN)/nodus apply -f examples/evaluation/budget.yaml
	$(BIN)/python examples/evaluation/evaluation.py
	$(BIN)/nodus get budget
	$(BIN)/python examples/python-agents/triage.py
	$(BIN)/python examples/python-agents/approval.py
	$(BIN)/python examples/python-agents/fanout.py
	$(BIN)/python examples/python-agents/chat.py
	$(BIN)/nodus apply -f examples/python-agents/yaml/agent.yaml
	$(BIN)/nodus apply -f examples/python-agents/yaml/run.yaml
	$(BIN)/nodus wait agentrun/py-yaml-agent-run --for=jsonpath='{.status.phase}'=Succeeded --timeout=2m
	$(BIN)/nodus agentrun answer py-yaml-agent-run

# The console's tests drive a real headless browser.
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing chromium (the console's browser tests) with apt"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium; }

# Lint, format and types: what CI fails on before any test runs.
CHECKED := nodus_ray sdk serve tests benchmarks examples
check: setup
	$(BIN)/ruff check $(CHECKED)
	$(BIN)/ruff format --check $(CHECKED)
	$(BIN)/mypy

# Unit tests alone, with no Ray cluster; then the integration suite on its own Ray (own temp dir,
# ports, HOME and storage, so a user's running service is never touched); then the
# fault-injection suite, the only one whose service has crash points armed, on local storage and
# on S3 (a local moto server the tests start); then a seeded 2-minute fault campaign, on a
# service of its own, whose checker fails the build on any broken invariant.
test: setup browser-deps check
	$(BIN)/pytest -q tests/unit
	$(BIN)/pytest -q tests/integration --ignore=tests/integration/test_faults.py --ignore=tests/integration/test_faults_python.py
	$(BIN)/pytest -q tests/integration/test_faults.py tests/integration/test_faults_python.py
	NODUS_TEST_STORAGE=s3 $(BIN)/pytest -q tests/integration/test_faults.py tests/integration/test_faults_python.py
	$(BIN)/python benchmarks/chaos.py --minutes 2 --seed 1 --quiet

# The fault campaign alone, longer: `make chaos MINUTES=20 STORAGE=s3`.
MINUTES ?= 2
STORAGE ?= local
chaos: setup
	$(BIN)/python benchmarks/chaos.py --minutes $(MINUTES) --seed 1 --storage $(STORAGE)

unit: setup
	$(BIN)/pytest -q tests/unit

integration: setup
	$(BIN)/pytest -q tests/integration --ignore=tests/integration/test_faults.py --ignore=tests/integration/test_faults_python.py

faults: setup
	$(BIN)/pytest -q tests/integration/test_faults.py tests/integration/test_faults_python.py

bench: setup
	$(BIN)/python benchmarks/run_overhead.py
	$(BIN)/python benchmarks/group_makespan.py

down:
	$(BIN)/nodus down

clean:
	rm -rf $(VENV) build *.egg-info
