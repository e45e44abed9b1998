"""Data: formats, response-only labels, packing layout, per-rank shards, tokenization cache."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from tests.guards import nonempty
from trainer import demo
from trainer.data.formats import to_example
from trainer.data.packing import IGNORE_INDEX, DataError, PackedData, best_fit_rows, check_records, load_records, pack, prepare

from .test_packing import tokenize_messages


@pytest.fixture(scope="module")
def tokenizer():
    return demo.build_tokenizer()


@pytest.mark.parametrize("record", [
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
    {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
    {"prompt": "hi", "response": "yo"},
    {"instruction": "hi", "output": "yo"},
])
def test_chat_layouts_become_messages(record):
    msgs = to_example(record, "r").messages
    assert msgs[0] == {"role": "user", "content": "hi"} and msgs[-1] == {"role": "assistant", "content": "yo"}


def test_record_without_needed_fields_names_what_it_has():
    with pytest.raises(DataError) as e:
        to_example({"question": "q", "answer": "a"}, "dataset 'x.jsonl' record 4")
    msg = str(e.value)
    assert "record 4" in msg and "question" in msg and "answer" in msg and "messages" in msg


def test_loss_mask_covers_exactly_the_responses(tokenizer):
    msgs = [{"role": "user", "content": "reverse: abc"}, {"role": "assistant", "content": "cba"},
            {"role": "user", "content": "upper: xy"}, {"role": "assistant", "content": "XY"}]
    ids, mask = tokenize_messages(tokenizer, msgs)
    assert ids == tokenizer(tokenizer.apply_chat_template(msgs, tokenize=False), add_special_tokens=False)["input_ids"]
    learned = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert learned == "cba<|im_end|>\nXY<|im_end|>\n"


def test_pack_resets_positions_shifts_labels_and_pads(tokenizer):
    docs = [([10, 11, 12, 13], [False, False, True, True]), ([20, 21, 22], [False, True, True]),
            ([30, 31, 32, 33, 34, 35], [False, False, False, True, True, True])]
    arrays, stats = pack(docs, seq_len=8, pad_id=0)
    assert stats.rows == 2 and stats.documents == 3
    assert arrays["input_ids"][0].tolist() == [10, 11, 12, 13, 20, 21, 22, 0]
    assert arrays["position_ids"][0].tolist() == [0, 1, 2, 3, 0, 1, 2, 0]
    # labels[t] is the target of token t, only where the target is a response token of the same document
    assert arrays["labels"][0].tolist() == [-100, 12, 13, -100, 21, 22, -100, -100]
    assert arrays["real_tokens"].tolist() == [7, 6]
    assert stats.loss_tokens == int((arrays["labels"] != IGNORE_INDEX).sum()) == 2 + 2 + 3


def test_documents_longer_than_seq_len_are_truncated_and_empty_ones_dropped():
    arrays, stats = pack([(list(range(1, 20)), [False] * 5 + [True] * 14), ([1, 2], [False, False])], 8, 0)
    assert stats.truncated == 1 and stats.dropped == 1 and stats.rows == 1
    assert arrays["input_ids"].shape == (1, 8)


def test_best_fit_places_every_document_once_and_fills_rows_far_better_than_next_fit():
    rng = np.random.default_rng(0)
    lengths = np.minimum(512, 4 + rng.lognormal(np.log(80), 0.9, 3000).astype(int)).tolist()
    rows = nonempty(best_fit_rows(lengths, 512), "packed rows")
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= 512 for r in rows)
    assert all(r == sorted(r) for r in rows) and [r[0] for r in rows] == sorted(r[0] for r in rows)
    next_fit, used = 1, 0
    for n in lengths:
        next_fit, used = (next_fit + 1, n) if used + n > 512 else (next_fit, used + n)
    fill = sum(lengths) / (len(rows) * 512)
    assert fill > 0.97 and len(rows) < 0.9 * next_fit, (fill, len(rows), next_fit)


def test_packed_rows_hold_each_document_intact_with_its_own_positions():
    rng = np.random.default_rng(1)
    docs = [(rng.integers(5, 99, n).tolist(), [False] * (n // 2) + [True] * (n - n // 2))
            for n in rng.integers(2, 40, 60)]
    arrays, stats = pack(docs, seq_len=48, pad_id=0)
    found = []
    for ids, pos, real in zip(nonempty(arrays["input_ids"], "packed rows"), arrays["position_ids"], arrays["real_tokens"],
                              strict=True):
        starts = [t for t in range(real) if pos[t] == 0] + [real]
        found += [ids[a:b].tolist() for a, b in pairwise(starts)]
        assert (ids[real:] == 0).all()
    assert sorted(found) == sorted(d[0] for d in docs) and stats.documents == len(docs)
    assert stats.real_tokens == sum(len(d[0]) for d in docs)


def _packed(tmp_path, tokenizer, n=300, seq_len=64):
    rows, _ = demo.make_dataset(seed=1, n_train=n, n_eval=1)
    path = demo.write_jsonl(rows, tmp_path / "train.jsonl")
    return prepare(str(path), "train", tokenizer, seq_len, tmp_path / "cache"), path


def test_every_rank_reads_its_own_share_and_the_global_batch_ignores_world_size(tmp_path, tokenizer):
    data, _ = _packed(tmp_path, tokenizer)
    gb = 8
    for step in (0, 1, data.steps_per_epoch(gb) + 2):  # also a step of the second epoch
        reference = data.micro_batches(step, rank=0, world_size=1, global_batch=gb, micro_batch=2, seed=5)
        ref_rows = sorted(map(tuple, np.concatenate([b["input_ids"].numpy() for b in reference]).tolist()))
        for world in (2, 4):
            shards = nonempty([data.micro_batches(step, rank=r, world_size=world, global_batch=gb, micro_batch=2, seed=5)
                               for r in range(world)], "ranks' shards")
            rows = [tuple(x) for shard in shards for b in shard for x in b["input_ids"].tolist()]
            assert sorted(rows) == ref_rows
            assert all(sum(b["input_ids"].shape[0] for b in shard) == gb // world for shard in shards)


def test_epochs_reshuffle_and_the_order_depends_on_the_seed(tmp_path, tokenizer):
    data, _ = _packed(tmp_path, tokenizer)
    spe = data.steps_per_epoch(4)
    epoch0 = np.concatenate([data.step_rows(s, 4, seed=0) for s in range(spe)])
    epoch1 = np.concatenate([data.step_rows(spe + s, 4, seed=0) for s in range(spe)])
    for epoch in (epoch0, epoch1):  # each epoch: distinct rows, a full permutation minus the remainder
        assert len(set(epoch)) == len(epoch) == spe * 4 and data.num_rows - len(epoch) < 4
    assert not np.array_equal(epoch0, epoch1)
    assert not np.array_equal(data.step_rows(0, 4, seed=0), data.step_rows(0, 4, seed=1))
    assert data.position(spe + 1, 4) == {"step": spe + 1, "epoch": 1, "step_in_epoch": 1, "rows_consumed": 4 * (spe + 1)}


def test_tokenization_is_cached_per_data_tokenizer_and_seq_len(tmp_path, tokenizer):
    data, path = _packed(tmp_path, tokenizer)
    stamp = (data.folder / "shard-00000" / "input_ids.npy").stat().st_mtime_ns
    again = prepare(str(path), "train", tokenizer, 64, tmp_path / "cache")
    assert again.folder == data.folder and (again.folder / "shard-00000" / "input_ids.npy").stat().st_mtime_ns == stamp
    other = prepare(str(path), "train", tokenizer, 128, tmp_path / "cache")
    assert other.folder != data.folder and other.meta["seq_len"] == 128
    assert isinstance(PackedData(data.folder).arrays["input_ids"], np.memmap)


def test_the_same_data_written_again_or_elsewhere_reuses_its_rows_and_changed_data_replaces_them(tmp_path, tokenizer):
    """What `trainer local` does on every run: the demo writes its data file again (a new mtime), in a new folder."""
    import os

    data, path = _packed(tmp_path, tokenizer)
    os.utime(path, ns=(1, 1))  # written again: same bytes, another modification time
    assert prepare(str(path), "train", tokenizer, 64, tmp_path / "cache").folder == data.folder
    elsewhere = tmp_path / "run2" / "train.jsonl"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(path.read_bytes())
    assert prepare(str(elsewhere), "train", tokenizer, 64, tmp_path / "cache").folder == data.folder
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))  # one record less
    changed = prepare(str(path), "train", tokenizer, 64, tmp_path / "cache")
    assert changed.folder != data.folder
    # the rows of the data this location held before are never read again: they go
    assert [p.name for p in (tmp_path / "cache" / "data").iterdir()] == [changed.folder.name]
    other_len = prepare(str(path), "train", tokenizer, 128, tmp_path / "cache")  # another seq_len: its own entry
    assert sorted(p.name for p in (tmp_path / "cache" / "data").iterdir()) == sorted([changed.folder.name,
                                                                                      other_len.folder.name])


def test_bad_files_fail_with_the_file_and_the_fix(tmp_path):
    with pytest.raises(DataError, match="missing.jsonl.*not found; pass an existing .jsonl"):
        load_records(str(tmp_path / "missing.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "response": "b"}\n{not json\n')
    with pytest.raises(DataError, match="bad.jsonl line 2, column 2 is not JSON .*; fix or remove that line"):
        load_records(str(tmp_path / "bad.jsonl"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="empty.jsonl.*is empty"):
        load_records(str(tmp_path / "empty.jsonl"))
    with pytest.raises(DataError, match="x.jsonl.*is empty"):
        check_records([], "x.jsonl")
    (tmp_path / "data.xyz").write_text("a,b\n")
    with pytest.raises(DataError, match="unknown file type; use .arrow, .csv"):
        load_records(str(tmp_path / "data.xyz"))


def test_a_file_mixing_record_formats_names_the_records_of_each_format(tmp_path):
    """Arrow gives each record of the file every field (unset ones None): each record is still read as its own
    format, and a mixture is refused naming which records are which (TRL reads one format per dataset)."""
    import json

    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
            {"prompt": "p", "completion": "c"}, {"prompt": "q", "completion": "d"}, {"text": "t"}]
    (tmp_path / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = load_records(str(tmp_path / "mixed.jsonl"))
    assert records[1]["messages"] is None  # the union of fields, as Arrow holds it
    assert [to_example(r, f"record {i}").kind for i, r in enumerate(records)] == \
        ["messages", "prompt_completion", "prompt_completion", "text"]
    with pytest.raises(DataError, match=r"mixes record formats \(messages: records 0; prompt/completion \(standard\): "
                                        r"records 1, 2; text: records 3\).*one format per dataset"):
        check_records(records, "mixed.jsonl")
    check_records(records[1:3], "mixed.jsonl")  # one format: fine
