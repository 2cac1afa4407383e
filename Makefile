# ckpt-plan: set-up, demo, tests. Needs only python3 (3.10+) on the machine.
#
# torch is installed FIRST and pinned (TORCH_SPEC): with it already satisfied, installing
# the package pulls no torch build of its own, so no CUDA wheels are downloaded on a machine
# without a GPU. Where the pinned version is not available as a CPU wheel from your package
# index, pass extra pip arguments, e.g. `make demo TORCH_PIP_ARGS="--index-url <cpu index>"`.
# The rest is installed under a constraint holding torch at TORCH_SPEC, so that no
# dependency (lightning, accelerate, peft in the dev extras) can upgrade or replace it: pip
# picks versions that work with it, or stops with an error.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
STAMP := $(VENV)/.installed
CONSTRAINTS := $(VENV)/torch-constraint.txt
# pytest-xdist workers: `auto` is one per CPU core; PYTEST_WORKERS=0 runs in this process.
PYTEST_WORKERS ?= auto
PYTEST := $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=10

.PHONY: setup demo test test-fast test-inductor test-separate test-ranks lint typecheck pytest bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	echo "$(TORCH_SPEC)" > $(CONSTRAINTS)
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e ".[dev]"
	@$(BIN)/python -c "import importlib.metadata as m, torch; \
	cuda = sorted(d.metadata['Name'] for d in m.distributions() if (d.metadata['Name'] or '').startswith('nvidia')); \
	print('torch', torch.__version__, '| CUDA available:', torch.cuda.is_available(), '| CUDA packages:', cuda or 'none')"
	touch $(STAMP)

demo: setup
	$(BIN)/ckpt-plan profile examples/gpt.py --budget 80MiB

bench: setup
	$(BIN)/python benchmarks/bench.py
	$(BIN)/python benchmarks/selective.py

lint: setup
	$(BIN)/ruff check planner cli tests examples benchmarks
	$(BIN)/ruff format --check planner cli tests examples benchmarks

typecheck: setup
	$(BIN)/mypy

# The suite (CI runs it through `make test`), but for the tests that compile kernels with
# inductor (a minute on 2 cores): `make test-inductor`, those running whole CLI processes
# under an address-space limit (40 s): `make test-separate`, and those launching real ranks
# under torchrun but one (2 min): `make test-ranks`; CI runs the three after it.
pytest: setup
	$(PYTEST) -m "not inductor and not separate and not ranks"

test-inductor: setup
	$(PYTEST) -m inductor

test-separate: setup
	$(PYTEST) -m separate

test-ranks: setup
	$(PYTEST) -m ranks

# Lint and mypy (one core) run beside pytest (xdist on every core): the whole takes about
# pytest's time alone. Any of the three failing fails `make test`.
test: setup
	$(MAKE) --no-print-directory -j3 lint typecheck pytest

# The edit loop: every test but those marked slow (end-to-end runs, torchrun, examples at
# full size), about a minute.
test-fast: setup
	$(PYTEST) -m "not slow and not inductor and not separate and not ranks"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
