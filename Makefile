# The two commands of the README: `make lab` opens the course, `make test` runs the tests.
# Both create the virtual environment .venv on first use (Python >= 3.10 needed).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.convlab-installed
# GPU extras (CUDA 12 wheels, CuPy) only where an NVIDIA driver answers.
EXTRAS := dev$(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo ,gpu)

# JupyterLab refuses to run as root unless told (containers, Colab-like machines).
# Test processes (pytest-xdist; each test file stays in one process, so its fixtures are built
# once).
TEST_JOBS ?= 2

ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: lab test lint doctor exercises clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# the distribution is convlab-course; `convlab` is ConvLab-3's (or this course's old) name
	@$(PY) -m pip uninstall --quiet --yes convlab 2>/dev/null || true
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	@touch $@

lab: $(STAMP)
	$(PY) -m convlab doctor || true
	$(VENV)/bin/jupyter lab --notebook-dir=. $(ROOT_FLAG) $(LAB_ARGS)

test: $(STAMP)
	$(PY) -m ruff check convlab tests
	$(PY) -m convlab exercises build --check
	$(PY) -m convlab publish --check
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check convlab tests

doctor: $(STAMP)
	$(PY) -m convlab doctor

# exercises/ is generated from solutions/ (never edit it by hand)
exercises: $(STAMP)
	$(PY) -m convlab exercises build

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
