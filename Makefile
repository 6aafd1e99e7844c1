# BTB: the two set-up commands are `make reproduce` and `make test` (see README.md).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install reproduce test test-py test-notebooks lab bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,gateway]'
	$(BIN)/python -m ipykernel install --sys-prefix --name btb --display-name "Python (btb)" >/dev/null
	@touch $(STAMP)

install: $(STAMP)

## Run every notebook in notebooks/ in order at full size; executed copies go to build/notebooks/,
## figures (PNG + SVG) to figures/.
reproduce: install
	$(BIN)/python -m btb_core.notebooks --params notebooks/params/full.yaml --out build/notebooks

## Unit, functional and property tests, then every notebook at its quick defaults under nbval.
test: install test-py test-notebooks

test-py: install
	$(BIN)/python -m pytest tests

test-notebooks: install
	BTB_FIGURES_DIR=build/figures-quick BTB_CHART_RENDERER=png $(BIN)/python -m pytest --nbval-lax -p no:cacheprovider notebooks/

## JupyterLab on the project's environment, kernel "Python (btb)" registered.
lab: install
	$(BIN)/python -m pip install -q -e '.[dev,gateway,lab]'
	$(BIN)/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

bench: install
	$(BIN)/python benchmarks/bench_sim.py
	$(BIN)/python benchmarks/bench_audit.py

clean:
	rm -rf build .pytest_cache
