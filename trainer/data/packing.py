"""Training data: records -> tokens with a loss mask -> packed rows, written as shards, sharded per rank.

Pipeline: records (trainer.data.sources: hub, files, folders, save_to_disk, s3://, read by
`datasets`) -> token ids and a trained mask (trainer.data.formats: TRL's formats, the chat
template, TRL's masks) -> documents packed into rows of seq_len tokens (best fit within each
chunk of CHUNK_RECORDS records), position ids restarting at 0 for each document, labels
pre-shifted and -100 everywhere except trained tokens -> one shard per chunk
(trainer.data.shards), keyed by data, tokenizer, seq_len and the masking choices. A run on a
cluster has Ray tasks prepare the chunks (trainer.data.distributed); `prepare` here does them
one after the other in this process, into the node's cache. Each rank memory-maps the shards
and reads only the rows of its own share of each step.

The rows of step s are a fixed slice of a seeded per-epoch permutation, so the data
position is just the step number, and the global batch is identical whatever the number
of workers.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from trainer import cache
from trainer.data import shards, sources
from trainer.data.formats import DataError, Example, RecordError, Renderer, format_name, to_example
from trainer.storage import Storage

__all__ = ["DataError", "RecordError", "DataSpec", "PackedData", "prepare", "pack", "load_records", "check_records"]

IGNORE_INDEX = -100
FORMAT_VERSION = 5  # 5: best fit per chunk of CHUNK_RECORDS, shards; 4: no record with only empty assistant turns
CHUNK_RECORDS = 4096  # records packed together (best fit), one shard, one task: enough chunks to spread over CPUs


@dataclass(frozen=True)
class DataSpec:
    """What to read and how to mask it: the data half of a TrainConfig."""

    dataset: str
    split: str = "train"
    config: str | None = None
    text_field: str = "text"
    train_on: str = "completion"
    overlong: str = "truncate"
    one_per_row: str = ""  # why each document gets a row of its own (the model mixes documents that share one)

    @classmethod
    def from_config(cls, cfg, one_per_row: str = "") -> "DataSpec":
        """`one_per_row`: the reason the model's measured behaviour gives (trainer.loop.behaviour), or ""."""
        return cls(cfg.dataset, cfg.dataset_split, cfg.dataset_config, cfg.dataset_text_field, cfg.train_on,
                   cfg.overlong, one_per_row)

    @classmethod
    def eval_from_config(cls, cfg, one_per_row: str = "") -> "DataSpec":
        """The held-out data: --eval-dataset, else --dataset's --eval-split, masked and packed as training is."""
        if cfg.eval_dataset:
            return cls(cfg.eval_dataset, "train", None, cfg.dataset_text_field, cfg.train_on, cfg.overlong,
                       one_per_row)
        return cls(cfg.dataset, cfg.eval_split, cfg.dataset_config, cfg.dataset_text_field, cfg.train_on,
                   cfg.overlong, one_per_row)


# ---------------------------------------------------------------- records

def load_records(spec: str, split: str = "train", *, config: str | None = None, storage_fs: Any = None,
                 limit: int | None = None, cache_dir: str | Path | None = None) -> list[dict]:
    """The split's records as dicts (the first `limit` of a hub dataset, streamed)."""
    source = sources.resolve(spec, config=config, split=split, storage_fs=storage_fs, cache_dir=cache_dir)
    return sources.records(source, limit=limit, cache_dir=cache_dir)


def examples(records: Iterable[dict], spec: str, text_field: str = "text", start: int = 0) -> Iterator[Example]:
    """`start`: the dataset's number of the first record (a chunk's records are named as in the whole dataset)."""
    for i, r in enumerate(records, start):
        yield to_example(r, f"dataset {spec!r} record {i}", text_field)


def check_records(records: Sequence[dict], spec: str, sample: int = 100, *, renderer: Renderer | None = None,
                  text_field: str = "text") -> None:
    """Pre-flight: not empty, and the first records parse (and render, given the tokenizer's renderer)."""
    if not records:
        raise DataError(f"dataset {spec!r}: is empty; it needs at least one record")
    by_format: dict[str, list[int]] = {}
    for i, ex in enumerate(examples(records[:sample], spec, text_field)):
        by_format.setdefault(format_name(ex), []).append(i)
        if renderer is not None:
            renderer.encode(ex)
    if len(by_format) > 1:
        named = "; ".join(f"{name}: records {_numbers(rows)}" for name, rows in by_format.items())
        raise DataError(f"dataset {spec!r}: mixes record formats ({named}); TRL reads a dataset as one format "
                        f"(its loss mask and EOS rules follow the first record), so train one format per dataset: "
                        f"convert the records to one format, or split the file")


def _numbers(rows: list[int], shown: int = 8) -> str:
    return ", ".join(map(str, rows[:shown])) + (f" and {len(rows) - shown} more" if len(rows) > shown else "")


def tokenize(records: Iterable[dict], renderer: Renderer, spec: str, text_field: str = "text",
             batch: int = 256, start: int = 0) -> Iterator[tuple[list[int], list[bool]]]:
    """Each record's (ids, mask), in order, `batch` records per tokenizer call (Renderer.encode_batch); a bad
    record raises its own error once the records before it are out, as record by record."""
    parsed = examples(records, spec, text_field, start)
    while True:
        chunk: list[Example] = []
        failure = None
        try:
            for ex in parsed:
                chunk.append(ex)
                if len(chunk) == batch:
                    break
        except Exception as e:  # noqa: BLE001 - the record that does not parse: after the ones before it
            failure = e
        try:
            done = renderer.encode_batch(chunk)
        except Exception:  # noqa: BLE001 - record by record, so the records before the bad one come out first
            done = None
        if done is None:
            for ex in chunk:
                yield renderer.encode(ex)
        else:
            yield from done
        if failure is not None:
            raise failure
        if len(chunk) < batch:
            return


# ---------------------------------------------------------------- packing

DROP_EMPTY = "nothing to train on (no assistant or completion tokens)"
DROP_TRUNCATED = "truncated to --seq-len before its first trained token"
DROP_SHORT = "shorter than 2 tokens"
DROP_TOO_LONG = "longer than --seq-len (--overlong drop)"


@dataclass
class PackStats:
    documents: int
    rows: int
    truncated: int
    dropped: int
    real_tokens: int
    loss_tokens: int
    seq_len: int = 0
    tokens: int = 0          # before truncation, kept or not
    trained_tokens: int = 0  # before truncation and shifting, kept or not
    drop_reasons: dict[str, int] = field(default_factory=dict)
    too_long: int = 0        # records longer than seq_len (truncated, or dropped)
    longest_tokens: int = 0
    longest_record: int = -1
    packed_rows: int = 0     # rows best-fit packing would give (the cost of one document per row)
    one_per_row: str = ""    # why each document has a row of its own, or ""

    @property
    def fill(self) -> float:
        """Share of the packed rows' tokens that are real (not padding)."""
        return self.real_tokens / (self.rows * self.seq_len) if self.rows and self.seq_len else 0.0


def _document(ids: Sequence[int], mask: Sequence[bool], seq_len: int,
              overlong: str = "truncate") -> tuple[np.ndarray, np.ndarray, bool] | str:
    """Token ids and pre-shifted labels of one document, truncated to seq_len; or why it is dropped."""
    ids = np.asarray(ids, np.int32)
    mask = np.asarray(mask, bool)
    truncated = len(ids) > seq_len
    if truncated and overlong == "drop":
        return DROP_TOO_LONG
    if truncated:
        ids, mask = ids[:seq_len], mask[:seq_len]
    labels = np.full(len(ids), IGNORE_INDEX, np.int32)
    labels[:-1] = np.where(mask[1:], ids[1:], IGNORE_INDEX)
    if len(ids) < 2:
        return DROP_SHORT
    if not (labels != IGNORE_INDEX).any():
        return DROP_TRUNCATED if truncated else DROP_EMPTY
    return ids, labels, truncated


def best_fit_rows(lengths: Sequence[int], seq_len: int) -> list[list[int]]:
    """Document indices per row: best-fit decreasing bin packing.

    Longest documents first, each into the open row it fills most tightly. On instruction
    data (many short documents, a long tail) rows end up ~99% full, against ~83% for
    next-fit in dataset order: every point of fill is throughput. Rows keep their
    documents in dataset order and are ordered by their first document, so the result
    is deterministic; the training order is a seeded permutation of rows anyway.
    """
    rows: list[list[int]] = []
    # open_rows[c] holds the rows with exactly c tokens free; has_free[c] counts them.
    open_rows: list[list[int]] = [[] for _ in range(seq_len + 1)]
    has_free = np.zeros(seq_len + 1, np.int64)
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        n = int(lengths[i])
        fits = np.flatnonzero(has_free[n:])
        if len(fits):
            cap = n + int(fits[0])
            row = open_rows[cap].pop()
            has_free[cap] -= 1
        else:
            row, cap = len(rows), seq_len
            rows.append([])
        rows[row].append(i)
        left = cap - n
        if left > 0:
            open_rows[left].append(row)
            has_free[left] += 1
    for r in rows:
        r.sort()
    return sorted(rows, key=lambda r: r[0])


def pack(docs: Iterable[tuple[Sequence[int], Sequence[bool]]], seq_len: int, pad_id: int,
         overlong: str = "truncate", one_per_row: str = "", start: int = 0) -> tuple[dict[str, np.ndarray], PackStats]:
    """Documents packed into rows of seq_len (best fit); labels shifted and masked to trained tokens.

    Each document keeps its own position ids (0, 1, ...), which is what keeps attention
    inside it; the tail of a row is padding (position ids continue 0.., labels -100).
    Documents longer than seq_len are truncated, or dropped with `overlong="drop"`; both are counted.
    With `one_per_row` (the reason: a model whose documents would see each other in a shared row)
    every document has a row of its own, in dataset order. `start`: the first document's record number.
    """
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    truncated = tokens = trained = too_long = 0
    longest, longest_at = 0, -1
    reasons: Counter = Counter()
    for i, (ids, mask) in enumerate(docs, start):
        tokens += len(ids)
        trained += int(sum(mask))
        too_long += len(ids) > seq_len
        if len(ids) > longest:
            longest, longest_at = len(ids), i
        doc = _document(ids, mask, seq_len, overlong)
        if isinstance(doc, str):
            reasons[doc] += 1
            continue
        kept.append(doc[:2])
        truncated += doc[2]
    layout = best_fit_rows([len(ids) for ids, _ in kept], seq_len)
    packed_rows = len(layout)
    if one_per_row:
        layout = [[i] for i in range(len(kept))]
    shape = (len(layout), seq_len)
    arrays = {"input_ids": np.full(shape, pad_id, np.int32), "labels": np.full(shape, IGNORE_INDEX, np.int32),
              "position_ids": np.zeros(shape, np.int32), "real_tokens": np.zeros(len(layout), np.int32)}
    for r, members in enumerate(layout):
        at = 0
        for i in members:
            ids, labels = kept[i]
            arrays["input_ids"][r, at:at + len(ids)] = ids
            arrays["labels"][r, at:at + len(ids)] = labels
            arrays["position_ids"][r, at:at + len(ids)] = np.arange(len(ids))
            at += len(ids)
        arrays["position_ids"][r, at:] = np.arange(seq_len - at)
        arrays["real_tokens"][r] = at
    stats = PackStats(documents=len(kept), rows=len(layout), truncated=truncated, dropped=sum(reasons.values()),
                      real_tokens=int(arrays["real_tokens"].sum()),
                      loss_tokens=int((arrays["labels"] != IGNORE_INDEX).sum()), seq_len=seq_len, tokens=tokens,
                      trained_tokens=trained, drop_reasons=dict(reasons), too_long=too_long,
                      longest_tokens=longest, longest_record=longest_at, packed_rows=packed_rows,
                      one_per_row=one_per_row)
    return arrays, stats


# ---------------------------------------------------------------- cache and sharding

def tokenizer_fingerprint(tokenizer) -> str:
    h = hashlib.sha256()
    h.update(tokenizer.backend_tokenizer.to_str().encode() if hasattr(tokenizer, "backend_tokenizer")
             else repr(tokenizer.get_vocab()).encode())
    h.update(str(getattr(tokenizer, "chat_template", "")).encode())
    return h.hexdigest()[:16]


def open_source(data: DataSpec, storage_fs: Any, cache_dir: str | Path):
    """The source and its Dataset; a hub dataset's own fingerprint (its revision) keys the cache."""
    source = sources.resolve(data.dataset, config=data.config, split=data.split, storage_fs=storage_fs,
                             cache_dir=cache_dir)
    ds = sources.open_dataset(source, cache_dir=cache_dir)
    fp = sources.fingerprint(source, cache_dir)
    if source.kind == "hub":
        fp["datasets_fingerprint"] = getattr(ds, "_fingerprint", None)
    return source, ds, fp


def _digest(value: Any, n: int) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:n]


def cache_key(data: DataSpec, source_fp: dict, tokenizer, seq_len: int) -> str:
    """`<data>-<packing>`: the data's content (a local file's path is not part of it: the same data in
    another folder, as each demo run writes it, shares its packed rows), then what packs it."""
    content = {k: v for k, v in source_fp.items() if not (k == "spec" and "files" in source_fp)}
    fp = {"v": FORMAT_VERSION, "tokenizer": tokenizer_fingerprint(tokenizer), "seq_len": seq_len,
          "text_field": data.text_field, "train_on": data.train_on, "overlong": data.overlong,
          **({"one_per_row": True} if data.one_per_row else {})}
    training = _training_template(tokenizer, data.train_on)
    if training:  # TRL's training version of the template renders the conversations (present once TRL is)
        fp["training_template"] = _digest(training, 12)
    return f"{_digest(content, 12)}-{_digest(fp, 12)}"


def _training_template(tokenizer, train_on: str) -> str | None:
    try:
        return Renderer(tokenizer, train_on).training_template() if getattr(tokenizer, "chat_template", None) else None
    except Exception:  # noqa: BLE001 - a tokenizer that cannot be asked renders with its own template
        return None


def _prune_stale(folder: Path, spec_key: str) -> None:
    """Packed rows of this same dataset location whose data has changed since: never read again."""
    data_key = folder.name.split("-", 1)[0]
    for other in folder.parent.glob("*"):
        meta = other / "meta.json"
        if other == folder or not meta.is_file() or other.name.split("-", 1)[0] == data_key:
            continue
        try:
            same_spec = json.loads(meta.read_text()).get("spec_key") == spec_key
        except (OSError, ValueError):
            continue
        if same_spec:
            shutil.rmtree(other, ignore_errors=True)


def chunk_starts(records: int, chunk_records: int = CHUNK_RECORDS) -> range:
    """The first record of each chunk: fixed by the record count alone, so any number of workers packs the same
    rows."""
    return range(0, records, chunk_records)


def chunk_of(ds, start: int, chunk_records: int = CHUNK_RECORDS):
    """The records of the chunk starting at `start` (a Dataset's selection, or a list's slice)."""
    end = min(start + chunk_records, len(ds))
    return ds.select(range(start, end)) if hasattr(ds, "select") else ds[start:end]


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def pack_chunk(records: Iterable[dict], data: DataSpec, tokenizer, seq_len: int,
               start: int = 0) -> tuple[dict[str, np.ndarray], PackStats]:
    """One chunk's records tokenized (TRL's masks) and packed (best fit within the chunk); `start`: the number of
    its first record in the dataset, for the messages and the longest record."""
    docs = tokenize(records, Renderer(tokenizer, data.train_on), data.dataset, data.text_field, start=start)
    return pack(docs, seq_len, pad_id(tokenizer), data.overlong, data.one_per_row, start=start)


def merged_stats(parts: Sequence[PackStats], seq_len: int, one_per_row: str = "") -> PackStats:
    """The chunks' statistics as one dataset's (sums; the longest record over all)."""
    total = PackStats(documents=0, rows=0, truncated=0, dropped=0, real_tokens=0, loss_tokens=0, seq_len=seq_len,
                      one_per_row=one_per_row)
    reasons: Counter = Counter()
    for part in parts:
        for name in ("documents", "rows", "truncated", "dropped", "real_tokens", "loss_tokens", "tokens",
                     "trained_tokens", "too_long", "packed_rows"):
            setattr(total, name, getattr(total, name) + getattr(part, name))
        reasons.update(part.drop_reasons)
        if part.longest_tokens > total.longest_tokens:
            total.longest_tokens, total.longest_record = part.longest_tokens, part.longest_record
    total.drop_reasons = dict(reasons)
    return total


def check_packed(stats: PackStats, data: DataSpec, records: int) -> None:
    """DataError for a dataset that packs into no row at all (every record dropped), naming why."""
    if records == 0:
        raise DataError(f"dataset {data.dataset!r}: is empty (split {data.split!r}); it needs at least one record")
    if stats.rows:
        return
    seq_len = stats.seq_len
    why = "; ".join(f"{n} {reason}" for reason, n in stats.drop_reasons.items())
    too_long = stats.drop_reasons.get(DROP_TRUNCATED, 0) + stats.drop_reasons.get(DROP_TOO_LONG, 0)
    if too_long and too_long == stats.dropped:
        raise DataError(f"dataset {data.dataset!r}: every record is dropped for --seq-len {seq_len} (records: "
                        f"{records}; {why}); the longest is record {stats.longest_record} with "
                        f"{stats.longest_tokens} tokens: raise --seq-len (to {stats.longest_tokens} to keep it "
                        f"whole){'' if data.overlong == 'truncate' else ', or --overlong truncate'}")
    raise DataError(f"dataset {data.dataset!r}: no record has a trained token left after tokenization "
                    f"(records: {records}; dropped: {why})")


def pack_dataset(ds, data: DataSpec, tokenizer, seq_len: int, *, on_shard=None,
                 chunk_records: int = CHUNK_RECORDS) -> PackStats:
    """Every record tokenized and packed, chunk by chunk in this process (memory: one chunk's); `on_shard(index,
    arrays)` takes each chunk's rows. An empty dataset or one with nothing to train fails (DataError)."""
    parts = []
    for index, start in enumerate(chunk_starts(len(ds), chunk_records)):
        arrays, stats = pack_chunk(chunk_of(ds, start, chunk_records), data, tokenizer, seq_len, start)
        if on_shard is not None:
            on_shard(index, arrays)
        parts.append(stats)
    stats = merged_stats(parts, seq_len, data.one_per_row)
    check_packed(stats, data, len(ds))
    return stats


def packed_meta(data: DataSpec, stats: PackStats, records: int, source_fp: dict, shard_rows: list[int],
                chunk_records: int) -> dict:
    """meta.json of a preparation: what was read, what packing did, the rows of each shard."""
    return {"source": data.dataset, "split": data.split, "config": data.config, "train_on": data.train_on,
            "overlong": data.overlong, "records": records, "fill": round(stats.fill, 4), **stats.__dict__,
            "source_fingerprint": source_fp, "spec_key": spec_key(data), "chunk_records": chunk_records,
            "shards": shard_rows}


def summary(stats: dict, overlong: str = "truncate") -> list[str]:
    """What packing left out or cut, and the options, for the job log, events.jsonl and `trainer data`."""
    lines = []
    seq_len = stats["seq_len"]
    if stats.get("too_long"):
        done = "truncated" if overlong == "truncate" else "dropped"
        other = "--overlong drop to leave them out" if overlong == "truncate" else "--overlong truncate to keep " \
            "their start"
        lines.append(f"{stats['too_long']:,} of {stats['records']:,} records are longer than --seq-len {seq_len} "
                     f"and were {done} (the longest: record {stats['longest_record']}, {stats['longest_tokens']:,} "
                     f"tokens); {other}, or raise --seq-len (to {stats['longest_tokens']} to keep every record whole)")
    for reason, n in (stats.get("drop_reasons") or {}).items():
        if reason != DROP_TOO_LONG:
            lines.append(f"{n:,} of {stats['records']:,} records dropped: {reason}")
    if stats.get("one_per_row"):
        lines.append(one_per_row_note(stats))
    return lines


def one_per_row_note(stats: dict) -> str:
    """What training one document per row costs: real tokens per row against best-fit packing."""
    rows, packed, real = stats["rows"], stats.get("packed_rows") or stats["rows"], stats["real_tokens"]
    return (f"documents are trained one per row, not packed: {stats['one_per_row']}. {rows:,} rows of "
            f"{real / max(rows, 1):,.0f} real tokens on average, against {packed:,} rows of {real / max(packed, 1):,.0f} "
            f"packed ({rows / max(packed, 1):.2f}x the rows per epoch)")


def build_packed(data: DataSpec, ds, source_fp: dict, tokenizer, seq_len: int, folder: Path,
                 chunk_records: int = CHUNK_RECORDS) -> dict:
    """The shards in this process, into a `.tmp` sibling renamed into place once meta.json is written."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    out = Storage.from_uri(str(tmp))
    shard_rows: list[int] = []

    def keep(index: int, arrays: dict) -> None:
        shards.write_shard(out, index, arrays)
        shard_rows.append(int(arrays["input_ids"].shape[0]))

    stats = pack_dataset(ds, data, tokenizer, seq_len, on_shard=keep, chunk_records=chunk_records)
    meta = packed_meta(data, stats, len(ds), source_fp, shard_rows, chunk_records)
    shards.write_meta(out, meta)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return meta


class PackedData:
    """Packed rows on disk (memory-mapped shards) and the rows each rank reads at each step."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.meta = json.loads((self.folder / shards.META).read_text())
        self.rows = shards.Rows(self.folder, self.meta["shards"])
        self._perm: tuple[tuple[int, int], np.ndarray] | None = None

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """Every column whole: for inspection; the loop reads its rows with `take`."""
        return {name: self.rows.column(name) for name in shards.COLUMNS}

    @property
    def num_rows(self) -> int:
        return self.rows.num_rows

    @property
    def fingerprint(self) -> str:
        return self.folder.name

    def steps_per_epoch(self, global_batch: int) -> int:
        return self.num_rows // global_batch

    def position(self, step: int, global_batch: int) -> dict:
        epoch, index = divmod(step, max(1, self.steps_per_epoch(global_batch)))
        return {"step": step, "epoch": epoch, "step_in_epoch": index, "rows_consumed": step * global_batch}

    def step_rows(self, step: int, global_batch: int, seed: int) -> np.ndarray:
        """Row indices of the global batch of a step: a slice of the epoch's seeded permutation."""
        spe = self.steps_per_epoch(global_batch)
        if spe < 1:
            raise DataError(too_few_rows(self.num_rows, self.meta["seq_len"], global_batch))
        epoch, index = divmod(step, spe)
        if self._perm is None or self._perm[0] != (seed, epoch):
            self._perm = ((seed, epoch), np.random.default_rng([seed, epoch]).permutation(self.num_rows))
        return self._perm[1][index * global_batch:(index + 1) * global_batch]

    def tokens_through(self, steps: int, global_batch: int, seed: int) -> int:
        """Real (non-padding) tokens of every row the first `steps` steps train on."""
        real = self.rows.real_tokens
        return int(sum(int(real[self.step_rows(s, global_batch, seed)].sum()) for s in range(steps)))

    def batch(self, rows: np.ndarray) -> dict:
        """The rows as torch tensors (token columns as int64, real_tokens as int32)."""
        import torch

        return {name: torch.from_numpy(self.rows.take(name, rows).astype(np.int32 if name == "real_tokens"
                                                                          else np.int64))
                for name in shards.COLUMNS}

    def eval_batches(self, *, rank: int, world_size: int, batch: int) -> list[dict]:
        """This rank's share of every row, in batches; every rank gets the same number of batches (FSDP's
        collectives need it): a rank short of rows gets row 0 with no trained token."""
        per_rank = -(-self.num_rows // world_size)
        mine = np.arange(rank * per_rank, min((rank + 1) * per_rank, self.num_rows))
        out = []
        for i in range(0, per_rank, batch):
            idx = mine[i:i + batch]
            mb = self.batch(idx if len(idx) else np.zeros(1, dtype=np.int64))
            if not len(idx):
                mb["labels"].fill_(IGNORE_INDEX)
            out.append(mb)
        return out

    def micro_batches(self, step: int, *, rank: int, world_size: int, global_batch: int,
                      micro_batch: int, seed: int) -> list[dict]:
        """This rank's micro-batches of a step (contiguous share of the global batch)."""
        rows = self.step_rows(step, global_batch, seed)
        per_rank = global_batch // world_size
        mine = rows[rank * per_rank:(rank + 1) * per_rank]
        return [self.batch(np.sort(mine[i:i + micro_batch]))  # sorted reads from the memory maps
                for i in range(0, per_rank, micro_batch)]


def too_few_rows(rows: int, seq_len: int, global_batch: int) -> str:
    return (f"dataset has {rows} packed rows of {seq_len} tokens, fewer than one global batch of {global_batch}; "
            f"lower --global-batch-size or --seq-len, or add data")


def prepare(data: DataSpec | str, split: str | None = None, tokenizer=None, seq_len: int = 0,
            cache_dir: str | Path = "", storage_fs: Any = None) -> PackedData:
    """Tokenize and pack in this process, once per node (file lock), then memory-map the cached shards.

    `data` is a DataSpec, or (the short form) a dataset location with its split. A run on a Ray
    cluster prepares on the cluster's CPUs instead (trainer.data.distributed).
    """
    if isinstance(data, str):
        data = DataSpec(data, split or "train")
    key = spec_key(data)
    with cache.lock(cache_dir, f"data-{key}"):  # one reader per node fetches and tokenizes
        source, ds, fp = open_source(data, storage_fs, cache_dir)
        folder = Path(cache_dir) / "data" / cache_key(data, fp, tokenizer, seq_len)
        if not (folder / shards.META).is_file():
            try:
                build_packed(data, ds, fp, tokenizer, seq_len, folder)
            except UnicodeDecodeError as e:  # pyarrow reads JSON bytes as they are; decoding happens here
                raise sources.undecodable(source, e) from None
            _prune_stale(folder, key)
    return PackedData(folder)


def spec_key(data: DataSpec) -> str:
    return _digest(data.__dict__, 16)
