# BTB: the two set-up commands are `make reproduce` and `make test` (see README.md).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB_STAMP := $(VENV)/.installed-lab
BROWSER_STAMP := $(VENV)/.installed-browser

ENGINE_VENV := .venv-engine
ENGINE_STAMP := $(ENGINE_VENV)/.installed

.PHONY: install reproduce test test-py test-notebooks test-browser lab bench bench-fleet clean engine test-engine

## Installs into .venv go through uv (from PyPI; the project's environment installs in 16-26 s
## against 33-58 s with pip on the 2-core test machine, bytecode compiled as pip does). uv does not
## read pip's configuration, so pip's own settings that decide what gets installed (index-url,
## extra-index-url, find-links, constraint, no-index, trusted-host, from `pip config list`, which
## includes PIP_* variables) are handed to uv with pip's rule of the best version over every
## source; a setting uv cannot take sends the install to pip. When uv cannot be installed or its
## install fails, pip does the same install (uv's network timeout is 15 s unless UV_HTTP_TIMEOUT
## says otherwise, so a silent index fails over in about a minute). The engine venv goes the same
## way (40-70 s with uv against ~90 s with pip; its CPU torch, 2.13.0+cpu, comes from pip's
## find-links under either).
SPEC := -e '.[dev,gateway]'
LAB_SPEC := -e '.[dev,gateway,lab]'
BROWSER_SPEC := -e '.[dev,gateway,lab,browser]'
define UV_ARGS_PY
import os, shlex, subprocess, sys
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                     text=True, check=True).stdout
conf, rank = {}, {}
for line in out.splitlines():   # "section.key='value'": PIP_* (:env:) over [install] over [global]
    name, _, value = line.partition("=")
    section, _, key = name.rpartition(".")
    r = {":env:": 2, "install": 1}.get(section, 0)
    if r >= rank.get(key, -1):
        conf[key], rank[key] = value.strip().strip("'\""), r
ignored = {"config-file", "cert", "client-cert", "default-timeout", "timeout", "retries", "disable-pip-version-check",
           "quiet", "verbose", "progress-bar", "no-cache-dir", "cache-dir", "root-user-action",
           "no-warn-script-location", "no-input", "no-color", "log"}
args = []
for key, value in conf.items():
    items = value.split()
    if key == "index-url":
        args += ["--index-url", value]
    elif key == "extra-index-url":
        for u in items:   # pip skips a file:// index that is not there; so does this
            if not u.startswith("file://") or os.path.isdir(u[7:]):
                args += ["--extra-index-url", u]
    elif key == "find-links":
        for u in items:
            if "://" in u or os.path.exists(u):
                args += ["--find-links", u]
    elif key == "constraint":
        for c in items:
            args += ["--constraint", c]
    elif key == "trusted-host":
        for h in items:
            args += ["--allow-insecure-host", h]
    elif key == "no-index":
        if value.lower() in ("1", "true", "yes", "on"):
            args.append("--no-index")
    elif key not in ignored:
        sys.exit(f"[btb] pip setting {key!r} has no uv equivalent here")
print(" ".join(shlex.quote(a) for a in ["--index-strategy", "unsafe-best-match", *args]))
endef
export UV_ARGS_PY
## $(call venv_install,BIN_DIR,WHAT): install WHAT (pip arguments) into the venv of BIN_DIR.
define venv_install
uvargs=$$($(1)/python -c "$$UV_ARGS_PY") && $(1)/python -m pip install -q uv && \
	  eval UV_HTTP_TIMEOUT=$${UV_HTTP_TIMEOUT:-15} $(1)/python -m uv pip install -q --compile-bytecode \
	    --python $(1)/python $$uvargs "$(2)" || \
	  { echo "[btb] installing with pip instead of uv (see the message above)"; \
	    $(1)/python -m pip install -q --upgrade pip && $(1)/python -m pip install -q $(2); }
endef

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(call venv_install,$(BIN),$(SPEC))
	$(BIN)/python -m ipykernel install --sys-prefix --name btb --display-name "Python (btb)" >/dev/null
	@touch $(STAMP)

install: $(STAMP)

## The real-engine environment (vLLM CPU build, its own venv): the `engine` group of pyproject.toml.
ENGINE_DEPS = $$($(ENGINE_VENV)/bin/python -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['engine']))")
$(ENGINE_STAMP): pyproject.toml
	@test -x $(ENGINE_VENV)/bin/python || $(PYTHON) -m venv $(ENGINE_VENV)
	$(call venv_install,$(ENGINE_VENV)/bin,$(ENGINE_DEPS))
	-$(ENGINE_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(ENGINE_VENV)/bin/python -c "import vllm, transformers, tokenizers"
	@touch $(ENGINE_STAMP)

engine: $(ENGINE_STAMP)

## Run every notebook in notebooks/ at full size; executed copies go to build/notebooks/, figures
## (PNG + SVG) to figures/. REPRODUCE_JOBS notebooks run at once, each in its own process (1: one
## after another, in order); a replay one notebook repeats from another is read from the run's
## replay cache (build/replay-cache/, removed at the end).
REPRODUCE_JOBS ?= 2
reproduce: install
	$(BIN)/python -m btb_core.notebooks --params notebooks/params/full.yaml --out build/notebooks --jobs $(REPRODUCE_JOBS)

## Unit, functional and property tests (with the real-engine smoke test), every notebook at its
## quick defaults under nbval, then notebooks 04 and 05 in JupyterLab in a real (headless) browser.
test: install engine test-py test-notebooks test-browser

test-py: install
	BTB_ENGINE_REQUIRED=$$(test -f $(ENGINE_STAMP) && echo 1 || echo 0) $(BIN)/python -m pytest tests

## Only the real-engine smoke test (one vLLM CPU server, a few requests).
test-engine: install engine
	BTB_ENGINE_REQUIRED=1 $(BIN)/python -m pytest tests/test_engine_smoke.py

test-notebooks: install
	BTB_FIGURES_DIR=build/figures-quick BTB_CHART_RENDERER=png BTB_PROGRESS=0 $(BIN)/python -m pytest --nbval-lax -p no:cacheprovider notebooks/

## JupyterLab + Playwright, and Debian's Chromium if there is no Chromium (needs root, as in CI).
## Playwright drives the system browser: no browser is downloaded.
$(BROWSER_STAMP): $(STAMP)
	$(call venv_install,$(BIN),$(BROWSER_SPEC))
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { echo "[btb] installing Debian's chromium for the browser test"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@touch $(BROWSER_STAMP)

## Notebooks 04 and 05 opened in JupyterLab (loopback) in headless Chromium: run all, every chart
## renders offline, a slider and Run change the output.
test-browser: $(BROWSER_STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider tests/browser

$(LAB_STAMP): $(STAMP)
	$(call venv_install,$(BIN),$(LAB_SPEC))
	@touch $(LAB_STAMP)

## JupyterLab on the project's environment, kernel "Python (btb)" registered (installs only when
## pyproject.toml changed).
lab: $(LAB_STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

## Every policy's replay speed on two traces at 4/16/64 replicas, then the fleet-scale case
## (1,000,000 Bursted-shaped rows, 256 replicas, btb; FLEET_ROWS=N for another size)
## (benchmarks/bench_policies.py; sizes are its flags: BENCH_ARGS="--windows 30 --mooncake-rows 0"),
## the test-split replay's peak memory (bench_memory.py), then simulator and audit speed, and the
## routers' random draws (bench_rng.py).
FLEET_ROWS ?= 1000000
bench: install
	$(BIN)/python benchmarks/bench_policies.py --fleet-rows $(FLEET_ROWS) $(BENCH_ARGS)
	$(BIN)/python benchmarks/bench_memory.py
	$(BIN)/python benchmarks/bench_sim.py
	$(BIN)/python benchmarks/bench_audit.py
	$(BIN)/python benchmarks/bench_rng.py

## Fleet scale only: FLEET_ROWS (default 1,000,000) Bursted-shaped rows on 256 replicas with btb.
bench-fleet: install
	$(BIN)/python benchmarks/bench_policies.py --fleet --fleet-rows $(FLEET_ROWS) $(BENCH_ARGS)

clean:
	rm -rf build .pytest_cache
