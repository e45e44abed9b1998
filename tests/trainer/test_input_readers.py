"""Issue 29, item 4: every reader of the user's files ends in one `error:` line naming the file, the line and the
fix: bounded (values cut with their length, YAML depth and aliases), encodings, folders where files are expected,
keys given twice, YAML 1.1 surprises and characters that only look like the right ones. All in-process."""

from __future__ import annotations

import pytest

from tests.guards import nonempty
from trainer.__main__ import main as trainer

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8))

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
