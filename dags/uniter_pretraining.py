"""``uniter_pretraining``: a new UNITER pretraining run, from raw data to the results table.

Trigger it with a conf (every key optional; validated by the JSON schemas below), e.g.

    airflow dags trigger uniter_pretraining --conf '{"run_name": "joint-mask", "masking": "joint"}'

or with a conf file (deploy/airflow/: tiny.json, full.json, joint.json):

    airflow dags trigger uniter_pretraining --conf "$(cat deploy/airflow/tiny.json)"
    make airflow-trigger CONF=deploy/airflow/tiny.json     # scripts/airflow_local.sh reads the file

Each task runs the same stage entry as dvc.yaml (``python -m pipeline <stage> [ITEM] --params
runs/<run_name>/params.yaml``), so a run is the DVC pipeline with the trigger's params, written to
its own ``runs/<run_name>/`` (params, conf, data, outputs.json). Stages are idempotent and write
atomically: retrying a task is safe. Extraction and training tasks take ``gpu`` pool slots, one
per GPU they use, and run on devices of their own: ``pipeline.common.gpu_alloc`` hands each task free
indices of its host (``CUDA_VISIBLE_DEVICES``) and takes them back when it ends, also when killed.
This file only wires stages; the helpers are in ``_uniter_runs.py``.
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import get_args, get_type_hints

from airflow.sdk import Param, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

# Airflow puts the DAG folder on sys.path in its own processes, but not every loader does
# (DagBag in tests, `python dags/uniter_pretraining.py`); make the helper importable everywhere.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))
import _uniter_runs as runs  # noqa: E402
from pipeline.common import gpu_alloc  # noqa: E402  (importable: _uniter_runs puts the repository on sys.path)
from pipeline.params.finetune import TASKS as FINETUNE_TASK_NAMES  # noqa: E402
from pipeline.params.model import ModelConfig  # noqa: E402
from pipeline.params.pretrain import FIRST_STAGE_TASKS, PretrainConfig  # noqa: E402

DAG_ID = "uniter_pretraining"
# Airflow imports a DAG file under a generated module name (unusual_prefix_<hash>_<file>), so
# __name__ would name the task logs' lines after that: a fixed name reads as the DAG's
log = logging.getLogger(DAG_ID)

GPU_POOL = "gpu"
# the pool's size (scripts/airflow_local.sh and docker-compose.yml create it from the same variable):
# a task never asks for more slots than the pool has, or the scheduler would never start it
GPU_POOL_SIZE = int(os.environ.get("AIRFLOW_GPU_SLOTS", "1"))
DEFAULTS = runs.repo_params()
DEFAULT_GPUS = runs.gpus_per_stage(runs.parse_repo_params())


def _choices(section: type, key: str) -> list[str]:
    """The values a params key allows: the ``Literal`` of its field in the section's dataclass
    (pipeline.params defines each choice once; the conf's schema follows it)."""
    return list(get_args(get_type_hints(section)[key]))


PRESETS = _choices(ModelConfig, "preset")
PRETRAIN_TASKS = list(FIRST_STAGE_TASKS)
FINETUNE_TASKS = list(FINETUNE_TASK_NAMES)

PARAMS = {
    "run_name": Param(
        None, type=["null", "string"], pattern=runs.RUN_NAME_PATTERN,
        description="Directory name under runs/; default: derived from the Airflow run id.",
    ),
    "seed": Param(DEFAULTS["seed"], type="integer", minimum=0, description="Root seed of every stage."),
    "model_preset": Param(DEFAULTS["model"]["preset"], type="string", enum=PRESETS, description="UNITER size."),
    "task_mix": Param(
        dict(DEFAULTS["pretrain"]["mix_ratio"]), type="object",
        properties={t: {"type": "number", "minimum": 0} for t in PRETRAIN_TASKS},
        additionalProperties=False, minProperties=1,
        description="Pretraining task -> sampling weight (one task per step).",
    ),
    "pretrain_data": Param(
        DEFAULTS["pretrain"]["datasets"], type="string", enum=_choices(PretrainConfig, "datasets"),
        description="In-domain (COCO+VG), out-of-domain (CC+SBU) or both.",
    ),
    "masking": Param(DEFAULTS["pretrain"]["masking"], type="string", enum=_choices(PretrainConfig, "masking")),
    "pretrain_steps": Param(DEFAULTS["pretrain"]["steps"], type="integer", minimum=1),
    "vcr_steps": Param(DEFAULTS["pretrain"]["vcr"]["steps"], type="integer", minimum=1),
    "finetune_tasks": Param(
        list(DEFAULTS["finetune"]["tasks"]), type="array", items={"type": "string", "enum": FINETUNE_TASKS},
        minItems=1, uniqueItems=True,
    ),
    "finetune_steps": Param(None, type=["null", "integer"], minimum=1,
                            description="Steps for every fine-tuning task; null keeps params.yaml's."),
    "overrides": Param(
        {}, type="object", propertyNames={"pattern": runs.OVERRIDE_KEY_PATTERN},
        description="Any other params.yaml key -> value, e.g. {\"mini_world.n_coco\": 60} for a small world.",
    ),
}


def _run_stage(run: dict, stage: str, item: str | None = None) -> None:
    runs.run_stage(stage, item, run["params"], emit=log.info)


def _run_gpu_stage(run: dict, stage: str, item: str | None = None) -> None:
    """A GPU stage on devices of its own: as many as the run's params say it uses (run["gpus"])."""
    label = f"{run['run_name']}:{stage}" + (f"@{item}" if item else "")
    with gpu_alloc.allocate(run["gpus"][stage], label=label, emit=log.info) as gpus:
        runs.run_stage(stage, item, run["params"], emit=log.info, gpus=gpus)


def _gpu_slots(stage: str) -> int:
    """``gpu`` pool slots of a stage's task: the GPUs it uses with params.yaml's values (a run's
    conf may change that; the allocator then still gives it disjoint devices), capped at the pool."""
    return max(1, min(DEFAULT_GPUS[stage], GPU_POOL_SIZE))


@dag(
    dag_id=DAG_ID,
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    # the wait before a retry is a deployment setting: AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY in
    # deploy/airflow.env, read by scripts/airflow_local.sh and docker-compose.yml alike
    default_args={"retries": 2},
    tags=["uniter"],
    doc_md=__doc__,
)
def uniter_pretraining():
    @task(retries=0)
    def prepare() -> dict:
        """Validate the conf against the strict params schema and write runs/<run_name>/params.yaml."""
        from pipeline.params.parser import ParamsError

        ctx = get_current_context()
        try:
            run = runs.prepare_run(ctx["params"], ctx["run_id"])
        except (ParamsError, runs.RunConflict, ValueError) as err:
            raise AirflowFailException(str(err)) from err
        log.info("run %s: params %s, outputs under %s", run["run_name"], run["params"], run["data"])
        return run

    @task
    def items(run: dict, key: str) -> list[str]:
        """One list of the run's params to map over (Airflow maps only over a task's return value)."""
        return list(run[key])

    @task
    def mini_world(run: dict) -> None:
        """The mini world: the run's raw data (world: mini), or what the mini detector trains on."""
        if run["world"] == "mini" or run["detector"] == "mini":
            _run_stage(run, "mini_world")
        else:
            log.info("world: real with detector %s: nothing to generate", run["detector"])

    @task(map_index_template="{{ dataset }}")
    def ingest(run: dict, dataset: str) -> None:
        _run_stage(run, "ingest", dataset)

    @task
    def decontaminate(run: dict) -> None:
        _run_stage(run, "decontaminate")
        log.info("cleaning summary\n%s", runs.cleaning_summary(run["data"]))

    @task(pool=GPU_POOL, pool_slots=_gpu_slots("train_detector"))
    def train_detector(run: dict) -> None:
        if run["detector"] == "mini":
            _run_gpu_stage(run, "train_detector")
        else:
            log.info("detector %s uses the weights in extract.weights: nothing to train", run["detector"])

    @task(pool=GPU_POOL, pool_slots=_gpu_slots("extract"), map_index_template="{{ image_source }}")
    def extract(run: dict, image_source: str) -> None:
        _run_gpu_stage(run, "extract", image_source)

    def _extract_parts(run: dict) -> int:
        """``extract.parts`` of the run's params (a trigger sets it through ``overrides``)."""
        from pipeline.params.parser import load_params

        return load_params(runs.REPO_ROOT / run["params"], check_paths=False).extract.parts

    @task
    def extract_items(run: dict, sources: list[str]) -> list[str]:
        """What ``extract`` maps over: the image sources, or with ``extract.parts`` = K > 1 each
        source's K parts ``<source>:k/K``, each a task of its own (docs/scaling.md)."""
        parts = _extract_parts(run)
        return list(sources) if parts == 1 else [f"{s}:{k}/{parts}" for s in sources for k in range(1, parts + 1)]

    @task
    def merge_features(run: dict) -> None:
        """With ``extract.parts`` > 1: each source's parts into its feature directory, the bytes one
        task would write (links, no detector: no GPU needed). With 1 the extract tasks wrote them."""
        if _extract_parts(run) > 1:
            _run_stage(run, "extract")
        else:
            log.info("extract.parts is 1: each extract task wrote its source's features, nothing to merge")

    @task
    def build_dbs(run: dict) -> None:
        _run_stage(run, "build_dbs")

    @task(pool=GPU_POOL, pool_slots=_gpu_slots("pretrain"))
    def pretrain(run: dict) -> None:
        _run_gpu_stage(run, "pretrain")

    @task(pool=GPU_POOL, pool_slots=_gpu_slots("pretrain_masking"))
    def pretrain_masking(run: dict) -> None:
        """The first stage with the other masking: the masking ablation of ablations.md."""
        _run_gpu_stage(run, "pretrain_masking")

    @task(pool=GPU_POOL, pool_slots=_gpu_slots("pretrain_vcr"))
    def pretrain_vcr(run: dict) -> None:
        _run_gpu_stage(run, "pretrain_vcr")

    @task(pool=GPU_POOL, pool_slots=_gpu_slots("finetune"), map_index_template="{{ finetune_task }}")
    def finetune(run: dict, finetune_task: str) -> None:
        _run_gpu_stage(run, "finetune", finetune_task)

    @task
    def results(run: dict) -> None:
        _run_stage(run, "results")

    @task
    def ablations(run: dict) -> None:
        """data/reports/ablations.md: the masking ablation's table."""
        _run_stage(run, "ablations")

    @task
    def plots(run: dict) -> None:
        """Training curves in one page, data/reports/plots/index.html (viewable offline)."""
        _run_stage(run, "plots")

    @task
    def record(run: dict) -> dict:
        """outputs.json: a digest of every stage output, beside the run's params."""
        rec = runs.record_outputs(run)
        log.info("run %s produced %d outputs; record in %s/%s", run["run_name"], len(rec["outputs"]),
                 run["run_dir"], runs.OUTPUTS_FILE)
        return rec

    run = prepare()
    world = mini_world(run)
    ingested = ingest.partial(run=run).expand(dataset=items.override(task_id="datasets")(run, "datasets"))
    cleaned = decontaminate(run)
    detector = train_detector(run)
    sources = items.override(task_id="image_sources")(run, "image_sources")
    features = extract.partial(run=run).expand(image_source=extract_items(run, sources))
    merged = merge_features(run)
    dbs = build_dbs(run)
    first = pretrain(run)
    second = pretrain_vcr(run)
    ablation = pretrain_masking(run)
    tuned = finetune.partial(run=run).expand(finetune_task=items.override(task_id="tasks")(run, "tasks"))
    table = results(run)
    ablation_table = ablations(run)
    curves = plots(run)
    done = record(run)
    world >> ingested >> cleaned >> features
    world >> detector >> features
    features >> merged >> dbs >> first >> second >> tuned >> [table, curves] >> done
    dbs >> ablation >> ablation_table >> done
    ablation >> curves  # plots draws every run under metrics/: never half of them, whatever the order
    first >> ablation_table


uniter_pretraining()
