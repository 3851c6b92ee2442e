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

# `dagster asset materialize` and `dagster dev` (what the README documents) warn that they are superseded
# by `dg launch` / `dg dev`, which live in the separate dagster-dg-cli package and need a dg project
# layout; the notices are printed before any project code loads, so they are filtered here, by message.
demo ui: export PYTHONWARNINGS := ignore:Function `asset_materialize_command` is superseded,ignore:Function `dev_command` is superseded
demo: install $(DAGSTER_HOME)/dagster.yaml
	@# a dataset of the repository (datasets/, e.g. DEMO=cora) is copied; any other name is generated
	if [ -d $(GNNFLOW_LANDING)/$(DEMO) ]; then :; \
	elif [ -f datasets/$(DEMO)/edges.parquet ]; then mkdir -p $(GNNFLOW_LANDING) && cp -R datasets/$(DEMO) $(GNNFLOW_LANDING)/$(DEMO); \
	else $(BIN)/gnnflow generate --preset demo --out $(GNNFLOW_LANDING)/$(DEMO); fi
	$(BIN)/gnnflow datasets sync
	$(BIN)/dagster asset materialize -m pipelines.definitions --select '*' --partition $(DEMO)
	@echo
	@echo "demo done: results under $(GNNFLOW_HOME)/$(DEMO)/ (one folder per asset);"
	@echo "run history in $(DAGSTER_HOME); browse both with 'make ui' at http://127.0.0.1:$(PORT) (make ui PORT=N for another port)"

ui: install $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p $(PORT)

# Every benchmark at its default size (1M nodes / 10M edges where it applies); each prints
# ours next to its baseline measured in the same run. Expect tens of minutes on 2 cores.
BENCHES ?= ingest adjacency partition bloom compression sampling aggregate train_vs_dgl weighted
bench: install
	for b in $(BENCHES); do echo "=== benchmarks/$$b.py"; $(BIN)/python benchmarks/$$b.py || exit 1; done

clean:
	rm -rf $(GNNFLOW_HOME) $(DAGSTER_HOME)
