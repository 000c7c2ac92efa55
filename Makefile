# The two set-up commands of the README:
#   make report   set up, sweep every notebook in the cpu profile (seeds 0-2, 2 at a time, resumable:
#                 only missing runs run), build report/index.html
#   make lab      (to learn) set up, fill the cache, open JupyterLab on notebooks/ (widgets work)
#   make test     set up, fill the SFT base-model cache from bases/ (no training), run the unit tests,
#                 the doctests and every notebook (ci profile) under nbval, on JOBS pytest workers
#                 (pytest-xdist: whole files, longest first; see conftest.py); installs chromium for
#                 the browser tests
#   make durations   make test, and record each file's seconds in tests/durations.json (commit it:
#                 the longest-first order comes from there; files it lacks count as a median one)
# Each installs bubblewrap for the sandbox first where it can (root with apt-get; target bwrap).
# Both install into .venv from requirements/lock.txt first (torch 2.13.0 before anything that needs it,
# so pip takes the CPU wheel instead of the CUDA build), and skip that step when nothing changed.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROFILE ?= cpu
SEEDS  ?= 0-2
JOBS   ?= 2
NOTEBOOKS ?= all

LAB_ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup browser bwrap test durations report lab clean-runs

setup: $(STAMP) bwrap

$(STAMP): requirements/lock.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c requirements/lock.txt -e ".[all]"
	touch $(STAMP)

# the browser tests (tests/test_browser.py) drive Debian's chromium: installed here when missing and
# this is root with apt-get (CI); elsewhere they skip and say why
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium and chromium-driver for the browser tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      chromium chromium-driver >/dev/null; \
	  else echo "no chromium here (not root or no apt-get): the browser tests will skip"; fi; }

# the sandbox (agentrl_lib/envs/sandbox.py) runs model-written code under Debian's bubblewrap:
# installed here when missing and this is root with apt-get (CI); elsewhere its tests skip and say
# why, and untrusted code is refused
bwrap:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing bubblewrap for the sandbox"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      bubblewrap >/dev/null; \
	  else echo "no bwrap here (not root or no apt-get): the sandbox refuses untrusted code"; fi; }

test: setup browser
	$(VENV)/bin/agentrl cache --shipped --quiet
	$(PY) -m pytest -n $(JOBS) tests agentrl_lib notebooks --nbval-lax --nbval-current-env \
	  -p no:cacheprovider $(PYTEST_ARGS)

durations:
	$(MAKE) test PYTEST_ARGS=--store-durations

# exit 0 when every run completed and the report was written; 1 when a run crashed (in cpu and
# gpu only sanity and theorem claims are asserted: a paper claim that fails is a result)
# or the report could not be written. The report's last lines count the runs and the claims.
report: setup
	$(VENV)/bin/agentrl reproduce $(NOTEBOOKS) --profile $(PROFILE) --seeds $(SEEDS) --jobs $(JOBS); \
	runs=$$?; $(VENV)/bin/agentrl report; written=$$?; \
	if [ $$runs -ne 0 ] || [ $$written -ne 0 ]; then exit 1; fi

lab: setup
	$(VENV)/bin/agentrl cache --shipped --quiet
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

clean-runs:
	rm -rf runs report

# The GPU path (issue 31; reproductions/gpu/). gpu-wheels: download the packages a lent GPU machine
# lacks (TRL, datasets, papermill, nbclient, ipykernel and their needs; the versions of the lock) as
# cp312 manylinux wheels into .gpu-wheels/, check them against the 64 MiB a device call carries, and
# print the carry list. gpu-check: on a CUDA machine, install those wheels offline into a temporary
# folder, build pretrain-medium and chain-mix-medium at a budget, time and profile our GRPO loop
# against TRL's, run notebooks 11 and 30 in their gpu profile at shorter budgets; every stage under
# a wall-clock deadline, 6 minutes in all; files in $OUT (or ./gpu-out). GPU_CHECK_ARGS=
# "--device cpu" is the CPU rehearsal that tests/test_gpu_check.py runs.
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_CHECK_ARGS ?=
.PHONY: gpu-wheels gpu-check

gpu-wheels: setup
	$(PY) reproductions/gpu/gpu_wheels.py

gpu-check:
	PYTHONPATH=. $(GPU_PYTHON) reproductions/gpu/gpu_check.py $(GPU_CHECK_ARGS)
