"""A record of every run: run.json in the run folder, and a model card in the exported model folder.

run.json holds what is needed to know, later, what a run was: the resolved configuration,
the library versions, the data (source fingerprint, packed-data key and counts), the
hardware of every attempt. The exported model's README.md is a Hugging Face model card
(YAML metadata that the hub and huggingface_hub read: base_model, datasets, library) with
the hyperparameters, steps, tokens, final loss and hardware, as transformers' Trainer writes one.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from importlib import metadata
from typing import Any, Callable

RUN_RECORD = "run.json"
LIBRARIES = ("torch", "ray", "transformers", "datasets", "tokenizers", "safetensors", "accelerate", "numpy",
             "pyarrow", "trl", "wandb", "mlflow", "mlflow-skinny", "tensorboard")


def versions() -> dict[str, str]:
    """Python and every installed library of LIBRARIES (absent ones are left out)."""
    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def host_info(device) -> dict[str, Any]:
    """This rank's host and device, for the hardware record."""
    import torch

    info: dict[str, Any] = {"host": socket.gethostname(), "cpus": os.cpu_count(), "device": device.type}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    cuda=torch.version.cuda, nccl=".".join(map(str, torch.cuda.nccl.version())))
    return info


def hardware(ranks: list[dict], instance_type: str | None = None) -> dict[str, Any]:
    """Every rank's host_info folded into nodes: {host: {ranks, device, gpu, ...}}."""
    nodes: dict[str, dict] = {}
    for rank, info in enumerate(ranks):
        node = nodes.setdefault(info["host"], {k: v for k, v in info.items() if k != "host"} | {"ranks": []})
        node["ranks"].append(rank)
    return {"world_size": len(ranks), "nodes": len(nodes), "instance_type": instance_type, "by_node": nodes}


def run_record(cfg, *, data_meta: dict, data_key: str, hw: dict, previous: dict | None, start_step: int,
               total_steps: int, extra: dict | None = None, inputs: dict | None = None,
               memory_plan: dict | None = None) -> dict:
    """run.json's content: this attempt appended to the attempts of `previous` (the file as it was).

    `inputs` (trainer.run_folder.resume) are what a later resume is compared with: the driver's, else the previous ones;
    `memory_plan` (the pre-flight's prediction, trainer.jobs.plan.run_prediction) starts `memory`, where record_memory
    adds the measured peak.
    """
    attempt = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "start_step": start_step, "hardware": hw,
               "versions": versions(), **(extra or {})}
    data = {k: data_meta.get(k) for k in ("source", "config", "split", "train_on", "records", "documents",
                                          "dropped", "drop_reasons", "truncated", "rows", "seq_len", "tokens",
                                          "trained_tokens", "real_tokens", "loss_tokens", "fill",
                                          "too_long", "longest_tokens", "longest_record", "overlong",
                                          "source_fingerprint")}
    return {"run_name": cfg.resolved_run_name, "config": cfg.to_dict(), "total_steps": total_steps,
            "inputs": inputs if inputs is not None else (previous or {}).get("inputs"),
            "data": {**data, "packed_data_key": data_key}, "hardware": hw, "versions": attempt["versions"],
            "memory": {"plan": memory_plan, "measured": None, "measured_over_plan": None},
            "attempts": [*(previous or {}).get("attempts", []), attempt]}


def read_previous(read_text: Callable[[], str]) -> dict | None:
    try:
        value = json.loads(read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def model_card(record: dict, final: dict, steps: int, tokens: int) -> str:
    """README.md of the exported model: Hugging Face card metadata plus what was trained and how."""
    from huggingface_hub import ModelCard, ModelCardData

    cfg = record["config"]
    data = record["data"]
    hub_dataset = (data.get("source_fingerprint") or {}).get("kind") == "hub"
    card_data = ModelCardData(base_model=cfg["model"] if "/" in cfg["model"] and not os.path.isabs(cfg["model"])
                              else None, datasets=[cfg["dataset"]] if hub_dataset else None,
                              library_name="transformers", pipeline_tag="text-generation",
                              tags=["raytrain-eks", "fsdp2", "ray-train", "sft"])
    hw = record["hardware"]
    first_node = next(iter(hw["by_node"].values()), {})
    device = first_node.get("gpu") or first_node.get("device", "cpu")
    hyper = {"learning rate": cfg["lr"], "schedule": f"{cfg['schedule']} (final {cfg['min_lr_ratio']} x lr)",
             "warm-up": f"{cfg['warmup_steps']} steps" if cfg["warmup_steps"] else f"{cfg['warmup_ratio']} of the run",
             "global batch": f"{cfg['global_batch_size']} sequences of {cfg['seq_len']} tokens (packed)",
             "micro-batch": cfg["micro_batch_size"], "weight decay": cfg["weight_decay"],
             "gradient clipping": cfg["grad_clip"], "seed": cfg["seed"], "trained tokens": cfg["train_on"],
             "optimizer": f"AdamW (betas {cfg['adam_beta1']}, {cfg['adam_beta2']}; epsilon {cfg['adam_epsilon']})",
             "sharding": cfg["sharding"]}
    loss = final.get("loss")
    body = "\n".join([
        f"# {record['run_name']}", "",
        f"Full fine-tune of `{cfg['model']}` with PyTorch FSDP2 under Ray Train (raytrain-eks).", "",
        "## Training data", "",
        f"- dataset: `{cfg['dataset']}`" + (f" (config `{data.get('config')}`)" if data.get("config") else "")
        + f", split `{data.get('split')}`",
        f"- records: {data.get('records')}, packed into {data.get('rows')} rows of {data.get('seq_len')} tokens "
        f"({(data.get('fill') or 0):.1%} full); {data.get('dropped')} dropped, {data.get('truncated')} truncated",
        f"- data fingerprint: `{data.get('packed_data_key')}`", "",
        "## Training", "",
        f"- steps: {steps}, tokens: {tokens:,}",
        f"- final loss: {loss:.4f}" if isinstance(loss, (int, float)) else "- final loss: n/a",
        *([f"- exported: the best checkpoint by eval loss, step {best['step']} (eval loss {best['eval_loss']:.4f})"]
          if (best := final.get("best_checkpoint")) else []),
        *[f"- {k}: {v}" for k, v in hyper.items()], "",
        "## Hardware", "",
        f"- {hw['world_size']} worker(s) on {hw['nodes']} node(s): {device}"
        + (f", {hw['instance_type']}" if hw.get("instance_type") else ""), "",
        "## Versions", "",
        *[f"- {k}: {v}" for k, v in record["versions"].items()], "",
    ])
    return str(ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n{body}"))


def write_run_record(storage, cfg, *, device, rank: int, world_size: int, data_meta: dict, data_key: str,
                     start_step: int, total_steps: int, inputs: dict | None = None,
                     memory_plan: dict | None = None) -> dict | None:
    """Collective: every rank's host and device gathered; rank 0 writes run.json and returns the record."""
    import torch.distributed as dist

    info = host_info(device)
    ranks: list = [info]
    if dist.is_available() and dist.is_initialized() and world_size > 1:
        ranks = [None] * world_size
        dist.all_gather_object(ranks, info)
    if rank != 0:
        return None
    previous = read_previous(lambda: storage.read_text(RUN_RECORD)) if storage.exists(RUN_RECORD) else None
    record = run_record(cfg, data_meta=data_meta, data_key=data_key, hw=hardware(ranks, cfg.instance_type),
                        previous=previous, start_step=start_step, total_steps=total_steps, inputs=inputs,
                        memory_plan=memory_plan)
    storage.write_text(json.dumps(record, indent=1, default=str), RUN_RECORD)
    return record


def record_best(storage, record: dict | None, best: dict | None) -> None:
    """Rank 0: the checkpoint kept as the best by eval loss (--keep-best), the one exported, into run.json."""
    if record is None:
        return
    record["best_checkpoint"] = best
    storage.write_text(json.dumps(record, indent=1, default=str), RUN_RECORD)


def record_eval(storage, record: dict | None, results: list[dict]) -> None:
    """Rank 0: the eval losses so far (step, eval_loss, eval_tokens) and the best one into run.json."""
    if record is None or not results:
        return
    record["eval"] = {"history": results, "last": results[-1], "best": min(results, key=lambda r: r["eval_loss"])}
    storage.write_text(json.dumps(record, indent=1, default=str), RUN_RECORD)


def memory_entry(plan: dict | None, measured: dict | None, step: int, peak_gib: float, device: str) -> dict:
    """run.json's `measured` after a logging step: the highest peak so far (rank 0's, the fullest rank the plan
    counts), where it was reached, and its ratio to the plan's GiB per GPU (on a GPU; a CPU's peak is the
    process's resident set, not the plan's bf16 device memory)."""
    if measured is None or peak_gib > measured["peak_gib"]:
        measured = {"peak_gib": peak_gib, "step": step,
                    "kind": "cuda_max_allocated" if device == "cuda" else "host_max_rss_process"}
    total = (plan or {}).get("gib_per_gpu")
    return {"plan": plan, "measured": measured,
            "measured_over_plan": round(measured["peak_gib"] / total, 3) if total else None}


def record_memory(storage, record: dict | None, step: int, peak_gib: float, device: str) -> None:
    """Rank 0: the measured peak beside the plan's prediction into run.json, when it rose (or first)."""
    if record is None:
        return
    memory = record.get("memory") or {}
    entry = memory_entry(memory.get("plan"), memory.get("measured"), step, peak_gib, device)
    if entry != memory:
        record["memory"] = entry
        storage.write_text(json.dumps(record, indent=1, default=str), RUN_RECORD)
