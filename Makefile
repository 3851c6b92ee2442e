# gnnflow: `make demo` runs the whole pipeline on a generated dataset (`make demo DEMO=cora`: on a dataset
# of datasets/); `make test` runs the tests.
# Every target creates or reuses .venv and installs the pinned project into it first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.gnnflow-installed

export DAGSTER_HOME    := $(CURDIR)/.dagster_home
export GNNFLOW_HOME    ?= $(CURDIR)/.gnnflow
export GNNFLOW_LANDING ?= $(CURDIR)/landing

DEMO ?= demo
PORT ?= 3000

.PHONY: install test lint fmt demo ui bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,scaleout]'
	touch $(STAMP)

install: $(STAMP)

# instance settings (telemetry off; one queued run per dataset partition): pipelines/dagster.yaml
$(DAGSTER_HOME)/dagster.yaml: pipelines/dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp pipelines/dagster.yaml $@

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: lint
	$(BIN)/python -m pytest -q

# `dagster dev` warns that it is superseded by `dg dev`, which lives in the separate dagster-dg-cli
# package and needs a dg project layout; the notice is printed before any project code loads, so it
# is filtered here, by message. LOG=info shows the daemon's lines (every sensor tick among them).
ui: export PYTHONWARNINGS := ignore:Function `dev_command` is superseded
LOG ?= warning
demo: install $(DAGSTER_HOME)/dagster.yaml
	@# a dataset of the repository (datasets/, e.g. DEMO=cora) is copied; any other name is generated
	if [ -d $(GNNFLOW_LANDING)/$(DEMO) ]; then :; \
	elif [ -f datasets/$(DEMO)/edges.parquet ]; then mkdir -p $(GNNFLOW_LANDING) && cp -R datasets/$(DEMO) $(GNNFLOW_LANDING)/$(DEMO); \
	else $(BIN)/gnnflow generate --preset demo --out $(GNNFLOW_LANDING)/$(DEMO); fi
	$(BIN)/gnnflow datasets sync
	$(BIN)/gnnflow launch --assets '*' --partition $(DEMO)
	@echo
	@echo "demo done: results under $(GNNFLOW_HOME)/$(DEMO)/ (one folder per asset);"
	@echo "run history in $(DAGSTER_HOME); browse both with 'make ui' at http://127.0.0.1:$(PORT) (make ui PORT=N for another port)"

ui: install $(DAGSTER_HOME)/dagster.yaml
	@echo "gnnflow UI: http://127.0.0.1:$(PORT) (Ctrl-C stops it; make ui LOG=info for the daemon's lines)"
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p $(PORT) --log-level $(LOG)

# Every benchmark at one scale (SCALE=small|medium|large, sizes in benchmarks/harness.py), each
# side in its own child process; writes benchmarks/results/$(SCALE).json and .md (ours, peer,
# ratio, peak RSS). small: a few minutes on 2 cores; medium (1M nodes / 10M edges): tens of
# minutes; large (10M / 100M): hours. ONLY=ingest,adjacency runs a subset.
SCALE ?= small
ONLY  ?=
bench: install
	$(BIN)/python benchmarks/run.py --scale $(SCALE) $(if $(ONLY),--only $(ONLY))

clean:
	rm -rf $(GNNFLOW_HOME) $(DAGSTER_HOME)
