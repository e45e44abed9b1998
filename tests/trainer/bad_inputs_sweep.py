"""The bad-input sweep of issue 17: every class of bad training input through the real CLIs, as a user runs them.

    .venv/bin/python -m tests.trainer.bad_inputs_sweep [--only SUBSTRING] [--markdown]

Each case gets a folder of its own with its inputs, runs `python -m trainer ...` in a fresh
process (against a local Ray cluster this script starts, where the case needs one) and is
reported as: input, exit code, seconds to the error, the message's first line, and what
the run wrote (files that appeared in its folder). A representative subset is part of the
test suite (tests/trainer/test_bad_inputs.py, test_user_errors_on_ray.py), and the cases of
issue 29 (ISSUE_29) run in it in-process (tests/trainer/test_bad_inputs_sweep.py, `run_in_process`);
this is the whole sweep, for a person to read. It takes several minutes on a small machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Case:
    name: str
    command: str
    argv: Callable[["Sweep", Path], list[str]]
    setup: Callable[["Sweep", Path], None] = lambda sweep, d: None
    base: bool = True          # prepend the valid model/dataset/shape flags
    cluster: str | None = None  # "gcs" or "dashboard": the local cluster's address is appended
    timeout: float = 600
    env: dict = field(default_factory=dict)  # environment variables set for the case ("" unsets one)


@dataclass
class Sweep:
    root: Path
    model: Path
    data: Path
    cluster: dict = field(default_factory=dict)

    def base(self, out: Path) -> list[str]:
        return ["--model", str(self.model), "--dataset", str(self.data), "--seq-len", "128", "--global-batch-size", "8",
                "--num-workers", "2", "--steps", "4", "--lr", "0.001", "--out", str(out)]


# ------------------------------------------------------------------ inputs

def copy_model(sweep: Sweep, d: Path, drop: tuple[str, ...] = ()) -> Path:
    shutil.copytree(sweep.model, d / "model", ignore=shutil.ignore_patterns(*drop))
    return d / "model"


def edit_model(edit: Callable[[Path], None], drop: tuple[str, ...] = ()):
    def setup(sweep: Sweep, d: Path) -> None:
        edit(copy_model(sweep, d, drop))
    return setup


def write(name: str, content: str | bytes):
    def setup(sweep: Sweep, d: Path) -> None:
        (d / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return setup


def jsonl(*rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def chat(user: str = "hi", assistant: str = "yo") -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]}


def started_run(extra: tuple[str, ...] = (), data_edit: Callable[[Path], None] | None = None):
    """A run folder as a run leaves it: run.json with the inputs it started with, and a checkpoint."""
    def setup(sweep: Sweep, d: Path) -> None:
        from trainer.config.load import parse
        from trainer.jobs import launch
        from trainer.run_folder import checkpoint as ckpt

        shutil.copy(sweep.data, d / "train.jsonl")
        argv = [*sweep.base(d / "run"), "--dataset", str(d / "train.jsonl")]
        info = launch.preflight(parse(argv))
        (d / "run" / ckpt.dir_name(4)).mkdir(parents=True)
        (d / "run" / "run.json").write_text(json.dumps({"run_name": "run", "inputs": info["inputs"]}))
        if data_edit:
            data_edit(d / "train.jsonl")
    return setup


def truncate(path: Path) -> None:
    w = path / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])


def header_too_big(path: Path) -> None:
    w = path / "model.safetensors"
    w.write_bytes(struct.pack("<Q", 10**12) + w.read_bytes()[8:])


def index_missing_shard(path: Path) -> None:
    (path / "model.safetensors").rename(path / "model-00001-of-00002.safetensors")
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}}))


def no_chat_template(path: Path) -> None:
    (path / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))


def config_edit(change: Callable[[dict], None]):
    def edit(path: Path) -> None:
        cfg = json.loads((path / "config.json").read_text())
        change(cfg)
        (path / "config.json").write_text(json.dumps(cfg))
    return edit


def reversed_data(path: Path) -> None:
    path.write_text("".join(path.read_text().splitlines(keepends=True)[::-1][:400]))


M, D = "--model", "--dataset"
CASES: list[Case] = [
    # flags and YAML
    Case("--steps 0", "train", lambda s, d: ["--steps", "0"]),
    Case("--global-batch-size 10 with 4 workers", "train", lambda s, d: ["--global-batch-size", "10", "--num-workers", "4"]),
    Case("--micro-batch-size big", "train", lambda s, d: ["--micro-batch-size", "big"]),
    Case("--lr -1", "train", lambda s, d: ["--lr", "-1"]),
    Case("--steps and --epochs", "train", lambda s, d: ["--epochs", "1"]),
    Case("--warmup-steps above --steps", "train", lambda s, d: ["--warmup-steps", "10"]),
    Case("--seq-len above the model's maximum", "train", lambda s, d: ["--seq-len", "4096"]),
    Case("--config missing", "train", lambda s, d: ["--config", str(d / "missing.yaml")]),
    Case("--config unknown key", "train", lambda s, d: ["--config", str(d / "c.yaml")], write("c.yaml", "lerning_rate: 1e-5\n")),
    Case("--config not YAML", "train", lambda s, d: ["--config", str(d / "c.yaml")], write("c.yaml", "lr: [1, \n")),
    Case("--report-to foo", "train", lambda s, d: ["--report-to", "foo"]),
    Case("--run-name with a space", "train", lambda s, d: ["--run-name", "bad name"]),
    Case("--storage-path ftp://", "train", lambda s, d: ["--storage-path", "ftp://host/x"], base=True),
    Case("--attn-implementation flex_attention on CPU", "train", lambda s, d: ["--attn-implementation", "flex_attention"]),
    Case("--shard-size 3 of 2 workers", "train", lambda s, d: ["--sharding", "hybrid", "--shard-size", "3"]),
    Case("--instance-type x1.tiny", "train", lambda s, d: ["--instance-type", "x1.tiny"]),
    Case("--show -1 (trainer data)", "data", lambda s, d: ["--show", "-1"]),
    # the model
    Case("--model missing folder", "train", lambda s, d: [M, str(d / "nope")]),
    Case("--model folder without config.json", "train", lambda s, d: [M, str(d / "model")],
         edit_model(lambda p: (p / "config.json").unlink())),
    Case("--model without weight files", "train", lambda s, d: [M, str(d / "model")],
         edit_model(lambda p: None, drop=("*.safetensors",))),
    Case("--model weight file cut in half", "train", lambda s, d: [M, str(d / "model")], edit_model(truncate)),
    Case("--model safetensors header too large", "train", lambda s, d: [M, str(d / "model")], edit_model(header_too_big)),
    Case("--model index names a missing shard", "train", lambda s, d: [M, str(d / "model")],
         edit_model(index_missing_shard)),
    Case("--model config.json not JSON", "train", lambda s, d: [M, str(d / "model")],
         edit_model(lambda p: (p / "config.json").write_text("{"))),
    Case("--model unknown model_type", "train", lambda s, d: [M, str(d / "model")],
         edit_model(config_edit(lambda c: c.update(model_type="frobnicator")))),
    Case("--model tokenizer without chat template", "train", lambda s, d: [M, str(d / "model")],
         edit_model(no_chat_template)),
    Case("--chat-template missing", "train", lambda s, d: ["--chat-template", str(d / "none.jinja")]),
    Case("--chat-template empty", "train", lambda s, d: ["--chat-template", str(d / "t.jinja")], write("t.jinja", "")),
    Case("--tokenizer missing", "train", lambda s, d: ["--tokenizer", str(d / "nope")]),
    # the data
    Case("--dataset missing file", "train", lambda s, d: [D, str(d / "nope.jsonl")]),
    Case("--dataset empty file", "train", lambda s, d: [D, str(d / "e.jsonl")], write("e.jsonl", "")),
    Case("--dataset without the needed fields", "train", lambda s, d: [D, str(d / "x.jsonl")],
         write("x.jsonl", jsonl({"question": "q", "answer": "a"}))),
    Case("--dataset byte not UTF-8", "train", lambda s, d: [D, str(d / "x.jsonl")],
         write("x.jsonl", (jsonl(chat()) * 2).encode() + b'{"text": "caf\xe9"}\n')),
    Case("--dataset line not JSON", "train", lambda s, d: [D, str(d / "x.jsonl")],
         write("x.jsonl", jsonl(chat()) + "{oops\n")),
    Case("--dataset unknown extension", "train", lambda s, d: [D, str(d / "x.xml")], write("x.xml", "<a/>")),
    Case("--dataset bad role", "train", lambda s, d: [D, str(d / "x.jsonl")],
         write("x.jsonl", jsonl({"messages": [{"role": "human", "content": "hi"}]}))),
    Case("--dataset image content part", "train", lambda s, d: [D, str(d / "x.jsonl")],
         write("x.jsonl", jsonl({"messages": [{"role": "user", "content": [{"type": "image", "url": "a.png"}]},
                                              {"role": "assistant", "content": "a cat"}]}))),
    Case("--dataset no assistant turn", "train", lambda s, d: [D, str(d / "x.jsonl")],
         write("x.jsonl", jsonl({"messages": [{"role": "user", "content": "hi"}]}))),
    Case("--dataset prompt/completion of mixed types", "train", lambda s, d: [D, str(d / "x.jsonl")],
         write("x.jsonl", jsonl({"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]}))),
    Case("--dataset every record too long", "train", lambda s, d: [D, str(d / "x.jsonl"), "--seq-len", "16"],
         write("x.jsonl", jsonl(*[chat("word " * (40 + i), "ok") for i in range(20)]))),
    Case("--dataset fewer rows than one global batch", "train", lambda s, d: [D, str(d / "x.jsonl")],
         write("x.jsonl", jsonl(chat(), chat(), chat()))),
    Case("--dataset-split test of one file", "train", lambda s, d: ["--dataset-split", "test"]),
    Case("records longer than --seq-len (a note)", "data", lambda s, d: [D, str(d / "x.jsonl"), "--seq-len", "32"],
         write("x.jsonl", jsonl(*[chat("hi", "a " * (5 + 20 * (i % 3))) for i in range(30)]))),
    # the run folder
    Case("--out below a file", "train", lambda s, d: ["--out", str(d / "f" / "run")], write("f", "x")),
    Case("--out under /proc", "train", lambda s, d: ["--out", "/proc/trainer-run"]),
    Case("resume with another --lr and batch", "train",
         lambda s, d: [D, str(d / "train.jsonl"), "--out", str(d / "run"), "--lr", "0.002", "--global-batch-size", "16"],
         started_run()),
    Case("finished run pointed at changed data", "train",
         lambda s, d: [D, str(d / "train.jsonl"), "--out", str(d / "run")], started_run(data_edit=reversed_data)),
    # the cluster
    Case("train --address nobody answers", "train", lambda s, d: ["--address", f"127.0.0.1:{s.cluster['closed']}"]),
    Case("train --address a dashboard URL", "train", lambda s, d: ["--address", "http://127.0.0.1:8265"]),
    Case("local --address nobody answers", "local", lambda s, d: ["--address", f"127.0.0.1:{s.cluster['closed']}",
                                                                  "--out", str(d / "demo")], base=False),
    Case("submit --address nobody answers", "submit", lambda s, d: ["--address", f"http://127.0.0.1:{s.cluster['closed']}",
                                                                    "--timeout", "3"]),
    Case("train --num-workers 20 on 8 CPUs", "train", lambda s, d: ["--num-workers", "20", "--global-batch-size", "20",
                                                                     "--micro-batch-size", "1"], cluster="gcs"),
    Case("submit --num-workers 20 on 8 CPUs", "submit", lambda s, d: ["--num-workers", "20", "--global-batch-size", "20",
                                                                       "--micro-batch-size", "1"], cluster="dashboard"),
    Case("train --lr 1e30 --max-failures 2 (NaN on the workers)", "train",
         lambda s, d: ["--lr", "1e30", "--log-every", "1", "--steps", "6", "--max-failures", "2", "--no-export"],
         cluster="gcs"),
    Case("status of an unknown run", "status", lambda s, d: ["no-such-run"], base=False, cluster="dashboard"),
    Case("nccl-bench --min-bytes above --max-bytes", "nccl-bench",
         lambda s, d: ["--workers", "2", "--min-bytes", "100", "--max-bytes", "10"], base=False, cluster="dashboard"),
]


# ------------------------------------------------------------------ issue 29: retried, hung, traceback, lost

def bigger_tokenizer(sweep: Sweep, d: Path) -> None:
    from transformers import AutoTokenizer

    folder = copy_model(sweep, d)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_tokens([f"<extra_{i}>" for i in range(json.loads((folder / "config.json").read_text())["vocab_size"])])
    tok.save_pretrained(folder)


def no_eos(path: Path) -> None:
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["eos_token"] = None
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))


def torn_run_record(sweep: Sweep, d: Path) -> None:
    from trainer.run_folder import checkpoint as ckpt

    (d / "run" / ckpt.dir_name(4)).mkdir(parents=True)
    (d / "run" / "run.json").write_text('{"run_name": "run", "inputs": {"settings": {"lr": 0.0')


def both(*setups):
    def setup(sweep: Sweep, d: Path) -> None:
        for one in setups:
            one(sweep, d)
    return setup


C = lambda s, d: ["--config", str(d / "c.yaml")]  # noqa: E731
ALIASES = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)) + "run_name: *i\n"
NO_WANDB = {"WANDB_API_KEY": "", "WANDB_IDENTITY_TOKEN_FILE": "", "WANDB_MODE": "online", "NETRC": "/nonexistent"}
ISSUE_29: list[Case] = [
    # checks moved before Ray (they were retried on the workers)
    Case("--tokenizer with more tokens than the model's vocabulary", "train",
         lambda s, d: ["--tokenizer", str(d / "model")], bigger_tokenizer),
    Case("--seed 2**64", "train", lambda s, d: ["--seed", str(2**64)]),
    Case("--report-to wandb without credentials", "train", lambda s, d: ["--report-to", "wandb"], env=NO_WANDB),
    Case("--report-to wandb with WANDB_MODE=offlien", "train", lambda s, d: ["--report-to", "wandb"],
         env={**NO_WANDB, "WANDB_MODE": "offlien"}),
    # the cluster: a port that answers as something else than Ray
    Case("train --address a web server's port", "train", lambda s, d: ["--address", f"127.0.0.1:{s.cluster['http']}"]),
    # --config
    Case("--config key given twice", "train", C, write("c.yaml", "lr: 1e-5\nlr: 2e-5\n")),
    Case("--config 010 (YAML 1.1 octal)", "train", C, write("c.yaml", "steps: 010\n")),
    Case("--config on (YAML 1.1 boolean)", "train", C, write("c.yaml", "export: on\n")),
    Case("--config nested 10,000 deep", "train", C, write("c.yaml", "a: " + "[" * 10_000 + "]" * 10_000 + "\n")),
    Case("--config alias bomb", "train", C, write("c.yaml", ALIASES)),
    Case("--config byte not UTF-8", "train", C, write("c.yaml", b"lr: 1e-5\nrun_name: caf\xe9\n")),
    Case("--config key with a zero-width space", "train", C, write("c.yaml", "\u200blr: 1e-5\n")),
    Case("--config 1 MB value", "train", C, write("c.yaml", "lr: " + "x" * 1_000_000 + "\n")),
    Case("--config a folder", "train", lambda s, d: ["--config", str(d)]),
    # the data, the tokenizer, the cache
    Case("--dataset record nested 10,000 deep", "train", lambda s, d: [D, str(d / "x.jsonl")],
         write("x.jsonl", jsonl(chat(), chat()) + '{"messages": ' + "[" * 10_000 + "]" * 10_000 + "}\n")),
    Case("--dataset JSON Lines line not JSON (named)", "train", lambda s, d: [D, str(d / "x.jsonl")],
         write("x.jsonl", jsonl(chat()) + "{oops: 1}\n" + jsonl(chat()))),
    Case("--dataset every assistant turn empty", "train", lambda s, d: [D, str(d / "x.jsonl")],
         write("x.jsonl", jsonl(*[chat("hi", " ")] * 20))),
    Case("--tokenizer without EOS, text records", "train", lambda s, d: [D, str(d / "x.jsonl"), "--tokenizer",
                                                                         str(d / "model")],
         both(edit_model(no_eos), write("x.jsonl", jsonl(*[{"text": "some text"}] * 40)))),
    Case("--seq-len 1", "train", lambda s, d: ["--seq-len", "1"]),
    Case("--cache-dir a file", "train", lambda s, d: ["--cache-dir", str(d / "f")], write("f", "x")),
    # the run folder
    Case("resume from a torn run.json", "train", lambda s, d: ["--lr", "0.5"], torn_run_record),
]
CASES += ISSUE_29


# ------------------------------------------------------------------ running

def written(folder: Path, before: set[str]) -> str:
    now = {str(p.relative_to(folder)) for p in folder.rglob("*")}
    new = sorted(now - before)
    tops = sorted({p.split("/", 1)[0] for p in new})
    return "nothing" if not new else f"{len(new)} file(s): {', '.join(tops[:4])}"


def message(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    errors = [i for i, ln in enumerate(lines) if ln.startswith("error:")]
    if errors:
        first = lines[errors[0]]
        detail = lines[errors[0] + 1].strip() if first.endswith("problem(s)):") and errors[0] + 1 < len(lines) else ""
        return (first + (" " + detail if detail else ""))[:200]
    notes = [ln for ln in lines if ln.startswith(("note", "Traceback"))]
    return (notes[0] if notes else (lines[-1] if lines else ""))[:200]


def web_server():
    """A plain HTTP server on a free port (a thread of this process): what a wrong --address often points at."""
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def start_cluster() -> tuple[subprocess.Popen, dict]:
    """A local Ray head of 8 CPUs (no auth), as the test suite's session cluster."""
    import urllib.request

    from tests.trainer.conftest import free_port, ray_start_head

    port, dash = free_port(), free_port()
    temp = tempfile.mkdtemp(prefix="rs-", dir="/tmp")
    log = open(Path(temp) / "ray-start.log", "w")
    proc = subprocess.Popen(ray_start_head(temp, port, dash), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{dash}/api/version", timeout=2)
            break
        except OSError:
            time.sleep(1)
    return proc, {"gcs": f"127.0.0.1:{port}", "dashboard": f"http://127.0.0.1:{dash}", "temp": temp}


def run_case(sweep: Sweep, i: int, case: Case, env: dict) -> dict:
    folder = sweep.root / f"{i:02d}"
    folder.mkdir()
    case.setup(sweep, folder)
    before = {str(p.relative_to(folder)) for p in folder.rglob("*")}
    argv = [*(sweep.base(folder / "run") if case.base else []), *case.argv(sweep, folder)]
    if case.cluster:
        argv += ["--address", sweep.cluster[case.cluster]]
    t0 = time.monotonic()
    env = {k: v for k, v in {**env, **case.env}.items() if v != ""}
    try:
        proc = subprocess.run([sys.executable, "-m", "trainer", case.command, *argv], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=case.timeout)
        code, msg = proc.returncode, message(proc)
        traceback = "Traceback" in proc.stderr and "error:" not in proc.stderr
    except subprocess.TimeoutExpired:
        code, msg, traceback = "timeout", f"no answer within {case.timeout:.0f} s", False
    return {"input": case.name, "command": case.command, "exit": code, "seconds": round(time.monotonic() - t0, 1),
            "message": msg + (" [traceback]" if traceback else ""), "written": written(folder, before)}


def snapshot(folder: Path) -> dict[str, str]:
    """Every file below `folder` by relative path, with its sha256: what a case must leave as it found it."""
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def run_in_process(sweep: Sweep, i: int, case: Case) -> dict:
    """A case through the CLI's main in this process (seconds, for the test suite): exit code, stderr, files."""
    import contextlib
    import io

    from trainer.__main__ import main as trainer

    folder = sweep.root / f"{i:02d}"
    folder.mkdir()
    case.setup(sweep, folder)
    before = snapshot(folder)
    argv = [*(sweep.base(folder / "run") if case.base else []), *case.argv(sweep, folder)]
    saved = {k: os.environ.get(k) for k in case.env}
    err, out = io.StringIO(), io.StringIO()
    try:
        for k, v in case.env.items():
            os.environ.pop(k, None) if v == "" else os.environ.__setitem__(k, v)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = trainer([case.command, *argv])
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return {"exit": code, "stderr": err.getvalue(), "stdout": out.getvalue(), "before": before,
            "after": snapshot(folder)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only the cases whose name contains this")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bad-inputs-"))
    cache = root / "cache"
    env = {**os.environ, "TRAINER_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    os.environ.update(TRAINER_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    from trainer import demo

    assets = root / "assets"
    model = demo.write_init_model(assets / "init-model", seed=0)
    rows, _ = demo.make_dataset(seed=0, n_train=600, n_eval=10)
    data = demo.write_jsonl(rows, assets / "train.jsonl")
    cases = [c for c in CASES if not args.only or args.only in c.name]
    sweep = Sweep(root / "cases", model, data)
    sweep.root.mkdir()
    cluster_proc = None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        sweep.cluster["closed"] = s.getsockname()[1]
    web = web_server()
    sweep.cluster["http"] = web.server_address[1]
    if any(c.cluster for c in cases):
        cluster_proc, info = start_cluster()
        sweep.cluster.update(info)
    rows_out = []
    try:
        for i, case in enumerate(cases, 1):
            row = run_case(sweep, i, case, env)
            rows_out.append(row)
            print(f"{i:2d}. {row['input']}: exit {row['exit']} in {row['seconds']} s", file=sys.stderr, flush=True)
    finally:
        if cluster_proc is not None:
            from tests.trainer.conftest import descendants, pids_using

            victims = set(descendants(cluster_proc.pid)) | set(pids_using(sweep.cluster["temp"]))
            for pid in [cluster_proc.pid, *victims]:
                try:
                    os.killpg(pid, signal.SIGKILL) if pid == cluster_proc.pid else os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            cluster_proc.wait(timeout=30)
    print("| # | input | command | exit | seconds | message (first line) | written |")
    print("|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows_out, 1):
        msg = r["message"].replace("|", "\\|")
        print(f"| {i} | {r['input']} | {r['command']} | {r['exit']} | {r['seconds']} | {msg} | {r['written']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows_out, indent=1))
    bad = [r for r in rows_out if r["exit"] != 2 and "a note" not in r["input"]]
    print(f"\n{len(rows_out)} inputs, {len(rows_out) - len(bad)} ended as promised (exit 2, or the note)", file=sys.stderr)
    shutil.rmtree(root, ignore_errors=True)
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
