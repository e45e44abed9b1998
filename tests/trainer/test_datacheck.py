"""`python -m trainer data`: the counts the job will see and rendered records with the trained span marked."""

from __future__ import annotations

import json

from trainer import demo
from trainer.__main__ import main as trainer
from trainer.data.packing import DataSpec, prepare
from trainer.model.sources import load_tokenizer


def test_counts_match_what_the_job_packs_and_examples_mark_the_trained_tokens(demo_assets, tmp_path, capsys):
    rows, _ = demo.make_dataset(seed=4, n_train=40, n_eval=1)
    rows.append({"messages": [{"role": "user", "content": "x" * 300}, {"role": "assistant", "content": "y"}]})
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--dataset", str(data), "--model", str(demo_assets["model"]), "--seq-len", "128",
            "--global-batch-size", "4", "--cache-dir", str(tmp_path / "cache")]
    assert trainer(["data", *argv, "--show", "2"]) == 0
    out = capsys.readouterr().out
    packed = prepare(DataSpec(str(data)), tokenizer=load_tokenizer(demo_assets["model"]), seq_len=128,
                     cache_dir=tmp_path / "job-cache")  # what the workers build
    meta = packed.meta
    assert f"records          {len(rows)}" in out
    assert f"{meta['tokens']:,} rendered, {meta['trained_tokens']:,} of them trained" in out
    assert "dropped          1\n                   1 truncated to --seq-len before its first trained token" in out
    assert f"packed           {meta['rows']:,} rows of 128 tokens, {meta['fill']:.1%} full" in out
    assert f"steps per epoch  {meta['rows'] // 4:,} at --global-batch-size 4" in out
    answer = rows[0]["messages"][1]["content"]
    shown = out.split("--- record 0 (trained tokens between ⟦ and ⟧) ---\n", 1)[1].split("\n\n--- record 1", 1)[0]
    # only the assistant turn is trained: its content, the end-of-turn token and the newline the template adds
    assert shown.endswith(f"⟦{answer}<|im_end|>\n⟧") and shown.count("⟦") == 1
    assert "--- record 1" in out and "--- record 2" not in out


def test_train_on_all_and_bad_data_are_reported_like_the_job_would(demo_assets, tmp_path, capsys):
    data = tmp_path / "text.jsonl"
    data.write_text(json.dumps({"text": "hello"}) + "\n")
    base = ["--model", str(demo_assets["model"]), "--seq-len", "64", "--global-batch-size", "2",
            "--cache-dir", str(tmp_path / "cache")]
    assert trainer(["data", *base, "--dataset", str(data), "--show", "1"]) == 0
    assert "⟦hello<|im_end|>⟧" in capsys.readouterr().out  # text records: every token, EOS appended
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": [{"type": "image", "url": "a.png"}]}]}) + "\n")
    assert trainer(["data", *base, "--dataset", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "--dataset" in err and "record 0 field messages[0].content[0]: a 'image' part" in err
