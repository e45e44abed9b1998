"""The data pass on the Ray cluster's CPUs: each chunk of records tokenized and packed by a task, written once.

    driver (head)   one remote call; holds no record
    coordinator     a task on a node with CPUs: opens the source (`datasets`, s3:// included), numbers
                    the chunks (trainer.data.packing.chunk_starts) and hands each chunk's records to a
                    task as Arrow IPC bytes, at most `workers` in flight (memory: that many chunks)
    chunk tasks     one CPU each: tokenize, mask, pack (best fit within the chunk), write the shard
                    to <storage>/_data/<key>/shard-NNNNN; return the chunk's statistics
    coordinator     merges the statistics and writes meta.json last

The chunks are fixed by the record count, so the rows are the same as packing.prepare's for any
number of workers. A preparation whose meta.json exists is reused (a retried attempt, another run
of the same data); a node reads the shards from the storage (open_prepared), never the records.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

from trainer import cache
from trainer.data import packing, shards, sources
from trainer.data.packing import CHUNK_RECORDS, DataSpec, PackedData, PackStats
from trainer.storage import Storage

MIN_IN_FLIGHT = 16  # chunk tasks queued at least: on an autoscaling cluster, the demand that brings up nodes


def prepared_storage(storage: Storage, key: str) -> Storage:
    """Where a preparation's shards live in the run storage."""
    return Storage(storage.fs, storage.path(shards.DATA_DIR, key))


def prepare_on_ray(data: DataSpec, tokenizer, seq_len: int, storage: Storage, cache_dir: str | Path, *,
                   dataset_fs: Any = None, workers: int | None = None, chunk_records: int = CHUNK_RECORDS) -> dict:
    """The dataset prepared on the connected Ray cluster into `storage`'s _data/<key> (or found there); its meta,
    with `prep`: workers, chunks, seconds, peak_rss_bytes (the largest process's), disk_bytes, reused.

    `workers`: chunk tasks at once (default: the cluster's CPUs, at least MIN_IN_FLIGHT). A bad record raises
    its DataError, numbered as in the whole dataset."""
    import ray

    node, options = coordinator_placement(ray.nodes())
    if node:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
    limit = workers or max(MIN_IN_FLIGHT, int(ray.cluster_resources().get("CPU", 0)))
    coordinator = ray.remote(_coordinate).options(**options)
    ref = coordinator.remote(data, [ray.put(tokenizer)], seq_len, storage, str(cache_dir), dataset_fs, limit,
                             chunk_records)
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        raise _cause(e) from None


def open_prepared(storage: Storage, key: str, cache_dir: str | Path) -> PackedData:
    """A preparation's rows on this node: memory-mapped where the storage is local, else downloaded once per node
    into the cache (a replaced node downloads them again, and prepares nothing)."""
    if storage.is_local:
        return PackedData(prepared_storage(storage, key).root)
    target = Path(cache_dir) / "data" / key
    with cache.lock(cache_dir, f"shards-{key}"):
        if not (target / shards.META).is_file():
            cache.fill(target, lambda tmp: storage.download_dir(tmp, shards.DATA_DIR, key), key)
    return PackedData(target)


def coordinator_placement(nodes: list[dict]) -> tuple[str | None, dict[str, Any]]:
    """Where the coordinator runs, from ray.nodes(): beside CPUs, never on a head that offers none (EKS's).

    On a live node with CPUs it takes none of them (pinned there, softly), so the chunk tasks have them all;
    with no such node yet (a scaled-to-zero pool) it asks for one CPU, which has the autoscaler start a node."""
    for node in nodes:
        if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) > 0:
            return node["NodeID"], {"num_cpus": 0, "max_retries": 0}
    return None, {"num_cpus": 1, "max_retries": 0}


def _cause(error) -> BaseException:
    """The task's own exception (a DataError stays a DataError: exit 2), else Ray's."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _ipc(table) -> bytes:
    """A chunk's records as Arrow IPC bytes: only the chunk's slice of the memory-mapped table travels."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _coordinate(data: DataSpec, tokenizer_box: list, seq_len: int, storage: Storage, cache_dir: str,
                dataset_fs: Any, limit: int, chunk_records: int) -> dict:
    import ray

    t0 = time.perf_counter()
    tokenizer_ref = tokenizer_box[0]
    tokenizer = ray.get(tokenizer_ref)
    source, ds, fp = packing.open_source(data, dataset_fs, cache_dir)
    key = packing.cache_key(data, fp, tokenizer, seq_len)
    out = prepared_storage(storage, key)
    found = shards.read_meta(out)
    if found is not None:
        return {**found, "key": key, "prep": {"reused": True, "seconds": time.perf_counter() - t0, "workers": 0,
                                              "chunks": len(found["shards"]), "peak_rss_bytes": _peak_rss(),
                                              "disk_bytes": sum(out.file_sizes().values())}}
    task = ray.remote(_pack_task).options(num_cpus=1, max_retries=1)
    arrow = ds.with_format("arrow")  # chunks sliced from the memory-mapped table
    pending, done = {}, {}

    def collect(ready) -> None:
        for ref in ready:
            index = pending.pop(ref)
            try:
                done[index] = ray.get(ref)
            except ray.exceptions.RayTaskError as e:
                raise _cause(e) from None

    try:
        for index, start in enumerate(packing.chunk_starts(len(ds), chunk_records)):
            while len(pending) >= limit:
                ready, _ = ray.wait(list(pending), num_returns=1)
                collect(ready)
            rows = _ipc(arrow[start:start + chunk_records])
            pending[task.remote(index, start, rows, ds.features, data, tokenizer_ref, seq_len, out)] = index
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            collect(ready)
    except UnicodeDecodeError as e:  # pyarrow reads JSON bytes as they are; decoding happens in the tasks
        raise sources.undecodable(source, e) from None
    finally:
        for ref in pending:
            ray.cancel(ref)
    parts = [PackStats(**done[i]["stats"]) for i in sorted(done)]
    stats = packing.merged_stats(parts, seq_len, data.one_per_row)
    packing.check_packed(stats, data, len(ds))
    meta = packing.packed_meta(data, stats, len(ds), fp, [done[i]["stats"]["rows"] for i in sorted(done)],
                               chunk_records)
    shards.write_meta(out, meta)
    prep = {"reused": False, "seconds": time.perf_counter() - t0, "workers": limit, "chunks": len(done),
            "peak_rss_bytes": max([_peak_rss()] + [d["peak_rss_bytes"] for d in done.values()]),
            "disk_bytes": sum(d["disk_bytes"] for d in done.values())}
    return {**meta, "key": key, "prep": prep}


def _pack_task(index: int, start: int, ipc: bytes, features, data: DataSpec, tokenizer, seq_len: int,
               out: Storage) -> dict:
    """One chunk: its records (Arrow IPC bytes, decoded by the dataset's `features` as iterating it would: Json
    columns, for example) tokenized, packed and written as shard `index`."""
    import pyarrow as pa

    stored = pa.ipc.open_stream(ipc).read_all().to_pylist()
    records = (features.decode_example(r) for r in stored)
    arrays, stats = packing.pack_chunk(records, data, tokenizer, seq_len, start)
    written = shards.write_shard(out, index, arrays)
    return {"stats": stats.__dict__, "disk_bytes": written, "peak_rss_bytes": _peak_rss()}
