"""Bad inputs fail before training starts, with a clear message, and write nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.guards import nonempty
from trainer.__main__ import main as trainer
from trainer.jobs import launch
from trainer.run_folder import checkpoint as ckpt


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    """Every case here must stop before Ray: reaching ray.init is a failure, not a hang or a training run."""
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("the bad input reached ray.init")

    monkeypatch.setattr(ray, "init", refuse)


def _copy_model(model: Path, folder: Path, drop: tuple[str, ...] = ()) -> Path:
    import shutil

    shutil.copytree(model, folder, ignore=shutil.ignore_patterns(*drop))
    return folder


def _truncated_weights(model: Path, folder: Path) -> Path:
    _copy_model(model, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return folder


def _long_prompts(path: Path, n: int = 3) -> Path:
    """Conversations whose prompt alone is longer than 16 tokens: nothing trained is left after truncation."""
    rows = [{"messages": [{"role": "user", "content": "word " * (40 + 10 * i)}, {"role": "assistant", "content": "ok"}]}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def inputs(demo_assets, tmp_path):
    (tmp_path / "no-fields.jsonl").write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    (tmp_path / "empty.jsonl").write_text("")
    lines = [json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})] * 4
    lines[2] = lines[2].replace("yo", "y\\u00f6")
    (tmp_path / "latin1.jsonl").write_bytes(("\n".join(lines) + "\n").replace("\\u00f6", "\xf6").encode("latin-1"))
    (tmp_path / "few.jsonl").write_text("".join(json.dumps(r) + "\n" for r in
                                                [{"messages": [{"role": "user", "content": "a"},
                                                               {"role": "assistant", "content": "b"}]}] * 3))
    (tmp_path / "a-file").write_text("not a folder")
    return {"model": str(demo_assets["model"]), "train": str(demo_assets["train"]), "tmp": tmp_path,
            "demo_model": Path(demo_assets["model"])}


CASES = {
    "missing dataset file": (lambda i: ["--dataset", str(i["tmp"] / "nope.jsonl")],
                             ["--dataset", "nope.jsonl", "not found"]),
    "dataset without the needed fields": (lambda i: ["--dataset", str(i["tmp"] / "no-fields.jsonl")],
                                          ["--dataset", "record 0", "question", "messages"]),
    "empty dataset": (lambda i: ["--dataset", str(i["tmp"] / "empty.jsonl")], ["--dataset", "is empty"]),
    "sequence length above the model's maximum": (lambda i: ["--seq-len", "4096"],
                                                  ["--seq-len = 4096", "max_position_embeddings = 512"]),
    "global batch not divisible by workers x micro-batch": (
        lambda i: ["--global-batch-size", "10", "--num-workers", "4", "--micro-batch-size", "1"],
        ["--global-batch-size = 10", "--num-workers", "--micro-batch-size", "multiple of 4"]),
    "global batch not divisible by workers with the automatic micro-batch": (
        lambda i: ["--global-batch-size", "10", "--num-workers", "4"],
        ["--global-batch-size = 10 is not divisible by --num-workers = 4", "--micro-batch-size auto",
         "multiple of 4 (e.g. 8 or 12)"]),
    "micro-batch size neither a positive integer nor auto": (
        lambda i: ["--micro-batch-size", "big"],
        ["--micro-batch-size (micro_batch_size) = 'big'", "must be a positive integer or auto"]),
    "unknown model path": (lambda i: ["--model", str(i["tmp"] / "no-such-model")],
                           ["--model", "no-such-model", "does not exist"]),
    # issue 17: each of these used to reach Ray (and train from random weights, fail after minutes, or write)
    "model folder without weight files": (
        lambda i: ["--model", str(_copy_model(i["demo_model"], i["tmp"] / "config-only", ("*.safetensors",)))],
        ["--model", "config-only", "no weight files", "training would start from random weights", "--random-init"]),
    "weight file cut in half": (
        lambda i: ["--model", str(_truncated_weights(i["demo_model"], i["tmp"] / "cut"))],
        ["--model", "model.safetensors cannot be read", "SafetensorError", "download or save the folder again"]),
    "a byte that is not UTF-8": (lambda i: ["--dataset", str(i["tmp"] / "latin1.jsonl")],
                                 ["--dataset", "latin1.jsonl line 3", "is not UTF-8", "b'\\xf6'", "save the file as UTF-8"]),
    "every record too long to keep a trained token": (
        lambda i: ["--dataset", str(_long_prompts(i["tmp"] / "long.jsonl")), "--seq-len", "16"],
        ["--dataset", "every record is dropped for --seq-len 16", "truncated to --seq-len before its first trained",
         "the longest is record 2", "raise --seq-len (to"]),
    "fewer packed rows than one global batch": (lambda i: ["--dataset", str(i["tmp"] / "few.jsonl")],
                                                ["--dataset", "fewer than one global batch of 8",
                                                 "lower --global-batch-size or --seq-len, or add data"]),
    "run folder below a file": (lambda i: ["--out", str(i["tmp"] / "a-file" / "job")],
                                ["--out", "a-file", "is a file, so no folder can be made below it"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_before_training_and_writes_nothing(case, inputs, capsys):
    extra, needles = CASES[case]
    out = inputs["tmp"] / "runs" / "job"
    argv = ["--model", inputs["model"], "--dataset", inputs["train"], "--seq-len", "128",
            "--global-batch-size", "8", "--num-workers", "2", "--out", str(out)] + extra(inputs)
    code = trainer(["train", *argv])  # stops in pre-flight: never reaches ray.init
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: invalid training configuration")
    for needle in nonempty(needles, "expected phrases"):
        assert needle in err, (needle, err)
    assert not (inputs["tmp"] / "runs").exists()


def test_several_bad_inputs_are_reported_in_one_go(inputs, capsys):
    out = inputs["tmp"] / "runs" / "job"
    code = trainer(["train", "--model", str(inputs["tmp"] / "nope"), "--dataset", str(inputs["tmp"] / "empty.jsonl"),
                        "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "2 problem(s)" in err and "--model" in err and "--dataset" in err
    assert not out.parent.exists()


def test_local_demo_rejects_bad_flags_before_writing(tmp_path, capsys):
    out = tmp_path / "demo"
    assert trainer(["local", "--workers", "2", "--global-batch-size", "7", "--out", str(out)]) == 2
    assert "--global-batch-size = 7" in capsys.readouterr().err
    assert trainer(["local", "--workers", "2", "--micro-batch-size", "0", "--out", str(out)]) == 2
    assert "--micro-batch-size (micro_batch_size) = 0: must be a positive integer or auto" in capsys.readouterr().err
    assert not out.exists()


def _without_chat_template(model, folder):
    import shutil

    shutil.copytree(model, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_tokenizer_without_a_chat_template_is_caught_before_ray_starts_with_the_fix(inputs, demo_assets, capsys):
    from trainer import demo

    model = _without_chat_template(demo_assets["model"], inputs["tmp"] / "base-model")
    out = inputs["tmp"] / "runs" / "job"
    argv = ["--model", str(model), "--dataset", inputs["train"], "--seq-len", "128", "--global-batch-size", "8",
            "--out", str(out)]
    assert trainer(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert "--chat-template" in err and "no chat template" in err and "pass one with --chat-template FILE" in err
    template = inputs["tmp"] / "chatml.jinja"
    template.write_text(demo.CHAT_TEMPLATE)
    from trainer.config.load import parse

    fixed = launch.preflight(parse(argv + ["--chat-template", str(template)]))
    assert fixed["tokenizer"].chat_template == demo.CHAT_TEMPLATE  # the fix works
    assert trainer(["train", *argv, "--chat-template", str(inputs["tmp"] / "missing.jinja")]) == 2
    assert "--chat-template" in capsys.readouterr().err
    assert not (inputs["tmp"] / "runs").exists()



# --- issue 17: resuming, reaching the cluster, reporting, every CLI -------------------------------------------

def _job_argv(inputs, out, *extra):
    return ["--model", inputs["model"], "--dataset", inputs["train"], "--seq-len", "128", "--global-batch-size", "8",
            "--num-workers", "2", "--lr", "0.001", "--steps", "4", "--out", str(out), *extra]


def _started_run(inputs, out, *extra) -> dict:
    """A run folder as a run leaves it after its first checkpoint: run.json with the inputs it started with."""
    from trainer.config.load import parse

    info = launch.preflight(parse(_job_argv(inputs, out, *extra)))
    (out / ckpt.dir_name(2)).mkdir(parents=True)
    (out / "run.json").write_text(json.dumps({"run_name": out.name, "inputs": info["inputs"]}))
    return info


def test_a_run_folder_resumes_only_with_the_inputs_it_was_started_with(inputs, capsys):
    import shutil

    from trainer.config.load import parse

    out = inputs["tmp"] / "runs" / "sweep"
    _started_run(inputs, out)
    # a changed learning rate and batch: refused, each difference listed, with both ways out
    assert trainer(["train", *_job_argv(inputs, out, "--lr", "0.002", "--global-batch-size", "16")]) == 2
    err = capsys.readouterr().err
    for needle in ("this run folder holds run 'sweep', started with other inputs", "--lr: 0.001 then, 0.002 now",
                   "--global-batch-size: 8 then, 16 now", "another --run-name (or --out FOLDER)", "--resume-anyway"):
        assert needle in err, (needle, err)
    # the same file name with other records: the data changed
    data = inputs["tmp"] / "data" / "train.jsonl"
    data.parent.mkdir()
    shutil.copy(inputs["train"], data)
    moved = {**inputs, "train": str(data)}
    out2 = inputs["tmp"] / "runs" / "new-data"
    _started_run(moved, out2)
    data.write_text("".join(data.read_text().splitlines(keepends=True)[::-1][:300]))
    assert trainer(["train", *_job_argv(moved, out2)]) == 2
    assert "the dataset's content changed (train.jsonl)" in capsys.readouterr().err
    # what changes only how the run is executed or watched never blocks; --resume-anyway lets a change through
    info = launch.preflight(parse(_job_argv(inputs, out, "--log-every", "1", "--max-failures", "3", "--num-to-keep",
                                            "5", "--num-workers", "1", "--micro-batch-size", "2", "--no-progress")))
    assert info["notes"] == []
    info = launch.preflight(parse(_job_argv(inputs, out, "--lr", "0.002", "--resume-anyway")))
    assert any("--lr: 0.001 then, 0.002 now" in n for n in info["notes"]), info["notes"]
    # the same content written again (the demo rewrites its file on every run) is the same data
    data.write_text(data.read_text())
    assert launch.preflight(parse(_job_argv(moved, out2, "--resume-anyway")))["notes"]


def test_an_address_nobody_answers_is_an_error_within_seconds(inputs, capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    t0 = time.monotonic()
    code = trainer(["train", "--address", f"127.0.0.1:{port}", *_job_argv(inputs, inputs["tmp"] / "runs" / "job")])
    print(f"unreachable --address: exit {code} after {time.monotonic() - t0:.1f} s")
    assert code == 2
    assert f"--address 127.0.0.1:{port}: nothing answers there within 5 s" in capsys.readouterr().err
    assert trainer(["train", "--address", "http://127.0.0.1:8265", *_job_argv(inputs, inputs["tmp"] / "x")]) == 2
    err = capsys.readouterr().err
    assert "a dashboard URL" in err and "trainer submit --address http://127.0.0.1:8265" in err


def test_records_too_long_are_counted_and_reported_with_the_options(inputs, capsys):
    from trainer.config.load import parse

    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a " * n}]}
            for n in (3, 200, 5, 120)] * 4
    data = inputs["tmp"] / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--model", inputs["model"], "--dataset", str(data), "--seq-len", "64", "--global-batch-size", "2",
            "--out", str(inputs["tmp"] / "runs" / "long")]
    notes = launch.preflight(parse(argv))["notes"]
    assert len(notes) == 1, notes
    assert notes[0].startswith("8 of 16 records are longer than --seq-len 64 and were truncated (the longest: record 1, ")
    assert "--overlong drop to leave them out, or raise --seq-len (to" in notes[0]
    dropped = launch.preflight(parse(argv + ["--overlong", "drop"]))
    assert dropped["data"]["dropped"] == 8 and dropped["data"]["rows"] >= 2
    assert "were dropped" in dropped["notes"][0] and "--overlong truncate" in dropped["notes"][0]
    assert trainer(["data", *argv[:-2]]) == 0
    assert "note             8 of 16 records are longer than --seq-len 64 and were truncated" in capsys.readouterr().out


def test_hub_downloads_fetch_the_weights_the_trainer_reads():
    from trainer.model.sources import hub_weight_files

    bin_only = ["config.json", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
                "pytorch_model.bin.index.json", "tokenizer.json", "flax_model.msgpack", "tf_model.h5"]
    assert hub_weight_files(bin_only) == ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
    both = ["model.safetensors", "pytorch_model.bin", "onnx/model.safetensors", "training_args.bin"]
    assert hub_weight_files(both) == ["model.safetensors"]  # as from_pretrained: safetensors win; subfolders not read
    assert hub_weight_files(["config.json", "tokenizer.json"]) == []


def test_the_local_demo_leaves_nothing_behind_when_the_preflight_refuses(inputs, tmp_path, capsys):
    out = tmp_path / "demo"
    assert trainer(["local", "--model", str(inputs["tmp"] / "nope"), "--out", str(out)]) == 2
    assert "--model" in capsys.readouterr().err
    assert not out.exists()  # the demo data written for the run went again


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", ["train", "local", "data"])
def test_every_cli_turns_a_bad_input_into_one_error_line_never_a_traceback(command, inputs):
    argv = [sys.executable, "-m", "trainer", command, "--model", inputs["model"], "--dataset",
            str(inputs["tmp"] / "latin1.jsonl"), "--seq-len", "64", "--global-batch-size", "2",
            "--out", str(inputs["tmp"] / "runs" / command)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "error: invalid training configuration" in proc.stderr, proc.stderr
    assert "latin1.jsonl line 3" in proc.stderr
    assert not (inputs["tmp"] / "runs").exists()


def test_the_job_records_what_packing_cut_or_dropped_in_its_event_log(process_group, inputs, tmp_path, caplog):
    from trainer.config.flags import TrainConfig
    from trainer.loop.parallel import setup_parallel
    from trainer.loop.run import run
    from trainer.storage import Storage

    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a " * n}]}
            for n in (3, 200, 5, 6)] * 2
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = TrainConfig(model=inputs["model"], dataset=str(data), seq_len=64, global_batch_size=2, num_workers=1,
                      steps=1, log_every=1, export=False, progress=False, report_to="none",
                      storage_path=str(tmp_path), run_name="cut", cache_dir=str(tmp_path / "cache"))
    with caplog.at_level("WARNING", logger="trainer"):
        run(cfg, setup_parallel(cfg, 0, 1, 0), Storage.from_uri(cfg.run_uri))
    start = json.loads((tmp_path / "cut" / "events.jsonl").read_text().splitlines()[0])
    assert start["event"] == "start" and start["data"]["too_long"] == 2 and start["data"]["truncated"] == 2
    assert start["data"]["longest_record"] == 1 and start["data_notes"][0].startswith("2 of 8 records are longer")
    assert "data: 2 of 8 records are longer than --seq-len 64 and were truncated" in caplog.text  # the job log


def test_the_cluster_ceiling_is_the_autoscalers_maximum_else_what_the_cluster_has():
    from trainer.jobs.cluster import capacity_problem

    need = {"GPU": 16.0}
    static = capacity_problem(need, {"CPU": 96.0, "GPU": 8.0}, None, num_workers=16)
    assert static.startswith("--num-workers 16 asks for 16 GPU (1 per worker); the Ray cluster has 8 GPU and cannot "
                             "grow (no autoscaler); use --num-workers 8 or fewer"), static
    # KubeRay's autoscaler: 0 GPU nodes now, up to 4 x 4 GPUs: the run waits for them, it is not refused
    assert capacity_problem(need, {"CPU": 4.0}, {"CPU": 196.0, "GPU": 16.0}, num_workers=16) is None
    scaled = capacity_problem({"GPU": 24.0}, {"CPU": 4.0}, {"GPU": 16.0}, num_workers=24)
    assert "has 16 GPU at most, with the autoscaler's node groups at their maximum" in scaled
    assert "no GPU in this cluster" in capacity_problem(need, {"CPU": 8.0}, None, num_workers=16)
