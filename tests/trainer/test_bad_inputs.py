"""Bad inputs fail before training starts, with a clear message, and write nothing."""

from __future__ import annotations

import json

import pytest

from trainer import launch, local


@pytest.fixture
def inputs(demo_assets, tmp_path):
    (tmp_path / "no-fields.jsonl").write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    (tmp_path / "empty.jsonl").write_text("")
    return {"model": str(demo_assets["model"]), "train": str(demo_assets["train"]), "tmp": tmp_path}


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
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_before_training_and_writes_nothing(case, inputs, capsys):
    extra, needles = CASES[case]
    out = inputs["tmp"] / "runs" / "job"
    argv = ["--model", inputs["model"], "--dataset", inputs["train"], "--seq-len", "128",
            "--global-batch-size", "8", "--num-workers", "2", "--out", str(out)] + extra(inputs)
    code = launch.main(argv)  # stops in pre-flight: never reaches ray.init
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: invalid training configuration")
    for needle in needles:
        assert needle in err, (needle, err)
    assert not (inputs["tmp"] / "runs").exists()


def test_several_bad_inputs_are_reported_in_one_go(inputs, capsys):
    out = inputs["tmp"] / "runs" / "job"
    code = launch.main(["--model", str(inputs["tmp"] / "nope"), "--dataset", str(inputs["tmp"] / "empty.jsonl"),
                        "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "2 problem(s)" in err and "--model" in err and "--dataset" in err
    assert not out.parent.exists()


def test_local_demo_rejects_bad_flags_before_writing(tmp_path, capsys):
    out = tmp_path / "demo"
    assert local.main(["--workers", "2", "--global-batch-size", "7", "--out", str(out)]) == 2
    assert "--global-batch-size = 7" in capsys.readouterr().err
    assert local.main(["--workers", "2", "--micro-batch-size", "0", "--out", str(out)]) == 2
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
    assert launch.main(argv) == 2
    err = capsys.readouterr().err
    assert "--chat-template" in err and "no chat template" in err and "pass one with --chat-template FILE" in err
    template = inputs["tmp"] / "chatml.jinja"
    template.write_text(demo.CHAT_TEMPLATE)
    from trainer.config import parse

    assert launch.preflight(parse(argv + ["--chat-template", str(template)]))["tokenizer"].chat_template == demo.CHAT_TEMPLATE  # the fix works
    assert launch.main(argv + ["--chat-template", str(inputs["tmp"] / "missing.jinja")]) == 2
    assert "--chat-template" in capsys.readouterr().err
    assert not (inputs["tmp"] / "runs").exists()

