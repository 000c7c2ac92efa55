# The two set-up commands of the README:
#   make report   set up, sweep every notebook in the cpu profile (seeds 0-2, 2 at a time, resumable:
#                 only missing runs run), build report/index.html
#   make test     set up, fill the SFT base-model cache (from bases/, training only what is not shipped),
#                 run the unit tests and execute
#                 every notebook (ci profile) under nbval
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

.PHONY: setup test report clean-runs

setup: $(STAMP)

$(STAMP): requirements/lock.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c requirements/lock.txt -e ".[all]"
	touch $(STAMP)

test: setup
	$(VENV)/bin/agentrl cache arith-tiny chain-mix-tiny grid-agent-tiny grid5-agent-tiny tq-agent-tiny shop-agent-tiny calc-agent-tiny prog-tiny --quiet
	$(PY) -m pytest tests agentrl_lib notebooks --nbval-lax --nbval-current-env -p no:cacheprovider

report: setup
	$(VENV)/bin/agentrl reproduce $(NOTEBOOKS) --profile $(PROFILE) --seeds $(SEEDS) --jobs $(JOBS); \
	status=$$?; $(VENV)/bin/agentrl report; exit $$status

clean-runs:
	rm -rf runs report
