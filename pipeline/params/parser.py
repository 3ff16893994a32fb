"""Strict, typed parameters: ``params.yaml`` -> frozen dataclasses.

Every section of ``params.yaml`` maps to a frozen dataclass in ``pipeline/params/``. Parsing is
strict: an unknown or misspelled key, a value of the wrong type, or a missing required key raises
:class:`ParamsError` naming the dotted key (``pretrain.mix_ratio.mlm``) and the file. Paths marked
``must_exist`` are checked after parsing, so a wrong source path fails before any work starts.
Values are checked too: a key's range sits on its field (``bounded`` in ``pipeline/params/checks``, e.g.
``pretrain.steps: must be an integer in [1, 10000000], got 0``), checked first; then a section's
``problems()`` (rules between keys, mappings, names), so a stage never starts with a value it cannot run.

``--set a.b=value`` overrides are applied to the raw mapping before parsing; the value is read as
YAML (``--set pretrain.steps=10`` gives an int, ``--set sources.cc.train_tsv=null`` gives None).
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import enum
import hashlib
import json
import logging
import math
import re
import types
import typing
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml

from pipeline.params.checks import MAX_SEED, Range, must_exist, range_problems  # noqa: F401  (must_exist re-exported)
from pipeline.params.dbs import BuildDbsConfig
from pipeline.params.decontaminate import (DecontaminateConfig, effective_eval_splits, eval_split_origins,
                                         pretrain_corpora)
from pipeline.params.extract import ExtractConfig
from pipeline.params.finetune import TASK_SPLITS, FinetuneConfig, apply_task_presets
from pipeline.params.ingest import IngestConfig
from pipeline.params.inputs import SECTION_READERS, command_needs, missing_paths, source_needs, unread_inputs
from pipeline.params.model import ModelConfig
from pipeline.params.pretrain import PretrainConfig, apply_recipe
from pipeline.params.world import MiniWorldConfig, SourcesConfig

DEFAULT_PARAMS = Path("params.yaml")
log = logging.getLogger(__name__)


class FrozenDict(dict):
    """A read-only dict (picklable, unlike MappingProxyType) for mapping-valued params."""

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("params are read-only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly  # type: ignore[assignment]

    def __reduce__(self):
        return (FrozenDict, (dict(self),))


class ParamsError(ValueError):
    """A params file (or override) does not match the typed schema."""


@dataclass(frozen=True)
class PathsConfig:
    """Where the pipeline writes. Every artifact lives below ``data``."""

    data: Path = Path("data")
    runs: Path = Path("runs")


@dataclass(frozen=True)
class Params:
    """The whole of ``params.yaml``."""

    world: Literal["mini", "real"]
    seed: int
    paths: PathsConfig
    mini_world: MiniWorldConfig
    sources: SourcesConfig
    ingest: IngestConfig
    decontaminate: DecontaminateConfig
    extract: ExtractConfig
    build_dbs: BuildDbsConfig
    model: ModelConfig
    pretrain: PretrainConfig
    finetune: FinetuneConfig

    def problems(self) -> list[tuple[str, str]]:
        """Top-level keys that are wrong, as (key, message); the parser raises on them."""
        message = Range(0, MAX_SEED).problem(self.seed)
        out = ([("seed", message)] if message else []) + self._scored_split_problems()
        if self.pretrain.steps == 0 and self.model.uniter_checkpoint is None:  # nothing to start from but BERT
            out.append(("pretrain.steps", "0 (no training) needs model.uniter_checkpoint, the model to export as is"))
        if self.pretrain.steps == 0 and self.pretrain.zero_stage != 0:  # no checkpoint: exported from the module
            out.append(("pretrain.zero_stage", "must be 0 with pretrain.steps 0 (nothing trained, no ZeRO checkpoint to "
                                               "export from)"))
        return out

    def _scored_split_problems(self) -> list[tuple[str, str]]:
        """A task whose scored splits decontamination cannot see (dataset not ingested) is refused:
        its images could be in pretraining. Real VQA/VCR test images come without labels but are
        still ingested (their questions), so this only bites a dataset left out of ingest.datasets."""
        ingested = set(self.ingest.datasets)
        unseen = {task: TASK_SPLITS[task] for task in self.finetune.tasks if TASK_SPLITS[task].dataset not in ingested}
        if not unseen:
            return []
        scored = "; ".join(f"{task} scores {ts.dataset} {'/'.join(ts.scored)}" for task, ts in unseen.items())
        return [("finetune.tasks", f"{scored}: not in ingest.datasets, so decontaminate cannot remove those images "
                 f"from pretraining (ingest {sorted({ts.dataset for ts in unseen.values()})} or drop "
                 f"{list(unseen)} from finetune.tasks)")]

    def eval_split_origins(self) -> dict[str, dict[str, list[str]]]:
        """``{dataset: {split: [origin, ...]}}`` of every split decontamination removes (docs/design.md)."""
        dec = self.decontaminate
        return eval_split_origins(dec.eval_splits, self.finetune.tasks, dec.keep_dev_in_pretraining)

    def pretrain_corpora(self) -> tuple[str, ...]:
        """The pretraining corpora in use: :func:`pipeline.params.decontaminate.pretrain_corpora`."""
        return pretrain_corpora(self.ingest.datasets, self.decontaminate.pretrain_datasets)

    def eval_splits(self) -> dict[str, tuple[str, ...]]:
        """``{dataset: splits}`` decontamination removes: ``decontaminate.eval_splits`` + every scored split."""
        dec = self.decontaminate
        return effective_eval_splits(dec.eval_splits, self.finetune.tasks, dec.keep_dev_in_pretraining)

    def digest(self) -> str:
        """sha256 of the canonical JSON form of these params (for ``_run.json``)."""
        return hashlib.sha256(json.dumps(to_dict(self), sort_keys=True).encode()).hexdigest()

    def section_digest(self, *names: str) -> str:
        """sha256 of only the named sections (what a stage actually depends on)."""
        payload = {n: to_dict(getattr(self, n)) for n in names}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# parsing


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _parse_value(tp: Any, value: Any, key: str) -> Any:
    """Convert ``value`` to type ``tp`` or raise ParamsError naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _parse_value(arg, value, key)
            except ParamsError as err:
                errors.append(str(err))
        raise ParamsError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise ParamsError(f"{key}: expected one of {list(args)}, got {value!r}")
        return value
    if is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ParamsError(f"{key}: expected a mapping for section {tp.__name__}, got {value!r}")
        return _parse_dataclass(tp, value, key)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise ParamsError(f"{key}: expected one of {[m.value for m in tp]}, got {value!r}") from None
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ParamsError(f"{key}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ParamsError(f"{key}: expected {len(args)} items, got {len(value)}")
            return tuple(_parse_value(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        item_tp = args[0] if args else Any
        items = [_parse_value(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items)
    if origin in (dict, collections.abc.Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ParamsError(f"{key}: expected a mapping, got {value!r}")
        ktp, vtp = args if args else (Any, Any)
        return FrozenDict(
            {_parse_value(ktp, k, f"{key}.{k}"): _parse_value(vtp, v, f"{key}.{k}") for k, v in value.items()}
        )
    if tp is bool:
        if not isinstance(value, bool):
            raise ParamsError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamsError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamsError(f"{key}: expected a number, got {value!r}")
        if not math.isfinite(value):  # .nan / .inf are YAML floats, but no parameter means them
            raise ParamsError(f"{key}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ParamsError(f"{key}: expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, str):
            raise ParamsError(f"{key}: expected a path string, got {value!r}")
        if not value.strip():  # Path("") is the working directory: paths.data="" wrote into the repository
            raise ParamsError(f"{key}: expected a path, got an empty string (use . for the working directory)")
        return Path(value)
    raise ParamsError(f"{key}: unsupported type {_type_name(tp)} in schema")


def _parse_dataclass(cls: type, raw: Mapping[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls) if f.init}
    dotted = (prefix + ".") if prefix else ""
    unknown = sorted(set(raw) - set(known))
    if unknown:
        close = {u: _closest(u, known) for u in unknown}
        hint = "; ".join(f"did you mean '{dotted}{c}'?" for u, c in close.items() if c)
        raise ParamsError(
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(dotted + u for u in unknown)}"
            + (f" ({hint})" if hint else "")
        )
    kwargs = {}
    for name, f in known.items():
        key = dotted + name
        if name in raw:
            kwargs[name] = _parse_scalar_or_value(f, hints[name], raw[name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ParamsError(f"missing key {key}")
    obj = cls(**kwargs)
    # each key's own range first: the section's rules between keys may then rely on every key being valid
    problems = range_problems(obj)
    if not problems and hasattr(obj, "problems"):
        problems = obj.problems()
    if problems:
        raise ParamsError("; ".join(f"{dotted}{key}: {text}" for key, text in problems))
    return obj


def _parse_scalar_or_value(f: dataclasses.Field, tp: Any, value: Any, key: str) -> Any:
    """``_parse_value``, but a value of the wrong type for a :func:`bounded` key is told the range too."""
    rng = f.metadata.get("range")
    try:
        return _parse_value(tp, value, key)
    except ParamsError:
        if rng is None:
            raise
        kind = "an integer" if tp is int else "a finite number"
        raise ParamsError(f"{key}: must be {kind} in {rng}, got {value!r}") from None


def _closest(word: str, candidates: Mapping[str, Any]) -> str | None:
    import difflib

    match = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return match[0] if match else None


# Where Airflow runs live (runs/<run_name>/): this variable, else paths.runs; the deployment's choice
RUNS_DIR_ENV = "UNITER_RUNS_DIR"


# --------------------------------------------------------------------------------------------
# overrides and loading


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply one ``a.b.c=value`` override to the raw mapping in place (value parsed as YAML)."""
    if "=" not in assignment:
        raise ParamsError(f"--set expects KEY=VALUE, got {assignment!r}")
    dotted, text = assignment.split("=", 1)
    parts = dotted.strip().split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ParamsError(f"--set {dotted}: {'.'.join(parts[: i + 1])} is not a section")
        node = child
    node[parts[-1]] = read_yaml(text, f"--set {dotted}") if text.strip() else ""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: SafeLoader itself refuses it below
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice",
                                                            key_node.start_mark)
        return super().construct_mapping(node, deep)


# YAML 1.2 floats without a dot (5e-05, 1E3): PyYAML (YAML 1.1) reads them as strings, and JSON
# writes small floats that way (an Airflow conf's "pretrain.optim.lr": 5e-05)
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
                                    list("-+0123456789"))


def read_yaml(text: str, source: str) -> Any:
    """Parse YAML ``text`` strictly; ParamsError naming ``source`` and the line on a syntax error
    or a duplicate key."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ParamsError(f"{source}: not valid YAML{where}: {problem}") from None


def load_raw(path: Path | str = DEFAULT_PARAMS) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"params file not found: {path}")
    if not path.is_file():
        raise ParamsError(f"{path}: not a file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ParamsError(f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} on line {line}); save it as UTF-8") \
            from None
    raw = read_yaml(text, str(path)) or {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping at the top level")
    return raw


def parse_params(raw: Mapping[str, Any], *, source: str = "<params>", check_paths: bool = True,
                 command: str | None = None, item: str | None = None) -> Params:
    """Parse a raw mapping into :class:`Params`; raise ParamsError naming the key and ``source``.

    ``command`` (a CLI command, with its ``item``) limits the path check to what that command reads
    (``pipeline.params.inputs.command_needs``); None checks what every configured stage reads.

    Keys that ``pretrain.recipe`` governs and ``raw`` leaves null or absent get that recipe's value
    first (``params.pretrain.apply_recipe``; ``raw`` itself is not changed)."""
    if isinstance(raw, Mapping):
        raw = apply_recipe(copy.deepcopy(dict(raw)))
        preset_problems = apply_task_presets(raw)  # named fine-tuning budgets (params.finetune.TASK_PRESETS)
        if preset_problems:
            raise ParamsError(f"{source}: " + "; ".join(preset_problems))
    try:
        params = _parse_dataclass(Params, raw, "")
    except ParamsError as err:
        raise ParamsError(f"{source}: {err}") from None
    for message in unread_inputs(params):
        log.warning("%s: %s", source, message)
    if check_paths:
        errors: list[str] = []
        if params.world == "real":  # only what the stages run read: a partial download is fine
            needs = source_needs(params) if command is None else command_needs(params, command, item)
            missing_paths(params.sources, "sources", errors, needs)
        for section, readers in SECTION_READERS.items():
            if command is None or command in readers:
                missing_paths(getattr(params, section), section, errors)
        if errors:
            raise ParamsError(f"{source}: " + "; ".join(errors))
    return params


def load_params(
    path: Path | str = DEFAULT_PARAMS, overrides: list[str] | tuple[str, ...] = (), *, check_paths: bool = True,
    command: str | None = None, item: str | None = None,
) -> Params:
    """Read ``path``, apply ``--set`` overrides, parse strictly (``command``, ``item``: see
    :func:`parse_params`). Raises ParamsError."""
    raw = load_raw(path)
    for assignment in overrides:
        apply_override(raw, assignment)
    return parse_params(raw, source=str(path), check_paths=check_paths, command=command, item=item)


def to_dict(obj: Any) -> Any:
    """A JSON-ready plain form of a (nested) config dataclass."""
    if is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    return obj


def dump_params(params: Params, path: Path) -> None:
    """Write params back as YAML (used by Airflow runs to record what they ran with)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_dict(params), sort_keys=False))
