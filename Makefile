# jupyter_memprof: `make demo` and `make test` are the whole set-up on a fresh machine.
# Every target is idempotent: a second run only re-does what changed.

PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.memprof-installed
# JupyterLab refuses to run as root without this flag.
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
PYTEST_ARGS ?=

.PHONY: setup demo demo-notebooks test lint unit bench chromium clean docs screenshots map

setup: $(STAMP) chromium

# torch first, from the local CPU wheel: a bare `torch` requirement with no torch present
# would pull a multi-GB CUDA build. With torch==2.13.0 installed the package's `torch>=2.4`
# is already satisfied and pip installs nothing more for it.
# The install builds the JupyterLab extension and copies it to share/jupyter/labextensions
# (also for this editable install), so a change to its sources installs again.
$(STAMP): pyproject.toml install.json labextension/package.json labextension/package-lock.json \
          $(wildcard labextension/src/*.ts labextension/style/*)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[test,lab]"
	@$(BIN)/python -c "import torch, sys; cuda = torch.version.cuda; print('torch', torch.__version__, '(CUDA build)' if cuda else '(CPU build)'); sys.exit(0)"
	@touch $@

# Debian's chromium for the browser tests (never a browser download). Installed with apt
# when missing and we are root (CI is); otherwise say how.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian's chromium for the browser tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "chromium is missing: run 'sudo apt-get install -y chromium' (browser tests are skipped without it)"; \
	  fi; }

# JupyterLab on the quickstart: the printed URL opens the notebook itself. No news feed or
# update check (they would reach for the internet). It serves copies of the notebooks in
# $(DEMO_DIR) (git-ignored), so a run saved there never changes the tracked notebooks that
# `make test` checks; a copy is refreshed only when the tracked notebook is newer.
DEMO_DIR ?= .demo

demo-notebooks:
	@mkdir -p $(DEMO_DIR)
	@cp -u notebooks/*.ipynb $(DEMO_DIR)/

demo: setup $(VENV)/share/jupyter/lab/settings/overrides.json demo-notebooks
	@echo "Starting JupyterLab on a copy of notebooks/quickstart.ipynb ($(DEMO_DIR)/); open the http://127.0.0.1 URL printed below."
	$(BIN)/jupyter lab --ServerApp.root_dir=$(DEMO_DIR) --ServerApp.ip=127.0.0.1 --no-browser \
	  --LabApp.default_url=/lab/tree/quickstart.ipynb --LabApp.news_url=None \
	  --LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate $(ROOT_FLAG)

# This venv's JupyterLab never asks to fetch news or check for updates (no internet here).
$(VENV)/share/jupyter/lab/settings/overrides.json: $(STAMP)
	@mkdir -p $(@D)
	@echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > $@

# The dashboard's browser code (package data, jupyter_memprof/_views/js) is checked by node's
# parser and by ESLint, a dev dependency of the JupyterLab extension (labextension/).
JS_DIR := jupyter_memprof/_views/js
ESLINT := labextension/node_modules/.bin/eslint

$(ESLINT): labextension/package.json labextension/package-lock.json
	cd labextension && npm install --no-audit --no-fund
	@touch $@

lint: setup $(ESLINT)
	$(BIN)/ruff check jupyter_memprof tests benchmarks
	$(BIN)/ruff format --check jupyter_memprof tests benchmarks
	@for f in $(JS_DIR)/*.js; do node --check $$f || exit 1; done
	$(ESLINT) --config labextension/eslint.config.mjs --max-warnings 0 $(JS_DIR)

# The documentation site (Sphinx + MyST + myst-nb, docs/conf.py) into docs/_build/html,
# offline, warnings as errors. Incremental: a second run only rebuilds changed pages.
docs: setup
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "docs: open docs/_build/html/index.html"

# docs/architecture.md's map of the modules, written from their docstrings' first lines
# (tests/test_architecture_doc.py fails while the page differs from it).
map:
	$(BIN)/python docs/_ext/architecture_map.py

# Unit, magic, browser and notebook (nbval) tests in one pytest run, so one summary line
# says what ran. pytest exits 5 when nothing was collected, which fails this target.
# Notebook outputs are compared after the sanitisers in notebooks/nbval-sanitize.cfg.
test: lint docs
	$(BIN)/python -m pytest tests notebooks --nbval --nbval-current-env \
	  --nbval-sanitize-with notebooks/nbval-sanitize.cfg $(PYTEST_ARGS)

bench: setup
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# the README's dashboard pictures (docs/img/), from real runs of a small Llama
screenshots: setup
	$(BIN)/python benchmarks/screenshots.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) build dist *.egg-info docs/_build docs/_generated docs/reference/api docs/notebooks jupyter_memprof/labextension labextension/lib labextension/node_modules
