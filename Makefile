# uniter-pipeline: `make demo` runs the whole pipeline on the embedded mini world;
# `make test` runs the test suite (CI calls exactly this). Both set up .venv first and are
# no-ops for set-up when nothing changed.

SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DVC_NO_ANALYTICS := 1
export DS_ACCELERATOR := cpu
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PYTHONHASHSEED := 0
# dvc.yaml and the Airflow tasks run `python -m pipeline ...`: the venv's python must come first
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: setup setup-download demo ablations seeds budgets test test-full test-fast test-unit gpu-check gpu-carry airflow airflow-stop airflow-trigger clean-venv

setup: $(STAMP)

# img2dataset for download@cc|sbu (docs/real-data.md), in its own venv: its pins (pandas<3) fight ours
DL_VENV := .venv-img2dataset
DL_STAMP := $(DL_VENV)/.installed
setup-download: $(DL_STAMP)

$(DL_STAMP): requirements-download.txt
	test -x $(DL_VENV)/bin/python || $(PY) -m venv $(DL_VENV)
	$(DL_VENV)/bin/pip install -q -r requirements-download.txt
	touch $(DL_STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml scripts/install_detectron2.sh
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# pip 23.2 (Python 3.11's bundled one): newer pips refuse the detectron2 sdist's metadata
	# (a direct-URL extra), even for a --no-deps download.
	$(BIN)/pip install -q "pip==23.2.1"
	$(BIN)/pip install -q -r requirements-dev.txt
	bash scripts/install_detectron2.sh $(BIN)/python
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dvc repro

# The masking ablation (a second first-stage pretraining run) is a pipeline of its own: after the
# demo it adds that run and data/reports/ablations.md.
ablations: $(STAMP)
	$(BIN)/dvc repro ablations/dvc.yaml

# CI's suite: unit and stage tests (the slow ones too), the tiny-world end-to-end checks (two
# fresh `dvc repro` runs: every stage runs, a second repro is a no-op, both give byte-identical
# outputs, `dvc exp run` reruns exactly the downstream stages) and the scheduler-triggered Airflow
# runs (SQLite + LocalExecutor, and side by side PostgreSQL + Celery where those services run).
# Two pytest workers, one test file each at a time: most of the end-to-end time is single-
# threaded process start-up, so the Airflow runs and the unit tests fill the second core.
# `test-full` adds the default-params run (the demo, marker `demo`); `test-fast` leaves out the
# end-to-end and Airflow runs; `test-unit` also every stage run and training (marker `stage`).
# --durations: every run (CI's too) ends with its slowest tests, where the suite's time goes
PYTEST := $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15
# Two pytest workers share the cores, so idle OpenMP threads sleep at once instead of spinning for
# the other's core (a stage alone on the machine spins briefly: pipeline/common/openmp.py)
test test-full test-fast test-unit: export OMP_WAIT_POLICY := PASSIVE

# tests/pipeline/ingest/test_download.py runs the real img2dataset
test: $(STAMP) $(DL_STAMP)
	$(PYTEST) -m "not demo"

test-full: $(STAMP) $(DL_STAMP)
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m "not e2e and not airflow and not demo"

# The unit tests only: no stage runs, no training (markers `stage` and `slow` left out), <= 2 min.
test-unit: $(STAMP)
	$(PYTEST) -m "not e2e and not airflow and not demo and not slow and not stage"

# The one-GPU check (docs/gpu.md): extraction, pretraining MFU, fine-tuning steps/s and bf16
# numerics in <= 8 min on one GPU -> $(OUT_JSON) (default gpu_check.json). DRY=1: the same script
# on the CPU with tiny shapes (`make test` runs it via tests/bench/test_gpu_check.py).
gpu-check: $(STAMP)
	$(BIN)/python bench/gpu_check.py $(if $(DRY),--dry) --out $(or $(OUT_JSON),gpu_check.json) $(if $(PROFILE),--profile $(PROFILE))

# .gpu_carry/site: what the check imports and a lent GPU machine's image lacks (docs/gpu.md)
gpu-carry: $(STAMP)
	DS_ACCELERATOR=cpu $(BIN)/python scripts/gpu_carry.py

# Fine-tuning spread over seeds (docs/design.md §12): one `dvc exp run` per seed that changes only
# finetune.seed (same data, same pretrained model: only the finetune@* stages rerun), then the table.
# `dvc exp run` leaves its experiment applied (params.yaml's seed, data/, dvc.lock): afterwards, or
# when a run fails, params.yaml and dvc.lock are put back as they were and data/ checked out to
# match, so the workspace keeps the run the seeds were measured against.
# TASK=<task>: that task alone, through `python -m pipeline seeds` (pipeline/finetune/seed_sweep.py),
# in side data roots under data/seeds/<task>/ that read the run's stores: the run stays as it is.
SEEDS ?= 1 2 3
TASK ?=
seeds: $(STAMP)
ifneq ($(TASK),)
	$(BIN)/python -m pipeline seeds $(TASK) --seeds $(SEEDS)
else
	@test -f dvc.lock || { echo "make seeds: no dvc.lock here; run make demo first (the seeds fine-tune its pretrained model)" >&2; exit 2; }
	set -e; keep=$$(mktemp -d); cp params.yaml dvc.lock "$$keep"/; \
	trap 'cp "$$keep"/params.yaml "$$keep"/dvc.lock . && $(BIN)/dvc checkout -q; rm -r "$$keep"' EXIT; \
	for s in $(SEEDS); do $(BIN)/dvc exp run -S finetune.seed=$$s --name ft-seed$$s; done
	$(BIN)/python -m pipeline report spread --exps $(foreach s,$(SEEDS),ft-seed$(s)) --md data/reports/spread.md
endif

# One task's fine-tuning budget chosen on its dev split (pipeline/finetune/budget_sweep.py): the
# pretrained start alone at each of STEPS, dev scored only, in side roots under data/budgets/<task>/.
# START=scratch: the non-pretrained start's budget instead (data/budgets/<task>_scratch/).
STEPS ?=
START ?= pretrained
budgets: $(STAMP)
	@test -n "$(TASK)" -a -n "$(STEPS)" || { echo 'make budgets: set TASK=<task> and STEPS="N1 N2 ..."' >&2; exit 2; }
	$(BIN)/python -m pipeline budgets $(TASK) --steps $(STEPS) --start $(START)

clean-venv:
	rm -rf $(VENV)

# Local Airflow 3 on 127.0.0.1, state in airflow_home/ (scripts/airflow_local.sh; settings in
# deploy/airflow.env, which docker-compose.yml reads too). AIRFLOW_STACK=local (default): SQLite +
# LocalExecutor; AIRFLOW_STACK=celery: this machine's PostgreSQL (database airflow_uniter, created
# if missing) + Redis broker + two Celery workers. airflow-stop/-trigger act on the stack started last.
airflow: $(STAMP)
	AIRFLOW_STACK=$(AIRFLOW_STACK) bash scripts/airflow_local.sh start

airflow-stop:
	bash scripts/airflow_local.sh stop

# make airflow-trigger CONF='{"run_name": "joint", "masking": "joint"}'
# make airflow-trigger CONF=deploy/airflow/joint.json   (a conf file: deploy/airflow/{tiny,full,joint}.json)
airflow-trigger: $(STAMP)
	bash scripts/airflow_local.sh trigger '$(CONF)'
