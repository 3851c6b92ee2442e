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

.PHONY: install test lint fmt demo ui bench clean peers docs

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
	elif [ -d datasets/$(DEMO) ]; then mkdir -p $(GNNFLOW_LANDING) && cp -R datasets/$(DEMO) $(GNNFLOW_LANDING)/$(DEMO); \
	else $(BIN)/gnnflow generate --preset demo --out $(GNNFLOW_LANDING)/$(DEMO); fi
	$(BIN)/gnnflow datasets sync
	$(BIN)/gnnflow launch --assets '*' --partition $(DEMO)
	@echo
	@echo "demo done: results under $(GNNFLOW_HOME)/$(DEMO)/ (one folder per asset);"
	@echo "run history in $(DAGSTER_HOME); browse both with 'make ui' at http://127.0.0.1:$(PORT) (make ui PORT=N for another port)"

ui: install $(DAGSTER_HOME)/dagster.yaml
	@echo "gnnflow UI: http://127.0.0.1:$(PORT) (Ctrl-C stops it; make ui LOG=info for the daemon's lines)"
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p $(PORT) --log-level $(LOG)

# docs/configuration.md: every setting of every asset, generated from the settings' declarations
# (tests/test_config_reference.py fails when the committed file differs)
docs: install
	$(BIN)/gnnflow config-reference --out docs/configuration.md

# Every benchmark at one scale (SCALE=small|medium|large, sizes in benchmarks/harness.py), each
# side in its own child process; writes benchmarks/results/$(SCALE).json and .md (ours, peer,
# ratio, peak RSS). small: a few minutes on 2 cores; medium (1M nodes / 10M edges): about 85
# minutes; large (10M / 100M): hours. ONLY=ingest,adjacency runs a subset. SCALE=wall is the memory-wall
# run instead (benchmarks/memory_wall.py: the pipeline with training in a memory cgroup smaller than its
# feature matrix; as root, ~20 GB of disk, about an hour on 2 cores).
SCALE ?= small
ONLY  ?=
bench: install
ifeq ($(SCALE),wall)
	$(BIN)/python benchmarks/pipeline_run.py --preset memory-wall
else
	$(BIN)/python benchmarks/run.py --scale $(SCALE) $(if $(ONLY),--only $(ONLY))
endif

# PyG beside gnnflow and DGL in the benchmarks (benchmarks/frameworks.py) and tests (tests/test_layers_pyg.py):
# the [peers] extra plus torch-scatter and torch-sparse, which PyPI has as source only. They are compiled for
# the CPU against the venv's torch once (minutes each) into $(PEER_WHEELS) and installed from there; `make
# install`, `make test` and CI never build them. ClusterData also needs METIS in torch-sparse: apt-get install
# libmetis-dev before the first `make peers` (optional; NeighborLoader, LinkNeighborLoader and GraphSAINT work
# without it). `rm -r $(PEER_WHEELS)` forces a rebuild.
PEER_WHEELS := .cache/peer-wheels
PEER_BUILDS := torch-scatter==2.1.2 torch-sparse==0.6.18
peers: install
	mkdir -p $(PEER_WHEELS)
	$(BIN)/python -m pip install --quiet wheel
	for req in $(PEER_BUILDS); do \
		name=$$(echo $${req%%==*} | tr - _); version=$${req##*==}; \
		ls $(PEER_WHEELS)/$$name-$$version-*.whl >/dev/null 2>&1 || \
		FORCE_ONLY_CPU=1 $(BIN)/python -m pip wheel --no-build-isolation --no-deps -w $(PEER_WHEELS) $$req || exit 1; \
	done
	$(BIN)/python -m pip install --quiet --find-links $(PEER_WHEELS) $(PEER_BUILDS) -e '.[dev,scaleout,peers]'

clean:
	rm -rf $(GNNFLOW_HOME) $(DAGSTER_HOME)
