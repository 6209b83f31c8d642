# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU/CUDA build of torch is chosen here, before the project's own install sees a range.
TORCH_SPEC ?= torch==2.13.0
# GPU=1: also what only GPU clusters need (DeepSpeed); the CPU default stays lean.
GPU ?=
comma := ,
EXTRAS := dev$(if $(GPU),$(comma)gpu)
UV_VERSION ?= 0.13.9
UV = $(BIN)/uv pip install --python $(BIN)/python

.PHONY: install run test test-all deps ui server results results-table report clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip "uv==$(UV_VERSION)"
	# torch through pip: pip finds the CPU wheel this machine keeps on disk (uv would download a CUDA build);
	# byte-compiled below on every core rather than by pip on one (README: make install 68 s -> 47 s on 2 cores)
	$(BIN)/python -m pip install --no-compile "$(TORCH_SPEC)"
	# DeepSpeed ships as source only: built against the torch above (build isolation would fetch another torch)
	$(if $(GPU),$(BIN)/python -m pip install --no-build-isolation "deepspeed==0.19.8")
	# the rest through uv: the same resolution as pip's, in seconds rather than minutes; the torch above satisfies it.
	# Compiled to bytecode now (as pip does, and uv does not by default): where PYTHONDONTWRITEBYTECODE is set,
	# every stage and test worker would otherwise compile Lightning, MLflow and the rest from source again
	$(UV) --compile-bytecode -e ".[$(EXTRAS)]"
	# the Optuna sweeper pins optuna<3, whose database storage (parallel sweep workers) fails on SQLAlchemy 2;
	# it runs on the optuna the project installs (its distributions are deprecated, not removed, before 6)
	$(UV) --no-deps "hydra-optuna-sweeper==1.3.0"
	$(BIN)/python -m compileall -q -j 0 -x py312_intrinsics \
		"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch"
	touch $@

install: $(BIN)/.installed

run: install            ## the whole DVC pipeline on the embedded default data
	test -d .dvc || $(BIN)/dvc init --no-scm -q
	# the stages start in one warm interpreter (transformer_lab/runtime/warm_start.py): Lightning and torch imported once
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m transformer_lab.runtime.warm_start $(BIN)/dvc repro

test: install           ## the quick suite: every test but the end-to-end runs of the real tools (under 5 min)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -m "not slow"

test-all: install       ## everything, the end-to-end runs too (dvc repro, mlflow server, DDP, notebooks): what CI runs
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest

deps: install           ## rewrite dvc.yaml's source/config deps to what each stage runs and reads
	$(BIN)/python -m transformer_lab.runtime.stage_deps

ui: install             ## the MLflow UI over the project's local store, on 127.0.0.1:5000
	@echo "MLflow UI: http://127.0.0.1:5000/#/experiments?workflowType=machine_learning"
	@echo "  (MLflow 3.17 opens experiments on GenAI pages until 'Model training' is clicked once in its sidebar; the browser remembers)"
	$(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000

server: install         ## a team tracking server: mlflow server on PostgreSQL, artifacts proxied, on 127.0.0.1:5000
	# PostgreSQL's binaries are the `server` extra (pgserver): already there after the dev install above
	$(BIN)/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('pgserver') is None)" \
		|| $(UV) -e ".[$(EXTRAS),server]"
	$(BIN)/python -m transformer_lab.tracking.team_server --dir .team-server --host 127.0.0.1 --port 5000

results: install        ## the DVC metrics, a table per model family (REV=HEAD~1 or an experiment: changes as old→new)
	$(BIN)/python -m transformer_lab.runtime.results $(if $(REV),--rev "$(REV)")

results-table: install  ## docs/results.md from every benchmarks/results/*.json (one table per benchmark)
	$(BIN)/python benchmarks/results_table.py

report: install         ## reports/index.html and README.md: each family's headline beside its anchor, the studies, MLflow links
	$(BIN)/python -m transformer_lab.runtime.report

clean:
	rm -rf outputs artifacts data/prepared mlflow.db mlruns
