"""The pretraining split rule of a clean manifest, shared by the in-memory and the streamed
decontamination (pipeline/decontam/decontaminate.py, pipeline/decontam/streamed.py)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

# manifest split -> pretraining split; Karpathy test only survives when it is not an eval split
SPLIT_MAP = {"train": "train", "restval": "train", "val": "val", "test": "val"}


def pretrain_split(table: pa.Table, dataset: str, *, val_coco_ids: set[str] | None) -> pa.Array:
    """The ``split`` column of a clean manifest: train|val (SPLIT_MAP; VG rows of COCO-val images -> val)."""
    splits = table.column("split").combine_chunks()
    unknown = sorted(set(pc.unique(splits).to_pylist()) - set(SPLIT_MAP))
    if unknown:
        raise ValueError(f"manifest {dataset}: split values {unknown} not in {sorted(SPLIT_MAP)}")
    mapped = splits
    for old, new in SPLIT_MAP.items():
        if old != new:
            mapped = pc.if_else(pc.equal(mapped, old), new, mapped)
    if val_coco_ids is not None and "coco_id" in table.column_names:
        is_val = pc.fill_null(pc.is_in(table.column("coco_id").cast(pa.string()),
                                       value_set=pa.array(sorted(val_coco_ids), pa.string())), False)
        mapped = pc.if_else(is_val, "val", mapped)
    return mapped.cast(splits.type)
