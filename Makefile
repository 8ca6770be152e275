# make serve: set up a virtualenv and start the server; make test: set up and run the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.deps-$(shell cat pyproject.toml constraints.txt | sha256sum | cut -c1-12)

.PHONY: setup serve generate test clean

# The package is installed in editable mode once per checkout: again only when the virtualenv
# points at another checkout (CI links one virtualenv into every clean clone)
setup: $(STAMP)
	@$(BIN)/python -c "import os, sys, seq2serve; \
		sys.exit(os.path.dirname(os.path.abspath(seq2serve.__file__)) != os.getcwd())" \
		2>/dev/null || PYTHONWARNINGS=ignore $(BIN)/python -m pip install -qq --no-deps \
		--no-build-isolation -e .

# Dependencies, reinstalled only when pyproject.toml or constraints.txt change. Without an
# NVIDIA driver, torch comes as the CPU build (never the multi-GB CUDA wheels).
$(STAMP):
	@echo "setting up $(VENV) (once, a few minutes)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -qq --upgrade pip setuptools wheel
	@if command -v nvidia-smi >/dev/null 2>&1; then \
		$(BIN)/python -m pip install -qq torch; \
	else \
		$(BIN)/python -m pip install -qq torch==2.13.0 || \
		$(BIN)/python -m pip install -qq torch --index-url https://download.pytorch.org/whl/cpu; \
	fi
	@PYTHONWARNINGS=ignore $(BIN)/python -m pip install -qq -c constraints.txt -e ".[dev]"
	@rm -f $(VENV)/.deps-* && touch $@

serve: setup
	$(BIN)/seq2serve serve $(ARGS)

generate: setup
	$(BIN)/seq2serve generate $(ARGS)

# `python -m pytest`, not bin/pytest: a reused virtualenv (CI links one in) keeps the script
# shebangs of the checkout that installed it. Two workers (CI has two cores), each taking
# whole files (a file's fixtures are made once) in tests/conftest.py's order, the longest
# first (xdist would otherwise order files by their number of tests, and a long file of few
# tests, the compile gate, ran last); TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -m "not gpu" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

clean:
	rm -rf $(VENV) build *.egg-info
