"""The prepared data sized before it is prepared: tokens, packed rows, bytes on each node's disk, and the time.

From the record count (or its estimate, trainer.data.sources.Size), the tokens per record of the
sample (rendered and tokenized with the run's tokenizer, as the preparation will) and --seq-len.
The packed rows are trainer.data.packing's arrays: input_ids, labels and position_ids, int32 per
token slot (12 bytes a slot, padding included), and real_tokens, int32 per row; rows are
as full as best-fit packing fills them with the sample's lengths, or one document each (`one_per_row`). Every node keeps the
whole prepared set (its ranks read rows from all of it over an epoch), so the set must fit the
node's root volume less what the system, the image and the model's weights take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from trainer.data.formats import Renderer, to_example
from trainer.data.packing import CHUNK_RECORDS

GIB = 1024 ** 3
# Tokenize + render + pack, per token, on one core: the single-process path with Qwen2's real tokenizer on
# synthetic chat records of ~860 tokens, measured before the batch encode and the one-render prefixes (which saved
# 10-20%): an upper bound. The cluster's pass divides it by its CPUs; `python -m trainer.bench data` measures
# ~1 us with the demo's byte-level tokenizer (Qwen2's was not at hand to measure again).
PREP_SECONDS_PER_TOKEN_PER_CORE = 7.5e-6
FILL_DOCUMENTS = 2000  # documents packed to measure the fill (best fit's rows fill ~99% on instruction data)
SLOT_BYTES = 3 * 4  # input_ids, labels, position_ids: int32 per token slot
ROW_BYTES = 4       # real_tokens: int32 per row
ARRAYS = 4
NPY_HEADER_BYTES = 128
META_BYTES = 4096  # meta.json: counts and the source fingerprint (about 100 bytes a file)
# What a GPU node's root volume holds besides the data: the EKS accelerated AMI (OS, NVIDIA driver, CUDA, container
# runtime) and the Ray/PyTorch DLC image, compressed layers and unpacked snapshot both (about 10 GiB and 25-30 GiB:
# published sizes, not measured here), rounded up.
SYSTEM_AND_IMAGE_GIB = 60
DISK_MARGIN = 0.10  # of the volume, left free: logs, Ray's spill and temp files, checkpoints staged on the way out


@dataclass(frozen=True)
class Estimate:
    """What preparing the dataset gives and takes, from its record count and a sample."""

    records: int
    exact: bool            # the record count from metadata, not an estimate from bytes
    sampled: int
    tokens_per_record: float
    tokens: int            # rendered, before truncation: what tokenization costs
    kept_tokens: int       # in the packed rows
    rows: int
    seq_len: int
    one_per_row: bool
    fill: float            # real tokens per token slot
    disk_bytes: int
    cpus: int
    seconds: float


def sample_lengths(records: Iterable[dict], tokenizer, spec: str, *, train_on: str = "completion",
                   text_field: str = "text") -> list[int]:
    """Token counts of the sample's records, rendered and tokenized as the preparation will."""
    renderer = Renderer(tokenizer, train_on)
    return [len(renderer.encode(to_example(r, f"dataset {spec!r} record {i}", text_field))[0])
            for i, r in enumerate(records)]


def packed_fill(kept: Sequence[int], seq_len: int) -> float:
    """The share of real tokens in rows best-fit packed from documents of the sample's lengths (repeated to
    FILL_DOCUMENTS, as the whole dataset's many documents fill rows better than a sample's few)."""
    from trainer.data.packing import best_fit_rows

    tiled = list(kept) * max(1, math.ceil(FILL_DOCUMENTS / len(kept)))
    return sum(tiled) / (len(best_fit_rows(tiled, seq_len)) * seq_len)


def packed_bytes(rows: int, seq_len: int, shards: int = 1) -> int:
    """The shards' files on disk (each shard's .npy files, trainer.data.shards, and one meta.json)."""
    return rows * (seq_len * SLOT_BYTES + ROW_BYTES) + shards * ARRAYS * NPY_HEADER_BYTES + META_BYTES


def estimate(lengths: Sequence[int], records: int, seq_len: int, *, cpus: int, exact: bool = True,
             overlong: str = "truncate", one_per_row: bool = False) -> Estimate:
    """Tokens, rows, disk bytes and seconds of preparing `records` records like the sample's `lengths`.

    Packing: rows are the kept tokens at the fill best-fit packing gives the sample's lengths (packed_fill).
    One per row: a row per kept document. Time: every rendered token at PREP_SECONDS_PER_TOKEN_PER_CORE,
    spread over `cpus`.
    """
    if not lengths:
        raise ValueError("no sampled record to size the dataset from")
    kept = [min(n, seq_len) for n in lengths if n >= 2 and not (overlong == "drop" and n > seq_len)]
    per_record = sum(lengths) / len(lengths)
    documents = records * len(kept) / len(lengths)
    kept_tokens = documents * (sum(kept) / len(kept)) if kept else 0.0
    if one_per_row:
        rows = documents
    else:
        rows = kept_tokens / (seq_len * packed_fill(kept, seq_len)) if kept else 0.0
    rows_n = math.ceil(rows) if kept else 0
    tokens = round(records * per_record)
    return Estimate(records=records, exact=exact, sampled=len(lengths), tokens_per_record=round(per_record, 1),
                    tokens=tokens, kept_tokens=round(kept_tokens), rows=rows_n, seq_len=seq_len,
                    one_per_row=one_per_row, fill=round(kept_tokens / max(rows_n * seq_len, 1), 4),
                    disk_bytes=packed_bytes(rows_n, seq_len, math.ceil(records / CHUNK_RECORDS)), cpus=max(1, cpus),
                    seconds=tokens * PREP_SECONDS_PER_TOKEN_PER_CORE / max(1, cpus))


@dataclass(frozen=True)
class DiskRoom:
    """What one node's disk leaves for the prepared data, how that was worked out, and the setting that sizes it."""

    free_bytes: int
    explained: str
    where: str
    volume_gib: float
    overhead_bytes: int  # the system, the image and the model's weights

    def volume_for(self, data_bytes: int) -> int:
        """The root volume, GiB, that would hold `data_bytes` of prepared data with the rest and the margin."""
        return math.ceil((data_bytes + self.overhead_bytes) / (1 - DISK_MARGIN) / GIB)


def node_room(volume_gib: float, model_bytes: int, where: str, *, assumed: bool = False) -> DiskRoom:
    """A GPU node's root volume less the system and image, the model's weights (cached on the node) and the
    margin; `assumed`: the volume is the default, the pool's own is not known here."""
    left = volume_gib * GIB * (1 - DISK_MARGIN) - SYSTEM_AND_IMAGE_GIB * GIB - model_bytes
    volume = f"{volume_gib:g} GiB root volume" + (" (the default assumed: the pool's is not known here)"
                                                  if assumed else "")
    return DiskRoom(max(0, int(left)), f"the {volume} less {SYSTEM_AND_IMAGE_GIB} GiB for the "
                                       f"system and the image, {size(model_bytes)} for the model's weights and a "
                                       f"{DISK_MARGIN:.0%} margin", where, volume_gib,
                    SYSTEM_AND_IMAGE_GIB * GIB + model_bytes)


def size(n: float) -> str:
    return f"{n / GIB:,.1f} GiB" if n >= GIB else f"{n / 1024 ** 2:,.1f} MiB"


def describe(est: Estimate) -> str:
    """One line: the prepared data's size and time (the plan's, and the pre-flight's note)."""
    count = f"{est.records:,}" if est.exact else f"about {est.records:,}"
    layout = "one document per row" if est.one_per_row else f"packed {est.fill:.1%} full"
    return (f"{count} records x {est.tokens_per_record:,.0f} tokens (sample of {est.sampled}) = {est.tokens:,} "
            f"tokens; {est.rows:,} rows of --seq-len {est.seq_len} ({layout}): {size(est.disk_bytes)} on each node's "
            f"disk; preparation about {duration(est.seconds)} on {est.cpus} CPUs "
            f"({PREP_SECONDS_PER_TOKEN_PER_CORE * 1e6:g} us per token per core)")


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def refusal(est: Estimate, room: DiskRoom, dataset: str) -> str | None:
    """Why the prepared data cannot fit a node's disk, with the numbers and the fixes; None when it fits."""
    if est.disk_bytes <= room.free_bytes:
        return None
    headers = packed_bytes(0, est.seq_len, math.ceil(est.records / CHUNK_RECORDS))  # at most as many shards as now
    rows_fit = max(0, room.free_bytes - headers) // (est.seq_len * SLOT_BYTES + ROW_BYTES)
    fits = int(rows_fit * est.records / max(est.rows, 1))
    fewer = (f"train on fewer records (about {fits:,} fit: a --dataset-split slice such as train[:{fits}])" if fits
             else "train on fewer records")
    seq = ", or a shorter --seq-len (each document pads its own row to it)" if est.one_per_row else ""
    count = f"{est.records:,}" if est.exact else f"about {est.records:,}"
    return (f"dataset {dataset!r}: its prepared rows need about {size(est.disk_bytes)} on each node's disk ({count} "
            f"records, {est.tokens_per_record:,.0f} tokens each in a sample of {est.sampled}: {est.rows:,} rows of "
            f"--seq-len {est.seq_len} at {SLOT_BYTES} bytes a token slot), above the {size(room.free_bytes)} a node "
            f"has for them ({room.explained}); give the nodes a root volume of {room.volume_for(est.disk_bytes)} GiB "
            f"or more ({room.where}), or {fewer}{seq}")
