# grpo_lab — make book | make test | make execute | make clean
# Needs only Python 3.11 and make: everything else is installed into .venv from requirements/ci.txt.
SHELL := /bin/bash
# requirements/ci.txt's exact pins were resolved for, and are tested on, Python 3.11: any other Python is refused
# (PYTHON=/path/to/python3.11 names one that is not on PATH as python3.11)
SUPPORTED_PYTHON := 3.11
PYTHON ?= $(shell command -v python$(SUPPORTED_PYTHON))
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NB     := $(sort $(wildcard book/*.ipynb))
PYTEST_NBVAL := $(BIN)/python -m pytest --nbval --nbval-current-env \
	--nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=600 -p no:cacheprovider

.PHONY: install chromium test unit nbval gpu-dryrun book book-stored execute sync clean pretrain xcheck
export OMP_NUM_THREADS ?= 2
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
export PYDEVD_DISABLE_FILE_VALIDATION := 1

install: $(STAMP)

# The editable install's one notice is silenced: setuptools (>= 64) says "Editable installation ... be careful with
# folders in your working directory with the same name as your package" (an InformationOnly warning, nothing to act
# on: the data/ folder mapped to grpo_lab._data makes setuptools use its import-hook finder, not a plain .pth file).
$(STAMP): requirements/ci.txt pyproject.toml
	@py=$$(test -x $(BIN)/python && echo $(BIN)/python || echo "$(PYTHON)"); \
	found=$$([ -n "$$py" ] && "$$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); \
	if [ "$$found" != "$(SUPPORTED_PYTHON)" ]; then \
		echo "make: grpo_lab needs Python $(SUPPORTED_PYTHON) (requirements/ci.txt pins its packages for it); found" \
			"$${found:+Python $$found at }$${py:-no python$(SUPPORTED_PYTHON) on PATH}: install python$(SUPPORTED_PYTHON)," \
			"or pass PYTHON=/path/to/python$(SUPPORTED_PYTHON) (an existing $(VENV) of another Python: remove it)" >&2; \
		exit 1; fi
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements/ci.txt
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

## test: unit tests, notebook regression tests (strict nbval) and a warnings-as-errors book build, then the
## dry run of every chapter's GPU profile on CPU (after nbval, so that the run cache holds the toy runs)
test: install chromium unit nbval gpu-dryrun

## chromium: tests/repo/test_book_render.py opens the built book in headless Chromium (Debian's chromium and
## chromium-driver). Installed here as .ci/run does when this is root with apt-get; otherwise a missing browser is
## reported loudly (the render test then skips: pytest's -rs summary at the end of the unit phase says so too).
chromium:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium and chromium-driver (Debian) for tests/repo/test_book_render.py"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq >/dev/null && apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else \
		echo "********************************************************************************************" >&2; \
		echo "* make test: chromium and/or chromedriver are not on PATH, so tests/repo/test_book_render.py  *" >&2; \
		echo "* (the built book opened in headless Chromium) will be SKIPPED. Install both, e.g.            *" >&2; \
		echo "*   sudo apt-get install chromium chromium-driver        (Debian / Ubuntu)                    *" >&2; \
		echo "********************************************************************************************" >&2; \
	fi

unit: install
	@t0=$$(date +%s) && $(BIN)/python -m pytest tests -q -rs -p no:cacheprovider && echo "phase unit: $$(( $$(date +%s) - t0 )) s"

nbval: install
	@t0=$$(date +%s) && $(PYTEST_NBVAL) -q $(NB) && echo "phase nbval: $$(( $$(date +%s) - t0 )) s"

## gpu-dryrun: chapters 1-8 executed with PROFILE = "gpu" on CPU (a tiny stand-in model, one seed, one step) into
## _build/gpu_dryrun: the profile switch, the hub-model cell and its results file, without a GPU
gpu-dryrun: install
	@t0=$$(date +%s) && GRPO_LAB_PY=$(BIN)/python scripts/gpu_dryrun.sh _build/gpu_dryrun && echo "phase gpu-dryrun: $$(( $$(date +%s) - t0 )) s"

## book: execute every chapter (jupyter-cache, CPU profile) and build the HTML book into _build/html.
## The kernels start from scripts/jupyter/kernels/python3 (JUPYTER_PATH): the standard python3 kernel with its
## log level at ERROR. jupyter-cache starts them over TCP and offers no setting for the transport, and ipykernel >= 7
## then logs "Kernel is running over TCP without encryption" for each chapter; the kernel's own warnings only are
## hidden (a chapter's Python warnings are cell outputs, untouched). `make execute` and `make gpu-dryrun` use IPC.
## The committed notebooks are not modified: execution happens in _build/.jupyter_cache, and a
## chapter whose code has not changed is not executed again on the next `make book`.
## scripts/execute_cache.py executes the chapters into that cache first, BOOK_JOBS at a time, so the build itself
## finds every chapter cached. Default 1, one after another: each chapter already trains two seeds at a time, and
## two chapters at once (BOOK_JOBS=2; each chapter's stated times then say that another shared the cores) gained 7%
## on one afternoon and lost 19% on one evening of 2026-12-03 (benchmarks/README.md, "The book and CI").
BOOK_JOBS ?= 1
book: install
	mkdir -p _build
	$(BIN)/python scripts/book_config.py --execute cache > _build/_config_exec.yml
	JUPYTER_PATH=$(CURDIR)/scripts/jupyter $(BIN)/python scripts/execute_cache.py --jobs $(BOOK_JOBS) \
		--config _build/_config_exec.yml $(NB)
	JUPYTER_PATH=$(CURDIR)/scripts/jupyter $(BIN)/jupyter-book build book --config _build/_config_exec.yml \
		--path-output . -W -n --keep-going
	@echo "open _build/html/index.html"

## book-stored: build the HTML book from the outputs stored in the notebooks (seconds; what CI checks)
book-stored: install
	$(BIN)/jupyter-book build book --config _config.yml --path-output . -W -n --keep-going

## execute: re-run every chapter in place from a fresh kernel (refreshes the stored outputs nbval compares)
execute: install sync
	$(BIN)/python -m grpo_lab.lab.book execute $(NB)

## sync: update each notebook's inputs from its jupytext twin in book/_py/
sync: install
	for py in book/_py/*.py; do $(BIN)/jupytext --sync $$py; done

## pretrain: rebuild data/checkpoints/arithmetic-base (deterministic on one machine, ~4.5 min on 2 cores), then
## arithmetic-filler-base (~1 min; chapter 3's length-free task: arithmetic-base fine-tuned on answers padded with dots),
## arithmetic-long-base (~9 min; the same with runs of up to 320 dots: benchmarks/vapo_long.py, chapter 6),
## then arithmetic-moe-base (the same recipe as arithmetic-base with a Qwen3-MoE-style model: 8 experts, top 2),
## chapter 7's corpus-proxy-base and corpus-base, reverse-base (the README's own-task example, ~1 min),
## calculator-base (issue 56's tool task: a*b+c with a calculator the model calls, calc(a*b) -> =<product>),
## dialogue-rm (issue 55's learned proxy reward model, fitted to the gold reward of corpus-base samples, ~20 s) and
## long-chain-base (issue 55's long chain-of-thought task: sums of 3-14 one-digit terms reduced one addition per step or hastily)
pretrain: install
	$(BIN)/python -m grpo_lab.lab.pretrain arithmetic
	$(BIN)/python -m grpo_lab.lab.pretrain arithmetic-filler
	$(BIN)/python -m grpo_lab.lab.pretrain arithmetic-long
	$(BIN)/python -m grpo_lab.lab.pretrain arithmetic-moe
	$(BIN)/python -m grpo_lab.lab.pretrain corpus-proxy
	$(BIN)/python -m grpo_lab.lab.pretrain corpus
	$(BIN)/python -m grpo_lab.lab.pretrain reverse
	$(BIN)/python -m grpo_lab.lab.pretrain calculator
	$(BIN)/python -m grpo_lab.lab.proxy_reward_model
	$(BIN)/python -m grpo_lab.lab.pretrain long-chain

## xcheck: equivalence of grpo_lab.export's TRL / verl settings with TRL's and verl's own loss code (issue 16).
## Runs in .venv-xcheck (scripts/xcheck_env.sh): requirements/xcheck.txt installed without dependencies in front of
## .venv's packages, which it sees but never changes (its antlr 4.9.3, omegaconf's, would change the GSM8K scorer's
## verdicts); tests/export/xcheck/test_xcheck_env.py compares .venv's `pip freeze` before and after.
## GRPO_LAB_XCHECK=1: a missing or other TRL / verl version fails these tests here (plain pytest skips them).
XVENV := .venv-xcheck
xcheck: install
	@mkdir -p _build && $(BIN)/python -m pip freeze --all > _build/xcheck-venv-freeze.txt
	@[ $(XVENV)/.installed -nt requirements/xcheck.txt ] && [ $(XVENV)/.installed -nt $(STAMP) ] \
		|| scripts/xcheck_env.sh $(VENV) $(XVENV)
	GRPO_LAB_XCHECK=1 GRPO_LAB_XCHECK_BASE=$(VENV) GRPO_LAB_XCHECK_FREEZE=_build/xcheck-venv-freeze.txt \
		$(XVENV)/bin/python -m pytest -m xcheck tests/export/xcheck -q -s -p no:cacheprovider

clean:
	rm -rf _build .pytest_cache
