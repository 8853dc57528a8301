# A careful agent started as a make recipe (red team, nineteenth pass, c):
#   make -s -f tests/agents/rt19c_agent.mk
# The recipe runs the Python agent in a `sh -c` pipeline that keeps a copy of its output in
# $TMPDIR with tee (pipefail, so the agent's exit code is make's); stderr stays its own (a log line after the final message must not end stdout).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
AGENT_DIR := $(dir $(lastword $(MAKEFILE_LIST)))
PYTHON ?= python3

.PHONY: run
run:
	@$(PYTHON) -u $(AGENT_DIR)rt19c_habits.py | tee "$${TMPDIR:-/tmp}/rt19c-run.log"
