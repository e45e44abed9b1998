"""`python -m trainer.bench`: one JSON line per setup with the agreed fields (no timings asserted),
the padding benchmark's dataset, the communication estimate, and the Ray vs torchrun harness."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.guards import nonempty
from trainer.bench import main as bench_main
from trainer.bench.padding import instruction_documents, instruction_lengths
from trainer.bench.shapes import model_config
from trainer.model import flops as flops_lib

REPO = Path(__file__).resolve().parents[2]


def _records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _lines(text: str) -> dict[str, dict]:
    return {r["setup"]: r for r in _records(text)}


def _bench_without(blocked: tuple[str, ...], *args: str) -> tuple[int, list[dict], str]:
    """Runs `python -m trainer.bench ARGS` in a fresh interpreter where importing `blocked` fails,
    as on a GPU machine that has only torch and transformers."""
    code = (f"import sys\nfor m in {list(blocked)!r}: sys.modules[m] = None\n"
            f"from trainer.bench import main\nsys.exit(main({list(args)!r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    return proc.returncode, _records(proc.stdout), proc.stderr


NO_RAY = ("ray", "datasets")
SMALL_PEAK = ("--matmul-size", "256")  # the peak's 2048-wide default matmuls take seconds on a CPU


def test_throughput_runs_the_trainer_and_the_transformers_baseline_without_ray_or_datasets():
    code, records, err = _bench_without(NO_RAY, "--model-shape", "tiny", "--seq-len", "64", "--global-batch-size",
                                        "4", "--hf-micro-batch-size", "2", "--steps", "1", "--warmup", "1", *SMALL_PEAK)
    lines = {r["setup"]: r for r in records}
    assert code == 0, (records, err[-2000:])
    assert set(lines) == {"matmul_peak", "hf_trainer", "trainer", "summary"}
    assert lines["matmul_peak"]["measured_peak_tflops"] > 0 and lines["matmul_peak"]["dtype"] == "float32"
    assert lines["matmul_peak"]["size"] == int(SMALL_PEAK[1])
    for setup in ("hf_trainer", "trainer"):
        r = lines[setup]
        for key in ("tokens_per_s", "mfu_measured_peak", "mfu_datasheet_peak", "peak_mem_gib", "gflop_per_token",
                    "micro_batch_size", "seq_len", "global_batch_size", "device", "torch", "transformers"):
            assert key in r, (setup, key)
        assert r["tokens_per_s"] > 0 and r["mfu_measured_peak"] > 0 and r["peak_mem_gib"] > 0
        assert r["mfu_datasheet_peak"] is None  # no datasheet peak for a CPU
        assert (r["seq_len"], r["global_batch_size"], r["model_shape"]) == (64, 4, "tiny")
    assert lines["hf_trainer"]["micro_batch_size"] * lines["hf_trainer"]["grad_accum"] == 4
    t = lines["trainer"]
    assert t["loss_impl"] == "chunked" and t["micro_batch_size"] * t["grad_accum"] == 4
    assert t["micro_batch_fit"]["source"] == "estimated"
    assert lines["summary"]["speedup_vs_hf_trainer"] == pytest.approx(
        t["tokens_per_s"] / lines["hf_trainer"]["tokens_per_s"], rel=1e-2)


def test_bad_options_are_named_with_the_fix(capsys):
    assert bench_main(["--model-shape", "llama-70b"]) == 2
    assert ("--model-shape 'llama-70b': not a named shape (qwen2.5-1.5b, small, tiny) nor a model folder with "
            "config.json or a config .json file") in capsys.readouterr().err
    assert bench_main(["--global-batch-size", "8", "--micro-batch-size", "3"]) == 2
    assert "positive divisor of --global-batch-size 8" in capsys.readouterr().err
    assert bench_main(["--setups", "hf_trainer,deepspeed"]) == 2
    assert "unknown deepspeed" in capsys.readouterr().err
    assert bench_main(["--matmul-size", "0"]) == 2
    assert "--matmul-size = 0: must be at least 1" in capsys.readouterr().err
    assert bench_main(["padding", "--documents", "5", "--seq-len", "256"]) == 2
    assert ("error: --documents 5 pack into 1 rows, fewer than the 40 the steps need; raise --documents or lower "
            "--steps/--global-batch-size") in capsys.readouterr().err
    assert bench_main(["comm", "--nodes", "0"]) == 2
    assert "error: --nodes and --micro-batches must be at least 1" in capsys.readouterr().err
    assert bench_main(["comm", "--instance-type", "g9.huge"]) == 2
    assert "error: --instance-type: instance type 'g9.huge': unknown; use one of" in capsys.readouterr().err


def test_the_baseline_steps_with_the_trainers_declared_optimizer_settings(tmp_path):
    """transformers' Trainer gets the trainer's learning rate, decay, betas, epsilon, clipping and seed (its own
    default beta2 is 0.999), through each flag's declared TrainingArguments key."""
    from transformers import TrainingArguments

    from trainer.bench import setups
    from trainer.config.flags import TrainConfig

    args = TrainingArguments(output_dir=str(tmp_path), **setups.baseline_optimizer_arguments())
    ours = TrainConfig()
    assert (args.learning_rate, args.weight_decay, args.adam_beta1, args.adam_beta2, args.adam_epsilon,
            args.max_grad_norm, args.seed) == (ours.lr, ours.weight_decay, ours.adam_beta1, ours.adam_beta2,
                                               ours.adam_epsilon, ours.grad_clip, ours.seed)
    assert args.adam_beta2 == 0.95 != TrainingArguments(output_dir=str(tmp_path)).adam_beta2


def test_the_instruction_dataset_is_deterministic_with_a_long_tail():
    a = instruction_lengths(2000, 2048, seed=0)
    assert a == instruction_lengths(2000, 2048, seed=0) and a != instruction_lengths(2000, 2048, seed=1)
    total = np.array([p + r for p, r in a])
    assert total.max() <= 2048 and total.min() >= 8
    assert 200 < np.median(total) < 400 and np.percentile(total, 90) > 2.5 * np.median(total)
    docs = instruction_documents(50, 512, vocab=100)
    assert all(len(ids) == len(mask) and mask.any() and not mask[0] for ids, mask in nonempty(docs, "instruction documents"))


def test_padding_benchmark_reports_useful_tokens_of_packed_and_padded():
    code, records, err = _bench_without(NO_RAY, "padding", "--documents", "300", "--seq-len", "256",
                                        "--global-batch-size", "4", "--hf-micro-batch-size", "4", "--steps", "1",
                                        "--warmup", "1", "--attn", "sdpa,eager")
    assert code == 0, (records, err[-2000:])
    lines = {r["setup"]: r for r in records}
    packed = [r for r in records if r["setup"] == "trainer_packed"]
    assert [r["attn"] for r in packed] == ["sdpa", "eager"]  # one line per attention implementation
    assert lines["dataset"]["length_p90"] > 2 * lines["dataset"]["length_median"]
    for r in packed + [lines["hf_trainer_padded"]]:
        assert r["useful_tokens_per_s"] > 0 and r["documents_per_step"] > 0
    assert 0.2 < lines["hf_trainer_padded"]["padding_fraction"] < 1  # per-batch padding wastes a share
    assert packed[0]["packing_efficiency"] > 0.95  # best-fit packing
    best = max(packed, key=lambda r: r["useful_tokens_per_s"])
    assert lines["summary"]["best_packed_attn"] == best["attn"]
    assert lines["summary"]["useful_tokens_ratio_packed_vs_padded"] == pytest.approx(
        best["useful_tokens_per_s"] / lines["hf_trainer_padded"]["useful_tokens_per_s"], rel=1e-2)
    # both sides see about the same number of documents per optimizer step
    ratio = packed[0]["documents_per_step"] / lines["hf_trainer_padded"]["documents_per_step"]
    assert 0.5 < ratio < 2


def test_comm_estimate_prints_the_default_for_two_g6_nodes(capsys):
    assert bench_main(["comm", "--instance-type", "g6.12xlarge", "--nodes", "2"]) == 0
    captured = capsys.readouterr()
    r = _lines(captured.out)["comm_estimate"]
    assert r["default_sharding"] == "hybrid" and r["hybrid_s_per_step"] < r["full_s_per_step"]
    assert (r["network_gbps"], r["gpudirect_rdma"], r["params"]) == (40, False, 1_543_714_304)
    assert "using hybrid" in captured.err
    assert bench_main(["comm", "--instance-type", "g9.huge"]) == 2


def test_harness_runs_the_same_training_under_ray_and_torchrun(ray_cluster, trainer_cache, tmp_path, capsys):
    code = bench_main(["harness", "--address", ray_cluster.address, "--workers", "1", "--steps", "6",
                       "--log-every", "2", "--skip", "1", "--global-batch-size", "8", "--seq-len", "128",
                       "--out", str(tmp_path)])
    lines = _lines(capsys.readouterr().out)
    assert code == 0, lines
    for path in ("ray", "torchrun"):
        r = lines[path]
        assert r["steady_tokens_per_s"] > 0 and len(r["intervals"]) == 3 and r["workers"] == 1
        assert (tmp_path / path / "metrics.jsonl").is_file()
    assert lines["summary"]["ray_vs_torchrun"] > 0


@pytest.mark.slow
def test_throughput_of_any_architecture_from_its_config_folder_or_file(tmp_path, capsys):
    """A Mixtral folder (config only) and a Gemma 2 config.json: the real shape in the FLOPs, MoE aux loss and all;
    without accelerate installed, the transformers baseline's line names the fix and the trainer's still runs."""
    from trainer.model import flops

    from .architectures import config

    folder = tmp_path / "mixtral"
    config("mixtral", False).save_pretrained(folder)
    code, records, err = _bench_without(NO_RAY, "--model-shape", str(folder), "--seq-len", "32", "--global-batch-size",
                                        "2", "--hf-micro-batch-size", "2", "--steps", "1", "--warmup", "0",
                                        *SMALL_PEAK)
    lines = {r["setup"]: r for r in records}
    assert code == 0, (records, err[-2000:])
    for setup in ("hf_trainer", "trainer"):
        r = lines[setup]
        assert (r["model_type"], r["model_shape"]) == ("mixtral", str(folder)) and r["tokens_per_s"] > 0
        assert r["params"] == flops.parameter_count(config("mixtral", False)) > r["matmul_params_per_token"]
        assert r["gflop_per_token"] == round(flops.flops_per_token(config("mixtral", False), 32) / 1e9, 4)
    assert lines["trainer"]["loss_impl"] == "chunked"
    # a Gemma 2 config.json, on a machine without accelerate: the baseline's line names the fix, the trainer runs
    gemma = tmp_path / "gemma2"
    config("gemma2", True).save_pretrained(gemma)
    code, records, err = _bench_without(NO_RAY + ("accelerate",), "--model-shape", str(gemma / "config.json"),
                                        "--seq-len", "32", "--global-batch-size", "2", "--hf-micro-batch-size", "2",
                                        "--steps", "1", "--warmup", "0", *SMALL_PEAK)
    lines = {r["setup"]: r for r in records}
    assert code == 1, (records, err[-2000:])
    assert "accelerate" in lines["hf_trainer"]["error"] and "pip install 'accelerate>=1.1.0'" in lines["hf_trainer"]["error"]
    assert "--setups trainer" in lines["hf_trainer"]["error"] and "summary" not in lines
    trainer = lines["trainer"]
    assert trainer["model_type"] == "gemma2" and trainer["loss_impl"] == "chunked" and trainer["last_loss"] > 0
    assert trainer["tokens_per_s"] > 0
    (tmp_path / "broken.json").write_text("{not json")
    assert bench_main(["--model-shape", str(tmp_path / "broken.json")]) == 2
    assert "not a transformers model config" in capsys.readouterr().err


def test_lora_and_qlora_benchmarks_train_the_same_adapters_as_peft_beside_the_baseline(capsys):
    """--method lora: the trainer and transformers' Trainer on peft's get_peft_model train the same adapter
    parameters; --method qlora runs the trainer alone on the NF4 base (the baseline would need bitsandbytes)."""
    small = ["--model-shape", "tiny", "--seq-len", "32", "--global-batch-size", "2", "--hf-micro-batch-size", "2",
             "--steps", "1", "--warmup", "0", "--lora-rank", "4", *SMALL_PEAK]
    assert bench_main([*small, "--method", "lora"]) == 0
    lora = _lines(capsys.readouterr().out)
    assert {lora[s]["method"] for s in ("trainer", "hf_trainer")} == {"lora"}
    # rank 4 x (in + out) per linear of the tiny shape's 2 layers: q, o 64->64; k, v 64->32; gate, up 64->128; down
    adapters = 2 * 4 * (2 * (64 + 64) + 2 * (64 + 32) + 3 * (64 + 128))
    assert lora["trainer"]["trainable_params"] == lora["hf_trainer"]["trainable_params"] == adapters
    full = flops_lib.flops_per_token(model_config("tiny"), 32) / 1e9  # a frozen base has no weight gradients
    assert lora["trainer"]["gflop_per_token"] == lora["hf_trainer"]["gflop_per_token"] < round(full, 4)
    assert bench_main([*small, "--method", "qlora"]) == 0
    qlora = _lines(capsys.readouterr().out)
    assert set(qlora) == {"matmul_peak", "trainer"} and qlora["trainer"]["method"] == "qlora"
    assert qlora["trainer"]["trainable_params"] == adapters and qlora["trainer"]["tokens_per_s"] > 0
    assert bench_main([*small, "--method", "qlora", "--setups", "hf_trainer,trainer"]) == 2
    assert "transformers' Trainer has no 4-bit base without bitsandbytes" in capsys.readouterr().err


def test_the_data_benchmark_reports_the_single_process_path_with_consistent_numbers(tmp_path, capsys):
    """`bench data --paths single`: today's packing.prepare in a fresh process; rates from its own records, tokens
    and seconds, disk_bytes the packed files' sizes, the 10M extrapolation from them."""
    assert bench_main(["data", "--paths", "single", "--records", "120", "--seq-len", "256", "--out",
                       str(tmp_path)]) == 0
    lines = {r["path"]: r for r in _records(capsys.readouterr().out)}
    assert set(lines) == {"single", "summary"}  # 120 // 4 is under MIN_RECORDS: no quarter-size run
    r = lines["single"]
    for key, kind in (("path", str), ("workers", int), ("records", int), ("tokens", int), ("seconds", float),
                      ("records_per_s", float), ("tokens_per_s", float), ("peak_rss_bytes", int), ("disk_bytes", int)):
        assert isinstance(r[key], kind), (key, r)
    assert (r["workers"], r["records"]) == (1, 120)
    assert 500 * 120 < r["tokens"] < 1300 * 120  # ~860 tokens a record with the demo tokenizer
    assert r["records_per_s"] == pytest.approx(r["records"] / r["seconds"], rel=1e-2)
    assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"], rel=1e-2)
    packed = nonempty([p for p in (tmp_path / "cache" / "single-1-120" / "data").rglob("*") if p.is_file()],
                      "packed files")
    assert r["disk_bytes"] == sum(p.stat().st_size for p in packed)
    assert r["rows"] * 256 * 12 < r["disk_bytes"]
    assert 100 * 2 ** 20 < r["peak_rss_bytes"] < 8 * 2 ** 30
    s = lines["summary"]
    assert s["ray_2_vs_1_workers"] is None and s["peak_rss_n_vs_quarter"] == {}
    assert s["extrapolated"]["single-1"] == {"cpus": 1, "seconds": round(10_000_000 / r["records_per_s"]),
                                             "disk_bytes": round(r["disk_bytes"] * 10_000_000 / 120)}


def test_the_data_benchmarks_ray_path_prepares_on_the_cluster_with_one_and_two_workers(ray_cluster, tmp_path,
                                                                                    capsys):
    """`bench data --paths ray --address`: both worker counts pack the same rows on the session cluster (the
    single path's lines have their own test); the summary carries the 2-vs-1 ratio and the extrapolation over the
    cluster's CPUs."""
    assert bench_main(["data", "--paths", "ray", "--workers", "1,2", "--records", "60", "--seq-len", "256",
                       "--address", ray_cluster.address, "--out", str(tmp_path)]) == 0
    lines = {(r["path"], r.get("workers")): r for r in _records(capsys.readouterr().out)}
    assert set(lines) == {("ray", 1), ("ray", 2), ("summary", None)}
    one, two = lines[("ray", 1)], lines[("ray", 2)]
    assert (one["records"], one["tokens"], one["rows"]) == (two["records"], two["tokens"], two["rows"])
    assert one["records"] == 60 and 500 * 60 < one["tokens"] < 1300 * 60  # ~860 tokens a record
    for r in (one, two):
        assert r["chunks"] == 1 and r["rows"] * 256 * 12 < r["disk_bytes"] < r["rows"] * 256 * 13
        assert 100 * 2 ** 20 < r["worker_peak_rss_bytes"] < 8 * 2 ** 30 and r["peak_rss_bytes"] > 0
        shards = list((tmp_path / "storage" / f"ray-{r['workers']}-60" / "_data").glob("*/shard-00000/*.npy"))
        assert len(shards) == 4
    s = lines[("summary", None)]
    cpus = s["cluster_cpus"]
    assert cpus >= 1 and s["ray_2_vs_1_workers"] == pytest.approx(two["tokens_per_s"] / one["tokens_per_s"], abs=1e-3)
    assert s["extrapolated"]["ray-2"]["cpus"] == cpus


def test_the_data_benchmarks_chat_records_are_deterministic_and_near_the_target_length():
    from trainer import demo
    from trainer.bench import data

    tok = demo.build_tokenizer()
    words = data.words_for(tok)
    rows = data.chat_records(300, words_per_record=words, seed=0)
    assert rows == data.chat_records(300, words_per_record=words, seed=0) != data.chat_records(300, words_per_record=
                                                                                                  words, seed=1)
    counts = [len(tok(tok.apply_chat_template(r["messages"], tokenize=False))["input_ids"]) for r in rows]
    assert 0.85 * 860 < sum(counts) / len(counts) < 1.15 * 860
    assert max(counts) > 2 * min(counts)  # spread, as chat records are
    roles = {m["role"] for r in nonempty(rows, "records") for m in r["messages"]}
    assert roles == {"system", "user", "assistant"}
