# The two commands a user needs: `make run` (the main job) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench lock clean

# constraints.txt pins the tested versions, so a run never changes with an upstream release
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,mcp,ray]'
	touch $(STAMP)

# twice the cores: a trial of the shipped suite mostly waits (a scripted approval due in 9 s,
# a deadline, processes starting), so two per core keep the cores busy (bench/suite.py measures it)
RUN_JOBS ?= $(shell echo $$(( 2 * $$(nproc) )))
run: $(STAMP)
	$(BIN)/vaultsim run --jobs $(RUN_JOBS) scenarios/

# two pytest-xdist workers, a test file each (module fixtures stay in one process): most
# tests wait on real processes, so two at a time halves the wall time on 2 cores;
# PYTEST_WORKERS=0 runs them one at a time
PYTEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

bench: $(STAMP)
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

# re-resolve the newest versions pyproject.toml allows, in a throwaway venv
lock:
	rm -rf .lock-venv && $(PY) -m venv .lock-venv
	.lock-venv/bin/python -m pip install -q '.[test,mcp,ray]'
	{ grep '^#' constraints.txt; .lock-venv/bin/python -m pip freeze --exclude vaultsim; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf .lock-venv

clean:
	rm -rf $(VENV) *.egg-info
