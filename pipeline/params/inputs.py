"""Which raw inputs the configured stages read, and whether they exist (the parser's path checks).

:func:`source_needs` maps each ``sources.*`` key to the stages that read it; :func:`stages_run` says
which of those stages one command runs (``ingest cc`` runs ``ingest@cc`` only), so a command is
checked against the inputs it reads, not against everything configured: a partial download runs
the stages whose inputs are there. :func:`missing_paths` reports the ``must_exist`` paths that are
missing; :func:`unread_inputs` names the configured inputs nothing produces.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:  # the parser imports this module
    from pipeline.params.parser import Params


def missing_paths(obj: Any, prefix: str, errors: list[str], needed_by: Mapping[str, list[str]] | None = None) -> None:
    """Append ``"<key>: path does not exist: <path>"`` to ``errors`` for each missing ``must_exist`` path of ``obj``
    (and ``"<key>: a directory, expected a file: <path>"`` / ``not a directory`` for one of the wrong ``kind``).

    ``needed_by`` (``{dotted key: [stage, ...]}``), when given, limits the check to the keys it names
    and adds ``(needed by <stages>)`` to each message.
    """
    for f in fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}.{f.name}" if prefix else f.name
        if is_dataclass(value):
            missing_paths(value, key, errors, needed_by)
            continue
        # a key that takes a mapping or a path (pretrain.deepspeed) is only checked when it is a path
        if not f.metadata.get("must_exist") or value is None or not isinstance(value, (str, Path)):
            continue
        stages = None if needed_by is None else needed_by.get(key, [])
        needed = f" (needed by {', '.join(stages)})" if stages else ""
        if stages == []:
            continue
        if Path(value).exists():
            wrong = _wrong_kind(Path(value), f.metadata.get("kind"))
            if wrong:
                errors.append(f"{key}: {wrong}: {value}{needed}")
            continue
        if f.metadata.get("hub_id"):  # a Hugging Face id instead of a path: the local hub cache must hold it
            from pipeline.common import hf_cache

            if hf_cache.is_hub_id(value):
                try:
                    hf_cache.snapshot(str(value), hf_cache.FILES[f.metadata["hub_id"]], key=key)
                except hf_cache.NotCached as err:
                    errors.append(str(err))
                continue
        errors.append(f"{key}: path does not exist: {value}{needed}")


def _wrong_kind(path: Path, kind: str | None) -> str | None:
    """What is wrong with an existing ``path`` that must be a ``kind`` (``file``, ``dir``, None: either)."""
    if kind == "file" and path.is_dir():
        return "a directory, expected a file"
    if kind == "dir" and not path.is_dir():
        return "not a directory"
    return None


# where a dataset's images lie when it has no image_root of its own (dvc.yaml's ingest foreach `img:`)
IMAGES_OF = {"vqa": "coco", "refcoco": "coco", "snli_ve": "flickr30k"}
# source keys that another stage reads, not their dataset's ingest (dvc.yaml's decontaminate deps)
NOT_INGESTED = {"sources.coco.image_info_test": "decontaminate"}
# datasets whose images the download stage fetches (pipeline/ingest/download.py) into their image_root
DOWNLOADED = ("cc", "sbu")
# sections outside ``sources`` with must_exist paths, and the commands that read them
SECTION_READERS = {"extract": ("extract",), "pretrain": ("pretrain", "pretrain_masking", "pretrain_vcr"),
                   "finetune": ("finetune", "seeds", "budgets"), "build_dbs": ("build_dbs",),
                   "model": ("pretrain", "pretrain_masking", "pretrain_vcr", "finetune", "seeds", "budgets")}


def source_needs(params: Params, datasets: Iterable[str] | None = None,
                 image_sources: Iterable[str] | None = None) -> dict[str, list[str]]:
    """``{"sources.<dataset>.<key>": [stage, ...]}``: the raw inputs the configured stages read
    (``datasets``, ``image_sources``: ingest and extract these instead of ``ingest.datasets`` and
    ``extract.sources``).

    ingest@D reads ``sources.D`` (but NOT_INGESTED) and the image root of IMAGES_OF[D]; download@D
    (D in DOWNLOADED) reads ``sources.D`` but the image root it writes; decontaminate reads
    NOT_INGESTED's keys and the image roots of the pretraining and eval datasets (pHash, only with
    ``near_duplicates``); extract@S reads ``sources.S.image_root`` for each of ``extract.sources``.
    """
    needs: dict[str, list[str]] = {}

    def add(key: str, stage: str) -> None:
        if stage not in needs.setdefault(key, []):
            needs[key].append(stage)

    def image_root(dataset: str) -> str:
        return f"sources.{IMAGES_OF.get(dataset, dataset)}.image_root"

    for dataset in params.ingest.datasets if datasets is None else datasets:
        for f in fields(getattr(params.sources, dataset)):
            if f"sources.{dataset}.{f.name}" not in NOT_INGESTED:
                add(f"sources.{dataset}.{f.name}", f"ingest@{dataset}")
        if dataset in IMAGES_OF:
            add(image_root(dataset), f"ingest@{dataset}")
    for dataset in DOWNLOADED:
        for f in fields(getattr(params.sources, dataset)):
            if f.name != "image_root":
                add(f"sources.{dataset}.{f.name}", f"download@{dataset}")
    for key, stage in NOT_INGESTED.items():
        add(key, stage)
    dec = params.decontaminate
    if dec.near_duplicates:
        for dataset in (*dec.pretrain_datasets, *(d for d, splits in params.eval_splits().items() if splits)):
            add(image_root(dataset), "decontaminate")
    for source in params.extract.sources if image_sources is None else image_sources:
        add(image_root(source), f"extract@{source}")
    return needs


def stages_run(params: Params, command: str, item: str | None) -> set[str]:
    """The stages of :func:`source_needs` that ``python -m pipeline <command> [item]`` runs.

    ``ingest``/``download``/``extract`` with an ITEM run that item's stage (``extract SOURCE:k/K``:
    ``extract@SOURCE``), without one every configured item (``ingest.datasets``, the downloadable
    ones of them, ``extract.sources``); ``decontaminate`` runs itself; every other command
    (``build_dbs``, ``import_uniter_db``, training, reports) reads no ``sources`` path.
    """
    if command == "ingest":
        return {f"ingest@{d}" for d in ([item] if item else params.ingest.datasets)}
    if command == "download":
        return {f"download@{d}" for d in ([item] if item else [d for d in DOWNLOADED if d in params.ingest.datasets])}
    if command == "extract":
        return {f"extract@{s}" for s in ([item.split(":", 1)[0]] if item else params.extract.sources)}
    return {command} if command == "decontaminate" else set()


def command_needs(params: Params, command: str, item: str | None) -> dict[str, list[str]]:
    """:func:`source_needs` restricted to the stages that ``command`` (with ``item``) runs."""
    run = stages_run(params, command, item)
    known = {f.name for f in fields(params.sources)} - {"download"}  # an unknown ITEM is the stage's to refuse
    named = lambda stage: sorted({s.split("@", 1)[1] for s in run if s.startswith(f"{stage}@")} & known)  # noqa: E731
    needs = source_needs(params, named("ingest"), named("extract"))  # an ITEM left out of the params too
    return {key: [s for s in stages if s in run] for key, stages in needs.items()}


def unread_inputs(params: Params) -> list[str]:
    """Configured stages whose inputs ``ingest.datasets`` does not produce, one message each (logged, not raised).

    An eval split that decontamination reads but whose dataset is not ingested has no manifest to
    read; the pretraining stages run fine without it, so this is a warning, not an error. (A fine-tuning
    task whose dataset is not ingested is refused at parse time: ``Params.problems``.)
    """
    ingested = set(params.ingest.datasets)
    messages = [f"decontaminate.eval_splits: dataset {d} is not in ingest.datasets "
                 f"(decontaminate reads its manifest)"
                 for d, splits in sorted(params.decontaminate.eval_splits.items()) if splits and d not in ingested]
    messages += [f"decontaminate.pretrain_datasets: dataset {d} is not in ingest.datasets "
                 f"(decontaminate reads its manifest)"
                 for d in params.decontaminate.pretrain_datasets if d not in ingested]
    return messages
