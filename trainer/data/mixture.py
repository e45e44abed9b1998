"""alignment-handbook's `dataset_mixture`: several datasets, each with its columns, split and weight, as one.

    dataset_mixture:
      datasets:
        - {id: HuggingFaceH4/ultrachat_200k, config: default, split: train_sft, columns: [messages], weight: 0.5}
      seed: 0
      test_split_size: 1000

It means what alignment-handbook's get_dataset does with it: each dataset loaded (`id`, `config`,
`split`), its `columns` selected, a `weight` below 1 keeping the first int(len x weight) records
after a shuffle with `seed`; the datasets concatenated and shuffled with `seed`; with
`test_split_size`, the train part of train_test_split(test_size, seed) is trained on (the test
part is for evaluation). The mixture travels as `--dataset mixture:{JSON}` (`spec`), so the
data's cache key, the run record and a resume compare it like any dataset location. Pure and
stdlib-only: the config reader validates with it.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "mixture:"
_ENTRY = {"id", "config", "split", "columns", "weight"}


def is_mixture(spec: str) -> bool:
    return spec.startswith(PREFIX)


def spec(value: Any) -> str:
    """The mixture as a canonical `mixture:{JSON}` dataset location; ValueError naming what is wrong."""
    if not isinstance(value, dict) or not isinstance(value.get("datasets"), list) or not value["datasets"]:
        raise ValueError("expected {datasets: [{id, config, split, columns, weight}, ...], seed, test_split_size}")
    unknown = set(value) - {"datasets", "seed", "test_split_size"}
    if unknown:
        raise ValueError(f"unknown keys {', '.join(sorted(unknown))} (known: datasets, seed, test_split_size)")
    entries = []
    for i, entry in enumerate(value["datasets"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or set(entry) - _ENTRY:
            raise ValueError(f"datasets[{i}]: expected {{id, config, split, columns, weight}} with a string id, "
                             f"found {entry!r}")
        weight = entry.get("weight")
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float))
                                   or not 0 < weight <= 1):
            raise ValueError(f"datasets[{i}].weight: {weight!r}; expected a fraction above 0, at most 1")
        columns = entry.get("columns")
        if columns is not None and (not isinstance(columns, list) or not all(isinstance(c, str) for c in columns)):
            raise ValueError(f"datasets[{i}].columns: expected a list of column names, found {columns!r}")
        entries.append({"id": entry["id"], "config": entry.get("config"), "split": entry.get("split", "train"),
                        "columns": columns, "weight": weight})
    seed, test = value.get("seed", 0), value.get("test_split_size")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: {seed!r}; expected a whole number")
    if test is not None and (isinstance(test, bool) or not isinstance(test, (int, float)) or test <= 0):
        raise ValueError(f"test_split_size: {test!r}; expected a fraction (0.05) or a record count (1000)")
    return PREFIX + json.dumps({"datasets": entries, "seed": seed, "test_split_size": test}, sort_keys=True)


def parse(location: str) -> dict:
    return json.loads(location[len(PREFIX):])


def label(location: str) -> str:
    """A short name for messages and run names: the datasets' ids."""
    ids = list(dict.fromkeys(e["id"] for e in parse(location)["datasets"]))
    return "mixture of " + ", ".join(ids)
