"""Tokenizing and masking per core: µs per token of generated chat records, before and after.

    python -m trainer.bench tokenize [--records 2000] [--tokens 860] [--tokenizer FOLDER] [--chat-template FILE]
                                     [--before FILE] [--train-on completion] [--repeat 3] [--threads]

Records: a system prompt and two user/assistant turns of seeded random words, about --tokens
tokens each. The tokenizer is FOLDER (anything AutoTokenizer loads offline) or the demo's character
tokenizer; the template is --chat-template FILE, else the tokenizer's own, else Qwen2's ChatML one
(no {% generation %} markers).
Paths, one JSON line each: `before` is Renderer.encode per record of another formats.py (--before
FILE; by default main's, read with git, when it differs from this one), `encode` is this one's per
record, `batched` is packing.tokenize (Renderer.encode_batch). Each line says whether its ids and
masks are identical to the first path's. One core unless --threads (the Rust tokenizer's batch path
then spreads over the cores, and its CPU time is the sum over them). µs per token are of the process's
CPU time, which other programs on the machine barely change; wall times are shown too. Numbers to
read, not to assert: the best of --repeat interleaved runs.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from facts.errors import UserError

# Qwen2-7B-Instruct's template: ChatML, a default system prompt, no {% generation %} markers
QWEN2_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                  "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
                  "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
                  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
_WORDS = ("the model data token train batch rank node shard cluster memory python rust fast slow record mask "
          "assistant user system turn answer question because where which number value result error check "
          "prepare render template offset span vector loop core time").split()


def chat_records(n: int, words: int, seed: int = 0) -> list[dict]:
    """n conversations (system, user, assistant, user, assistant) of about `words` words in all."""
    rng = random.Random(seed)

    def text(k: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(max(1, k))).capitalize() + "."

    shares = (0.05, 0.15, 0.3, 0.15, 0.35)
    roles = ("system", "user", "assistant", "user", "assistant")
    return [{"messages": [{"role": r, "content": text(int(words * s * rng.uniform(0.7, 1.3)))}
                          for r, s in zip(roles, shares, strict=True)]} for _ in range(n)]


def _tokenizer(folder: str | None, template: str | None = None):
    if folder is None:
        from trainer import demo

        tok = demo.build_tokenizer()
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(folder)
    if template is not None:
        tok.chat_template = template
    elif not getattr(tok, "chat_template", None):
        tok.chat_template = QWEN2_TEMPLATE
    return tok


def _main_formats(repo: Path) -> Path | None:
    """main's trainer/data/formats.py in a temp file, when git has one that differs from this tree's."""
    try:
        text = subprocess.run(["git", "-C", str(repo), "show", "main:trainer/data/formats.py"], check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    if text == (repo / "trainer" / "data" / "formats.py").read_text():
        return None
    path = Path(tempfile.mkdtemp(prefix="formats-before-")) / "formats_before.py"
    path.write_text(text)
    return path


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"_formats_before_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _timed(run) -> tuple[list, float, float]:
    """The run's (ids, mask) as arrays, as packing keeps them (so no path pays for another's garbage), its
    process CPU seconds (every thread: the cost per core, whatever else the machine runs) and wall seconds."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    out = [(np.asarray(ids, np.int32), np.asarray(mask, bool)) for ids, mask in run()]
    return out, time.process_time() - cpu, time.perf_counter() - wall


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) and np.array_equal(m, n) for (x, m), (y, n) in zip(a, b, strict=False))


def measure(records: list[dict], tok, before: Path | None = None, train_on: str = "completion",
            repeat: int = 3) -> list[dict]:
    """One line per path: its best of `repeat` interleaved runs (CPU and wall seconds, µs of CPU per token,
    records per CPU second) and whether its ids and masks are identical to the first path's."""
    from trainer.data import formats, packing

    where = "dataset 'bench' record "
    paths = []
    if before is not None:
        old = _load(before)
        renderer = old.Renderer(tok, train_on)
        paths.append(("before", lambda: (renderer.encode(old.to_example(r, f"{where}{i}"))
                                         for i, r in enumerate(records))))
    new = formats.Renderer(tok, train_on)
    paths.append(("encode", lambda: (new.encode(formats.to_example(r, f"{where}{i}")) for i, r in enumerate(records))))
    batched = formats.Renderer(tok, train_on)
    paths.append(("batched", lambda: packing.tokenize(records, batched, "bench")))
    for _, run in paths:
        for _ in zip(run(), range(20), strict=False):  # warm: templates compiled, probes asked
            pass
    best: dict[str, tuple[float, float]] = {}
    outputs: dict[str, list] = {}
    for _ in range(max(1, repeat)):
        for name, run in paths:
            outputs[name], cpu, wall = _timed(run)
            best[name] = min((cpu, wall), best.get(name, (cpu, wall)))
    reference = outputs[paths[0][0]]
    lines = []
    for name, _ in paths:
        tokens = sum(len(ids) for ids, _ in outputs[name])
        cpu, wall = best[name]
        lines.append({"path": name, "records": len(outputs[name]), "tokens": tokens, "cpu_s": round(cpu, 3),
                      "wall_s": round(wall, 3), "us_per_token": round(cpu / tokens * 1e6, 3),
                      "wall_us_per_token": round(wall / tokens * 1e6, 3),
                      "records_per_cpu_s": round(len(outputs[name]) / cpu, 1),
                      "identical": _same(outputs[name], reference)})
    return lines

def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.bench tokenize", description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=2000)
    p.add_argument("--tokens", type=int, default=860, help="about this many tokens per record")
    p.add_argument("--tokenizer", help="a tokenizer folder (default: the demo's character tokenizer)")
    p.add_argument("--chat-template", help="a Jinja file to render the records with instead")
    p.add_argument("--before", help="another formats.py to time as `before` (default: main's, from git)")
    p.add_argument("--train-on", default="completion", choices=("completion", "completion_only", "all"))
    p.add_argument("--repeat", type=int, default=3, help="runs of each path, interleaved; the best is shown")
    p.add_argument("--threads", action="store_true",
                   help="let the tokenizer use its Rust threads (default: one core, TOKENIZERS_PARALLELISM=false)")
    args = p.parse_args(argv)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if args.threads else "false"
    if args.records < 1 or args.tokens < 20:
        raise UserError(f"--records must be >= 1 and --tokens >= 20, got {args.records} and {args.tokens}")
    template = Path(args.chat_template).read_text() if args.chat_template else None
    tok = _tokenizer(args.tokenizer, template)
    sample = chat_records(1, 1000)[0]["messages"]
    per_word = len(tok.apply_chat_template(sample, tokenize=True, return_dict=True)["input_ids"]) / 1000
    records = chat_records(args.records, int(args.tokens / per_word))
    before = Path(args.before) if args.before else _main_formats(Path(__file__).resolve().parents[2])
    print(json.dumps({"tokenizer": args.tokenizer or "demo (characters)", "vocab": len(tok),
                      "tokenizer_threads": args.threads, "train_on": args.train_on,
                      "template": args.chat_template or ("qwen2" if tok.chat_template == QWEN2_TEMPLATE else "own"),
                      "before": str(before) if before else None}), flush=True)
    for line in measure(records, tok, before, args.train_on, args.repeat):
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
