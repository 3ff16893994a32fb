"""The registry of stages: name -> entry point, one-line help, and what ITEM means.

Each entry is ``module:function``, called as ``function(params)``, or ``function(params, item)`` for
stages with an ITEM (the ``@<item>`` of a DVC foreach stage: a dataset, an image source or a task;
None means all of them).
Modules are imported only when their stage runs, so ``--help`` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str
    entry: str
    help: str
    item: str | None = None  # what the optional positional ITEM names, if the stage takes one
    # False: the CLI skips the params' path check
    check_paths: bool = True
    # ``module:function`` called as ``function(params, item)`` before the stage's locks are taken:
    # raises ParamsError for an ITEM the stage does not know (no lock file named after it is made)
    check_item: str | None = None


STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage("mini_world", "pipeline.mini_world:run", "write the embedded mini world in the real formats"),
        Stage("download", "pipeline.ingest.download:run",
              "world: real: fetch CC/SBU images with img2dataset (not in DVC)",
              item="dataset", check_item="pipeline.ingest.download:check_item"),
        Stage("ingest", "pipeline.ingest.ingest:run", "raw annotations -> manifests + rejects", item="dataset",
              check_item="pipeline.ingest.ingest:check_item"),
        Stage("decontaminate", "pipeline.decontam.decontaminate:run", "remove eval images from pretraining; reports"),
        Stage("train_detector", "pipeline.extract.train_detector:run", "fit the mini-world C4 detector"),
        Stage("extract", "pipeline.extract.extract:run", "Faster R-CNN region features, sharded", item="image_source",
              check_item="pipeline.extract.extract:check_item"),
        Stage("build_dbs", "pipeline.stores.build_dbs:run", "LMDB image and text stores"),
        Stage("import_uniter_db", "pipeline.stores.import_uniter_db:run",
              "UNITER's released LMDBs -> image and text stores (what build_dbs runs with source uniter_release)"),
        Stage("pretrain", "pipeline.pretrain.pretrain:run", "DeepSpeed pretraining (first stage)"),
        Stage("pretrain_masking", "pipeline.pretrain.pretrain:run_masking_ablation",
              "the first stage with the other masking (ablations/dvc.yaml)"),
        Stage("pretrain_vcr", "pipeline.pretrain.pretrain:run_vcr", "VCR second-stage pretraining"),
        Stage("finetune", "pipeline.finetune.finetune:run", "fine-tune and evaluate one task", item="task",
              check_item="pipeline.finetune.finetune:check_item"),
        Stage("plots", "pipeline.report.plots:run", "training curves of data/metrics in one offline HTML page"),
        Stage("results", "pipeline.report.results:run", "results table with Meta-Sum"),
        Stage("ablations", "pipeline.report.ablations:run", "the masking ablation's table (ablations/dvc.yaml)"),
    )
}

# Commands that are not pipeline stages (inspection tools); entry gets the remaining argv.
TOOLS: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage("report", "pipeline.report.cli:main", "inspect reports: `report cleaning [DATASET] [--show N]`"),
        Stage("db", "pipeline.stores.db_cli:main", "inspect stores: `db inspect PATH --key ID`, `db stats PATH`"),
        Stage("seeds", "pipeline.finetune.seed_sweep:main",
              "one task fine-tuned under other seeds beside the run: `seeds vcr --seeds 1 2 3`"),
        Stage("budgets", "pipeline.finetune.budget_sweep:main",
              "one task's fine-tuning budget chosen on its dev split: `budgets vcr --steps 150 300 600`"),
        Stage("uniter_ckpt", "pipeline.pretrain.uniter_ckpt_cli:main",
              "UNITER release files: `uniter_ckpt export --out F.pt`, `uniter_ckpt inspect F.pt`"),
    )
}


def resolve(entry: str):
    """Import ``module:function`` and return the function."""
    import importlib

    module_name, func_name = entry.split(":")
    return getattr(importlib.import_module(module_name), func_name)
