"""`python -m trainer.bench data`: how fast the training data is prepared, and in how much memory, per path.

Generates a deterministic chat dataset of --records records (~860 tokens each with the tokenizer:
the project's demo tokenizer, or --tokenizer FOLDER) as JSON Lines in a temporary folder, then
prepares it (tokenize, mask, pack, write) on each path, each in a fresh process so that its peak
RSS is its own (the kernel's ru_maxrss of that process; the Ray path's workers report theirs):

    single   trainer.data.packing.prepare, one process, one core (what `trainer data` does)
    ray      trainer.data.distributed.prepare_on_ray with 1 and 2 CPU workers (--workers) on a local Ray
             cluster (or --address): what every run on a cluster does

One JSON line per path and worker count (path, workers, records, tokens, seconds, records_per_s,
tokens_per_s, peak_rss_bytes, disk_bytes), the same again at a quarter of the records when that
is at least MIN_RECORDS (memory flat in N?), then a summary: the 2-vs-1 worker throughput ratio,
the peak RSS at N against N/4, and each path extrapolated to 10M records on the cluster's CPUs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from facts.errors import UserError
from trainer.bench import DATA_WORKER as WORKER

MIN_RECORDS = 100       # the N/4 run of the memory check needs at least this many records
TARGET_TOKENS = 860     # per record: the measured chat records
EXTRAPOLATED_RECORDS = 10_000_000
_WORDS = ("the model data train token batch row answer question explain how why when where which value table "
          "result figure number example step first second next then because result system user assistant write "
          "code function return list string error check file folder memory disk time cost price node cluster "
          "worker process thread queue order sort search merge split join read save load open close start stop "
          "small large fast slow simple clear short long early late more less every each some many few other same "
          "different important possible likely usually often always never please thanks sure here there").split()


def emit(record: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps(record), flush=True)
    return record


def load_tokenizer(folder: str):
    """trainer.model.sources.load_tokenizer's tokenizer without importing torch (the fresh process's start-up)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


class DataBenchError(UserError):
    """A bad option of the data benchmark (exit 2)."""


def chat_records(n: int, *, words_per_record: int, seed: int = 0) -> list[dict]:
    """`n` deterministic chat records (a system prompt, one to three user/assistant turns) of about
    `words_per_record` words on average, log-normally spread (sigma 0.5) as real chat sets are."""
    import numpy as np

    rng = np.random.default_rng(seed)
    vocab = np.array(_WORDS)
    out = []
    for size in rng.lognormal(math.log(words_per_record) - 0.5 ** 2 / 2, 0.5, n):  # its mean: words_per_record
        turns = int(rng.integers(1, 4))
        words = max(4 * turns, int(size))
        shares = rng.dirichlet(np.ones(2 * turns)) * words
        messages = [{"role": "system", "content": "You are a helpful assistant."}]
        for i, share in enumerate(shares):
            text = " ".join(vocab[rng.integers(0, len(vocab), max(1, int(share)))])
            messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text.capitalize() + "."})
        out.append({"messages": messages})
    return out


def words_for(tokenizer, tokens: int = TARGET_TOKENS, seed: int = 0) -> int:
    """Words per record that give `tokens` tokens on average with this tokenizer's chat template (measured on a
    pilot of 64 records)."""
    pilot = chat_records(64, words_per_record=100, seed=seed + 1)

    def tokens_of(messages: list[dict]) -> int:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    counts = [tokens_of(r["messages"]) for r in pilot]
    words = sum(len(m["content"].split()) for r in pilot for m in r["messages"][1:])
    fixed = sum(tokens_of(r["messages"][:1]) for r in pilot)
    per_word = (sum(counts) - fixed) / words
    return max(8, round((tokens - fixed / len(pilot)) / per_word))


def write_dataset(folder: Path, records: int, tokenizer, seed: int = 0) -> Path:
    """The chat dataset as JSON Lines in `folder` (written once per size and seed)."""
    path = folder / f"chat-{records}-{seed}.jsonl"
    if not path.is_file():
        rows = chat_records(records, words_per_record=words_for(tokenizer, seed=seed), seed=seed)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        tmp.rename(path)
    return path


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def _single(job: dict) -> dict:
    from trainer.data.packing import DataSpec, prepare

    tokenizer = load_tokenizer(job["tokenizer"])
    t0 = time.perf_counter()
    packed = prepare(DataSpec(job["dataset"]), tokenizer=tokenizer, seq_len=job["seq_len"], cache_dir=job["cache"])
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "records": packed.meta["records"], "tokens": packed.meta["tokens"],
            "rows": packed.meta["rows"], "disk_bytes": folder_bytes(packed.folder), "folder": str(packed.folder)}


def prepare_on_ray_path(dataset: str, tokenizer_dir: str, seq_len: int, workers: int, storage_dir: str,
                        cache_dir: str) -> dict:
    """The Ray path, timed: trainer.data.distributed.prepare_on_ray(...) on the connected Ray cluster; its meta's
    `prep` (workers, chunks, seconds, peak_rss_bytes, disk_bytes) is what the line reports."""
    from trainer.data.distributed import prepare_on_ray
    from trainer.data.packing import DataSpec
    from trainer.storage import Storage

    tokenizer = load_tokenizer(tokenizer_dir)
    t0 = time.perf_counter()
    meta = prepare_on_ray(DataSpec(dataset), tokenizer, seq_len, Storage.from_uri(storage_dir), cache_dir,
                          workers=workers)
    seconds = time.perf_counter() - t0
    prep = meta.get("prep") or {}
    return {"seconds": prep.get("seconds", seconds), "wall_seconds": seconds, "records": meta["records"],
            "tokens": meta["tokens"], "rows": meta["rows"],
            "disk_bytes": prep.get("disk_bytes") or folder_bytes(Path(storage_dir)),
            "worker_peak_rss_bytes": prep.get("peak_rss_bytes"), "chunks": prep.get("chunks"),
            "workers": prep.get("workers", workers)}


def _ray(job: dict) -> dict:
    import ray

    ray.init(address=job["address"], num_cpus=None if job["address"] else job["workers"], logging_level="ERROR",
             include_dashboard=False)
    try:
        found = prepare_on_ray_path(job["dataset"], job["tokenizer"], job["seq_len"], job["workers"],
                                    job["storage"], job["cache"])
        if job["address"]:  # a local cluster has the CPUs it was given; a real one tells its own
            found["cluster_cpus"] = int(ray.cluster_resources().get("CPU", 0))
        return found
    finally:
        ray.shutdown()


def worker_main(argv: Sequence[str]) -> int:
    """One preparation (`single` or `ray`) in this fresh process; prints its JSON result as the last line, with
    the process's peak RSS (the kernel's ru_maxrss: KiB on Linux)."""
    import resource

    job = json.loads(argv[0])
    found = {"single": _single, "ray": _ray}[job["path"]](job)
    found["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(found), flush=True)
    return 0


def run_fresh(job: dict) -> dict:
    """`job` in a fresh interpreter: its result, with its own peak RSS."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "trainer.bench", WORKER, json.dumps(job)], capture_output=True,
                          text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"the {job['path']} preparation failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-1500:]}")
    return json.loads(lines[-1])


def line(path: str, workers: int, found: dict) -> dict[str, Any]:
    """The JSON line of one run: rates from its own records, tokens and seconds."""
    seconds = found["seconds"]
    return {"path": path, "workers": workers, "records": found["records"], "tokens": found["tokens"],
            "rows": found["rows"], "seconds": round(seconds, 3),
            "records_per_s": round(found["records"] / seconds, 1), "tokens_per_s": round(found["tokens"] / seconds, 1),
            "seconds_per_token_per_core": seconds * workers / max(found["tokens"], 1),
            "peak_rss_bytes": found["peak_rss_bytes"], "disk_bytes": found["disk_bytes"],
            **({"worker_peak_rss_bytes": found["worker_peak_rss_bytes"]} if "worker_peak_rss_bytes" in found else {}),
            **({"chunks": found["chunks"]} if found.get("chunks") is not None else {})}


def summary(lines: list[dict], quarter: list[dict], cpus: int) -> dict[str, Any]:
    """The 2-vs-1 worker ratio of the Ray path, the peak RSS at N against N/4 per path, and each path at 10M
    records on `cpus` CPUs (the single path stays on one)."""
    by = {(r["path"], r["workers"]): r for r in lines}
    one, two = by.get(("ray", 1)), by.get(("ray", 2))
    flat = {}
    for small in quarter:
        big = by.get((small["path"], small["workers"]))
        if big:
            rss = "worker_peak_rss_bytes" if big.get("worker_peak_rss_bytes") else "peak_rss_bytes"
            flat[f"{small['path']}-{small['workers']}"] = {
                "records": [small["records"], big["records"]], "peak_rss_bytes": [small[rss], big[rss]],
                "ratio": round(big[rss] / small[rss], 3), "flat": big[rss] <= 1.25 * small[rss]}
    extrapolated = {}
    for r in lines:
        cores = 1 if r["path"] == "single" else cpus
        per_core = r["records_per_s"] / r["workers"]
        extrapolated[f"{r['path']}-{r['workers']}"] = {
            "cpus": cores, "seconds": round(EXTRAPOLATED_RECORDS / (per_core * cores)),
            "disk_bytes": round(r["disk_bytes"] * EXTRAPOLATED_RECORDS / r["records"])}
    return {"path": "summary", "ray_2_vs_1_workers": round(two["tokens_per_s"] / one["tokens_per_s"], 3)
            if one and two else None, "peak_rss_n_vs_quarter": flat, "cluster_cpus": cpus,
            "extrapolated_records": EXTRAPOLATED_RECORDS, "extrapolated": extrapolated}


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.bench data",
                                description="Records/s, tokens/s, peak RSS and disk of preparing a chat dataset, "
                                            "single process against the Ray path.")
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the demo's, saved to the folder)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--paths", default="single,ray", help="single and/or ray")
    p.add_argument("--workers", default="1,2", help="CPU workers of the Ray path")
    p.add_argument("--address", default=None, help="Ray cluster (default: start a local one per run)")
    p.add_argument("--cpus", type=int, default=None,
                   help="CPUs the 10M-record extrapolation spreads over (default: the Ray cluster's, else this "
                        "machine's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="folder for the dataset and the prepared data (default: a temporary "
                                               "one)")
    args = p.parse_args(list(argv))
    paths = args.paths.split(",")
    workers = [int(w) for w in args.workers.split(",") if w]
    if args.records < 1 or args.seq_len < 2 or not workers or min(workers) < 1:
        raise DataBenchError("--records, --seq-len and --workers must be positive")
    unknown = sorted(set(paths) - {"single", "ray"})
    if unknown:
        raise DataBenchError(f"--paths: unknown {', '.join(unknown)}; use single and/or ray")
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-data-")).absolute()
    root.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = args.tokenizer or str(_demo_tokenizer(root / "tokenizer"))
    tokenizer = load_tokenizer(tokenizer_dir)
    sizes = [args.records] + ([args.records // 4] if args.records // 4 >= MIN_RECORDS else [])
    runs = [(path, w) for path in paths for w in ([1] if path == "single" else workers)]
    lines, quarter, cpus, failed = [], [], args.cpus, 0
    for n in sizes if runs else ():
        dataset = write_dataset(root, n, tokenizer, args.seed)
        for path, w in runs:
            tag = f"{path}-{w}-{n}"
            job = {"path": path, "dataset": str(dataset), "tokenizer": tokenizer_dir, "seq_len": args.seq_len,
                   "workers": w, "address": args.address, "cache": str(root / "cache" / tag),
                   "storage": str(root / "storage" / tag)}
            try:
                found = run_fresh(job)
            except RuntimeError as e:
                emit({"path": path, "workers": w, "records": n, "error": str(e)})
                failed += 1
                continue
            cpus = cpus or found.get("cluster_cpus")
            (lines if n == args.records else quarter).append(emit(line(path, w, found)))
    if lines:
        emit(summary(lines, quarter, cpus or os.cpu_count() or 1))
    return 1 if failed else 0


def _demo_tokenizer(folder: Path) -> Path:
    from trainer import demo

    if not (folder / "tokenizer_config.json").is_file():
        demo.build_tokenizer().save_pretrained(folder)
    return folder
