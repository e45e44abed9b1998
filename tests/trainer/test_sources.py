"""Data sources read through `datasets`: files of each type, shard folders, save_to_disk, s3://, the hub.

A hub dataset cannot be fetched here. Its arguments (config/subset, split) go through the
same `datasets.load_dataset(path, name=..., split=...)` call for a local folder laid out as
a hub dataset repository (a README with `configs:`), which is what is tested; the hub
itself is tested only for its error, which is real (the hub is unreachable here).
"""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer import demo
from trainer.data.packing import DataError, DataSpec, load_records, prepare
from trainer.data.sources import fingerprint, resolve

from .test_s3_storage import BUCKET, s3  # noqa: F401 - the moto S3 server fixture

ROWS = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(6)]


def write(path, rows=ROWS):
    path.parent.mkdir(parents=True, exist_ok=True)
    kind = path.name.split(".", 1)[1]
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path.write_text(json.dumps(rows))
    elif kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif kind == "csv":
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return path


@pytest.mark.parametrize("name", ["a.jsonl", "a.json", "a.parquet", "a.csv"])
def test_each_file_type_loads_the_same_records(tmp_path, name):
    assert load_records(str(write(tmp_path / name)), cache_dir=tmp_path / "cache") == ROWS


def test_a_folder_of_shards_loads_every_shard_in_order(tmp_path):
    for i in range(3):
        write(tmp_path / "shards" / f"train-{i:05d}-of-00003.parquet", ROWS[2 * i:2 * i + 2])
    assert load_records(str(tmp_path / "shards"), cache_dir=tmp_path / "cache") == ROWS
    assert resolve(str(tmp_path / "shards")).kind == "folder"


def test_save_to_disk_output_loads_a_dataset_or_a_split_of_a_dataset_dict(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    assert load_records(str(tmp_path / "saved")) == ROWS
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:4]),
                          "test": datasets.Dataset.from_list(ROWS[4:])}).save_to_disk(str(tmp_path / "dict"))
    assert load_records(str(tmp_path / "dict"), "test") == ROWS[4:]
    assert load_records(str(tmp_path / "dict"), "train[1:3]") == ROWS[1:3]
    with pytest.raises(DataError, match="no split 'validation'; its splits are train, test \\(--dataset-split\\)"):
        load_records(str(tmp_path / "dict"), "validation")


def test_a_hub_layout_folder_takes_the_config_and_split_as_the_hub_does(tmp_path):
    repo = tmp_path / "repo"
    for config in ("short", "long"):
        for split in ("train", "test"):
            write(repo / config / f"{split}.jsonl", [{"text": f"{config}-{split}-{i}"} for i in range(3)])
    (repo / "README.md").write_text(
        "---\nconfigs:\n" + "".join(
            f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train.jsonl\n"
            f"  - split: test\n    path: {c}/test.jsonl\n" for c in ("short", "long")) + "---\n")
    got = load_records(str(repo), "test", config="long", cache_dir=tmp_path / "cache")
    assert [r["text"] for r in got] == ["long-test-0", "long-test-1", "long-test-2"]
    assert [r["text"] for r in load_records(str(repo), "train[:2]", config="short", cache_dir=tmp_path / "cache")] \
        == ["short-train-0", "short-train-1"]
    with pytest.raises(DataError, match="config 'medium'.*cannot read it"):
        load_records(str(repo), config="medium", cache_dir=tmp_path / "cache")


def test_a_hub_id_that_cannot_be_fetched_names_the_id_config_split_and_what_to_check(tmp_path):
    src = resolve("HuggingFaceH4/no-such-dataset", config="default", split="train_sft")
    assert src.kind == "hub"
    with pytest.raises(DataError) as e:
        load_records("HuggingFaceH4/no-such-dataset", "train_sft", config="default", cache_dir=tmp_path / "cache")
    msg = str(e.value)
    for needle in ("'HuggingFaceH4/no-such-dataset'", "config 'default'", "split 'train_sft'",
                   "loading it from the Hugging Face hub failed", "--dataset-config", "HF_TOKEN"):
        assert needle in msg, (needle, msg)


def test_a_path_that_does_not_exist_is_not_taken_for_a_hub_id(tmp_path):
    for spec in (str(tmp_path / "nope"), "data/train.jsonl", "./x.parquet"):
        with pytest.raises(DataError, match="not found; pass an existing"):
            resolve(spec)


def test_s3_files_and_prefixes_are_read_through_the_storage_filesystem(s3, tmp_path):  # noqa: F811
    from trainer.storage import Storage

    store = Storage.from_uri(f"s3://{BUCKET}/data", fs=s3.filesystem())
    store.write_bytes(write(tmp_path / "one.jsonl").read_bytes(), "one.jsonl")
    for i in range(2):
        store.write_bytes(write(tmp_path / f"s{i}.parquet", ROWS[3 * i:3 * i + 3]).read_bytes(),
                          "shards", f"train-{i}.parquet")
    cache = tmp_path / "cache"
    assert load_records(f"s3://{BUCKET}/data/one.jsonl", storage_fs=s3.filesystem(), cache_dir=cache) == ROWS
    assert load_records(f"s3://{BUCKET}/data/shards/", storage_fs=s3.filesystem(), cache_dir=cache) == ROWS
    with pytest.raises(DataError, match="not found in S3"):
        load_records(f"s3://{BUCKET}/data/missing.jsonl", storage_fs=s3.filesystem(), cache_dir=cache)
    # a single compressed object: its bytes as stored (not gunzipped by the filesystem), then read as datasets does
    import gzip

    packed = gzip.compress(write(tmp_path / "gz.jsonl").read_bytes())
    with s3.filesystem().open_output_stream(f"{BUCKET}/data/train.jsonl.gz", compression=None) as f:
        f.write(packed)
    assert store.read_bytes("train.jsonl.gz") == packed
    assert load_records(f"s3://{BUCKET}/data/train.jsonl.gz", storage_fs=s3.filesystem(), cache_dir=cache) == ROWS
    store.write_bytes(packed, "again.jsonl.gz")
    assert store.read_bytes("again.jsonl.gz") == packed  # written as given, not compressed a second time
    # a changed object is fetched again (the cache is keyed by the listing: names and sizes)
    store.write_bytes(write(tmp_path / "two.jsonl", ROWS[:2]).read_bytes(), "one.jsonl")
    assert load_records(f"s3://{BUCKET}/data/one.jsonl", storage_fs=s3.filesystem(), cache_dir=cache) == ROWS[:2]


def test_the_same_records_pack_identically_from_any_source_and_the_fingerprint_follows_the_files(tmp_path):
    rows, _ = demo.make_dataset(seed=2, n_train=80, n_eval=1)
    tok = demo.build_tokenizer()
    jsonl = write(tmp_path / "train.jsonl", rows)
    import datasets

    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    a = prepare(DataSpec(str(jsonl)), tokenizer=tok, seq_len=64, cache_dir=tmp_path / "cache")
    b = prepare(DataSpec(str(tmp_path / "saved")), tokenizer=tok, seq_len=64, cache_dir=tmp_path / "cache")
    assert a.folder != b.folder
    for name in ("input_ids", "labels", "position_ids"):
        assert (a.arrays[name] == b.arrays[name]).all()
    before = fingerprint(resolve(str(jsonl)))
    write(jsonl, rows[:40])
    assert fingerprint(resolve(str(jsonl))) != before
    c = prepare(DataSpec(str(jsonl)), tokenizer=tok, seq_len=64, cache_dir=tmp_path / "cache")
    assert c.folder != a.folder and c.meta["records"] == 40
