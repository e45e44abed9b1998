"""The pre-flight's sample (trainer.data.sources.sample): the first records of a dataset read without the rest,
local or on S3 (moto's server), the same records and the same messages as the whole read, and the size."""

from __future__ import annotations

import gzip
import io
import json

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from trainer.data import sources
from trainer.data.packing import DataError, load_records
from trainer.storage import Storage

from .test_s3_storage import BUCKET, s3  # noqa: F401 - the moto S3 server fixture

ROWS = [{"messages": [{"role": "user", "content": f"question {i} " + "words " * (i % 13)},
                      {"role": "assistant", "content": f"answer {i} " + "more " * (i % 17)}]} for i in range(20_000)]


class _CountingFile(io.RawIOBase):
    def __init__(self, raw, handler):
        super().__init__()
        self.raw, self.handler = raw, handler

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def readinto(self, buffer) -> int:
        data = self.raw.read(len(buffer))
        buffer[:len(data)] = data
        self.handler.served += len(data)
        return len(data)


class Counting(pafs.FileSystemHandler):
    """A filesystem in front of another that counts every byte read through it (what S3 served)."""

    def __init__(self, fs):
        self.fs, self.served = fs, 0

    def get_type_name(self):
        return "counting"

    def normalize_path(self, path):
        return self.fs.normalize_path(path)

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise NotImplementedError

    def delete_file(self, path):
        self.fs.delete_file(path)

    def move(self, src, dest):
        self.fs.move(src, dest)

    def copy_file(self, src, dest):
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path):
        return pa.PythonFile(_CountingFile(self.fs.open_input_file(path), self), mode="r")

    def open_input_file(self, path):
        return pa.PythonFile(_CountingFile(self.fs.open_input_file(path), self), mode="r")

    def open_output_stream(self, path, metadata):
        return self.fs.open_output_stream(path, metadata=metadata, compression=None)

    def open_append_stream(self, path, metadata):
        raise NotImplementedError


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _parquet(rows, row_group_size: int) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink, row_group_size=row_group_size)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("name", ["big.jsonl", "big.jsonl.gz", "big.parquet"])
def test_an_s3_datasets_100_record_check_reads_a_small_part_of_it_and_gives_the_records_of_the_whole_read(
        s3, tmp_path, name):  # noqa: F811
    counting = Counting(s3.filesystem())
    fs = pafs.PyFileSystem(counting)
    body = {"big.jsonl": lambda: _jsonl(ROWS), "big.jsonl.gz": lambda: gzip.compress(_jsonl(ROWS)),
            "big.parquet": lambda: _parquet(ROWS, 2_000)}[name]()
    Storage.from_uri(f"s3://{BUCKET}/sample", fs=s3.filesystem()).write_bytes(body, name)
    uri = f"s3://{BUCKET}/sample/{name}"

    got = sources.sample(uri, storage_fs=fs, limit=100, cache_dir=tmp_path / "cache")
    sampled, counting.served = counting.served, 0
    whole = load_records(uri, storage_fs=fs, limit=100, cache_dir=tmp_path / "cache")  # today: fetched whole
    assert counting.served >= len(body)  # the counter sees what the whole read fetches
    assert got.records == whole and len(got.records) == 100
    assert sampled == got.bytes_read and sampled < len(body) / 3, (sampled, len(body))  # parquet: footer + 1 group
    assert got.size.stored_bytes == len(body)
    if name.endswith(".parquet"):
        assert (got.size.records, got.size.how) == (len(ROWS), "the parquet footer's row count")
    else:  # bytes over the sample's bytes per record: the first records are as long as the rest on average
        assert got.size.records is None and got.size.estimated_records == pytest.approx(len(ROWS), rel=0.15)
        assert "estimated from" in got.size.how


def test_a_local_file_is_sampled_from_its_first_lines_and_a_short_one_is_counted_exactly(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(_jsonl(ROWS[:2500]))
    got = sources.sample(str(path), limit=100)
    assert got.records == load_records(str(path), limit=100) and got.bytes_read < path.stat().st_size / 3
    sliced = sources.sample(str(path), "train[:7]", limit=100)
    assert sliced.records == ROWS[:7] and sliced.size.count == 7 and "at most 7 by --dataset-split" in sliced.size.how
    assert sources.sample(str(path), "train[:2000]", limit=100).size.count == 2000
    whole = sources.sample(str(path), limit=2500)
    assert whole.size.records == 2500 and whole.size.how == "the sample reached the end of the file"
    assert sources.sample(str(path), limit=3000).records == ROWS[:2500]
    assert sources.sample(str(path), limit=2499).size.records is None  # one record left: not the end
    (tmp_path / "t.txt").write_text("one\n\ntwo\nthree\n")  # text: every line is a record, blank ones too
    assert sources.sample(str(tmp_path / "t.txt")).records == load_records(str(tmp_path / "t.txt"))


def test_a_saved_dataset_and_a_folder_are_read_as_before_and_counted_from_what_is_opened(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS[:300]).save_to_disk(str(tmp_path / "saved"))
    got = sources.sample(str(tmp_path / "saved"), limit=100)
    assert got.records == ROWS[:100] and (got.size.records, got.size.how) == (300, "the saved dataset's length")
    (tmp_path / "shards").mkdir()
    for i in range(2):
        (tmp_path / "shards" / f"train-{i}.jsonl").write_bytes(_jsonl(ROWS[i * 60:(i + 1) * 60]))
    got = sources.sample(str(tmp_path / "shards"), limit=100, cache_dir=tmp_path / "cache")
    assert got.records == ROWS[:100] and got.size.records == 120


BAD = {  # name -> (the file's bytes, its first bad record within the sample)
    "notjson.jsonl": (_jsonl(ROWS[:5]) + b"{not json\n" + _jsonl(ROWS[5:300]), "notjson.jsonl line 6, column 2 is not JSON"),
    "latin1.jsonl": (_jsonl(ROWS[:3]) + '{"text": "caf\u00e9"}\n'.encode("latin-1") + _jsonl(ROWS[3:300]),
                     "latin1.jsonl line 4 (byte"),
    "deep.jsonl": (_jsonl(ROWS[:2]) + b"[" * 70 + b"]" * 70 + b"\n" + _jsonl(ROWS[2:300]),
                   "deep.jsonl line 3 nests more than 64 levels"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_records_in_the_sample_give_the_messages_of_the_whole_read(tmp_path, s3, name):  # noqa: F811
    body, needle = BAD[name]
    (tmp_path / name).write_bytes(body)
    with pytest.raises(DataError) as today:
        load_records(str(tmp_path / name), limit=100, cache_dir=tmp_path / "cache")
    with pytest.raises(DataError) as sampled:
        sources.sample(str(tmp_path / name), limit=100)
    assert needle in str(today.value)
    assert str(sampled.value) == str(today.value)
    Storage.from_uri(f"s3://{BUCKET}/bad", fs=s3.filesystem()).write_bytes(body, name)
    with pytest.raises(DataError) as remote:
        sources.sample(f"s3://{BUCKET}/bad/{name}", storage_fs=s3.filesystem(), limit=100)
    assert str(remote.value) == str(today.value).replace(str(tmp_path / name), f"s3://{BUCKET}/bad/{name}")


def test_a_missing_or_empty_s3_object_is_named_as_before(s3, tmp_path):  # noqa: F811
    with pytest.raises(DataError, match="not found in S3; check the bucket and key"):
        sources.sample(f"s3://{BUCKET}/nowhere/x.jsonl", storage_fs=s3.filesystem(), cache_dir=tmp_path)
    Storage.from_uri(f"s3://{BUCKET}/empty", fs=s3.filesystem()).write_bytes(b"\n\n", "blank.jsonl")
    with pytest.raises(DataError, match="blank.jsonl'.*is empty; it needs at least one record"):
        sources.sample(f"s3://{BUCKET}/empty/blank.jsonl", storage_fs=s3.filesystem(), cache_dir=tmp_path)
