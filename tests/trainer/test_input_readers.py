"""Issue 29, item 4: every reader of the user's files ends in one `error:` line naming the file, the line and the
fix: bounded (values cut with their length, YAML depth and aliases), encodings, folders where files are expected,
keys given twice, YAML 1.1 surprises and characters that only look like the right ones. All in-process."""

from __future__ import annotations

import pytest

from tests.guards import nonempty
from trainer.__main__ import main as trainer

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)) + "run_name: *i\n"

CONFIGS = {  # name: (file content, phrases of the message)
    "a key given twice": ("lr: 1e-5\nsteps: 3\nlr: 2e-5\n",
                          ["line 3: key 'lr' is given twice (also on line 1)", "Keep one"]),
    "a YAML 1.1 octal": ("steps: 010\n", ["line 1: '010' is a number YAML 1.1 reads", "plain decimal"]),
    "a YAML 1.1 boolean": ("export: on\n", ["line 1: 'on' is a boolean only in YAML 1.1", "write true or false"]),
    "nested 10,000 deep": ("a: " + "[" * 10_000 + "]" * 10_000 + "\n", ["line 1: nested more than 64 levels deep"]),
    "an alias bomb": (BOMB, ["more than 100,000 values with its aliases (*name) expanded"]),
    "a byte not UTF-8": (b"lr: 1e-5\nrun_name: caf\xe9\n", ["line 2: byte b'\\xe9' is not UTF-8",
                                                           "save the file as UTF-8"]),
    "a zero-width space in a key": ("\u200blr: 1e-5\n", ["key '\\u200blr': unknown configuration key (did you mean "
                                                         "'lr'?)", "U+200B ZERO WIDTH SPACE at position 0"]),
    "a Cyrillic letter in a key": ("s\u0435ed: 1\n", ["(did you mean 'seed'?)",
                                                      "U+0435 CYRILLIC SMALL LETTER IE at position 1"]),
    "a 1 MB value": ("lr: " + "x" * 1_000_000 + "\n", ["key lr: 'xxxx", "... (1,000,002 characters) is not a "
                                                                         "valid float"]),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_a_bad_config_file_ends_in_one_bounded_error_line(case, tmp_path, capsys):
    content, needles = CONFIGS[case]
    path = tmp_path / "c.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    code = trainer(["train", "--model", "m", "--dataset", "d.jsonl", "--config", str(path),
                    "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert err.startswith("error: ") and err.count("error:") == 1 and "Traceback" not in err, err[-2000:]
    assert len(err) < 2000, len(err)
    for needle in nonempty(needles, "phrases"):
        assert needle in err, (needle, err[-2000:])
    assert not (tmp_path / "run").exists()


def test_a_config_path_that_is_a_folder_is_named(tmp_path, capsys):
    code = trainer(["train", "--model", "m", "--dataset", "d.jsonl", "--config", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and f"--config {tmp_path}: is a folder; pass the path of a YAML file" in err, err


def test_the_bounded_reader_still_reads_what_a_config_file_holds(tmp_path):
    from trainer.config.load import load_yaml

    path = tmp_path / "c.yaml"
    path.write_text("lr: 2.0e-5\nsteps: 10\nexport: false\nbase: &b {warmup_steps: 2}\nother: *b\nrun_name: '010'\n")
    assert load_yaml(str(path)) == {"lr": 2e-5, "steps": 10, "export": False, "base": {"warmup_steps": 2},
                                    "other": {"warmup_steps": 2}, "run_name": "010"}


# ------------------------------------------------------------------ the data, the tokenizer, the cache: pre-flight

@pytest.fixture
def no_ray(monkeypatch):
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("the bad input reached ray.init")

    monkeypatch.setattr(ray, "init", refuse)


def _chat(assistant: str = "yo") -> str:
    import json

    return json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": assistant}]})


def _no_eos_tokenizer(model, folder):
    import json
    import shutil

    shutil.copytree(model, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["eos_token"] = None
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return ["--tokenizer", str(folder)]


DATA = {  # name: (file name, content, extra flags (given the demo model and the case's folder), phrases)
    "a record nested 10,000 deep": (
        "deep.jsonl", "\n".join([_chat(), _chat(), '{"messages": ' + "[" * 10_000 + "]" * 10_000 + "}"]) + "\n",
        None, ["deep.jsonl line 3 nests more than 64 levels of lists and objects", "fix or remove that record"]),
    "a line that is not JSON": ("bad.jsonl", "\n".join([_chat(), "{oops: 1}", _chat()]) + "\n", None,
                                ["bad.jsonl line 2, column 2 is not JSON (Expecting property name enclosed in "
                                 "double quotes)", "fix or remove that line"]),
    "every assistant turn empty": ("empty.jsonl", "\n".join([_chat(" "), _chat("")] * 8) + "\n", None,
                                   ["record 0 field messages: every assistant message is empty",
                                    "the model learns to answer nothing"]),
    "a tokenizer without an EOS token": ("text.jsonl", '{"text": "some text"}\n' * 40, _no_eos_tokenizer,
                                         ["the tokenizer has no EOS token", "never learn to stop"]),
    "--seq-len 1": ("ok.jsonl", (_chat() + "\n") * 40, lambda model, folder: ["--seq-len", "1"],
                    ["--seq-len (seq_len) = 1: must be at least 2 (a row of one token has no next token to learn)"]),
    "--cache-dir a file": ("ok.jsonl", (_chat() + "\n") * 40,
                           lambda model, folder: [folder.write_text("x"), "--cache-dir", str(folder)][1:],
                           ["--cache-dir", "is a file, not a folder; pass a folder this user can write"]),
}


@pytest.mark.parametrize("case", list(DATA))
def test_bad_data_tokenizer_or_cache_ends_in_one_error_line_before_ray(case, no_ray, demo_assets, tmp_path, capsys):
    name, content, extra, needles = DATA[case]
    (tmp_path / name).write_text(content)
    flags = extra(demo_assets["model"], tmp_path / "extra") if extra else []
    code = trainer(["train", "--model", str(demo_assets["model"]), "--dataset", str(tmp_path / name), "--seq-len",
                    "64", "--global-batch-size", "2", "--num-workers", "1", "--out", str(tmp_path / "runs" / "job"),
                    *flags])
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert err.startswith("error: ") and err.count("error:") == 1 and "Traceback" not in err, err[-3000:]
    for needle in nonempty(needles, "phrases"):
        assert needle in err, (needle, err[-3000:])
    assert not (tmp_path / "runs").exists()
