"""What the fault-tolerance tests share: one small run configuration, the uninterrupted
reference run (trained once per session), and exact comparisons of trained weights.

Exactness: the interrupted runs use the same seed, world size (2 CPU workers, gloo) and
configuration as the reference. The data order is a pure function of (step, seed), gloo's
reductions are deterministic for a fixed world size, and a checkpoint restores the fp32
parameters, AdamW moments, learning-rate schedule and RNG states bit for bit. So a resumed
run performs the same floating-point operations as an uninterrupted one, and the tests
compare with torch.equal: any tolerance would hide a resume that is off by one step of a
tiny learning rate, or an optimizer state that was not restored.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch

from trainer.config.flags import TrainConfig, flag
from trainer.run_folder import checkpoint as ckpt
from trainer.run_folder.export import EXPORT_DIR
from trainer.storage import Storage

from .conftest import LOCAL_POOL

STEPS = 16
EVERY = 4  # a checkpoint every 4 steps: an interruption after the first one still leaves 12 steps to go


def config(assets: dict, cache: Path, storage_path: str, run_name: str, **changes) -> TrainConfig:
    """The demo's tiny Qwen2 model on 2 CPU workers; a few seconds of training after start-up.

    The workers select the session node's pool (--pool, Ray Train's label selector), so every run
    built from this also shows that a pinned run is placed and trains.
    """
    cfg = TrainConfig(
        model=str(assets["model"]), dataset=str(assets["train"]), seq_len=128, global_batch_size=8,
        micro_batch_size=2, steps=STEPS, lr=3e-3, warmup_steps=2, seed=0, log_every=EVERY,
        checkpoint_every=EVERY, num_to_keep=2, num_workers=2, device="cpu", storage_path=storage_path,
        run_name=run_name, cache_dir=str(cache), progress=False, pool=LOCAL_POOL)
    return dataclasses.replace(cfg, **changes)


def cli_flags(cfg: TrainConfig) -> list[str]:
    """The command-line flags that reproduce `cfg` (those that differ from the defaults)."""
    out: list[str] = []
    for f in dataclasses.fields(TrainConfig):
        value = getattr(cfg, f.name)
        if "flag" not in f.metadata or value == f.default:  # `sources` is a record, not a flag
            continue
        if isinstance(value, bool):
            out.append(flag(f.name) if value else "--no-" + flag(f.name)[2:])
        else:
            out += [flag(f.name), str(value)]
    return out


_reference: dict[str, Path] = {}


def reference_run(assets: dict, cache: Path) -> Path:
    """The uninterrupted run (local storage), trained once per session on the connected Ray cluster."""
    key = str(assets["model"])
    if key not in _reference:
        from trainer.jobs import launch

        root = Path(tempfile.mkdtemp(prefix="ft-reference-", dir=assets["root"]))
        cfg = config(assets, cache, str(root), "reference")
        result = launch.train(cfg, quiet=True)
        assert result.error is None, result.error
        _reference[key] = root / "reference"
    return _reference[key]


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]


def exported_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of an exported Hugging Face folder (one or several safetensors files)."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    assert files, f"no safetensors in {model_dir}"
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def checkpoint_state(folder: Path) -> dict:
    """A sharded DCP checkpoint gathered into one state dict (fp32 model and optimizer), no process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(str(folder), f"{tmp}/state.pt")
        return torch.load(f"{tmp}/state.pt", weights_only=False)


def _flatten(value, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): value}


def assert_identical(actual: dict, expected: dict, what: str) -> None:
    """Same keys, and every tensor bit-identical (torch.equal); names the tensors that differ."""
    a, e = _flatten(actual), _flatten(expected)
    assert sorted(a) == sorted(e), f"{what}: different entries: {sorted(set(a) ^ set(e))[:10]}"
    differ = []
    for name, want in e.items():
        got = a[name]
        if isinstance(want, torch.Tensor):
            if not (got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)):
                gap = (got.double() - want.double()).abs().max().item() if got.shape == want.shape else "shape"
                differ.append(f"{name} (max |diff| {gap})")
        elif got != want:
            differ.append(f"{name} ({got!r} != {want!r})")
    assert not differ, f"{what}: {len(differ)} of {len(e)} entries differ: {differ[:8]}"
    assert any(isinstance(v, torch.Tensor) for v in e.values()), f"{what}: nothing to compare"


def assert_same_training(run: Path, reference: Path, final_checkpoint: Path | None = None) -> None:
    """The exported bf16 weights and the final checkpoint's fp32 model + optimizer state equal the reference's."""
    assert_identical(exported_weights(run / EXPORT_DIR), exported_weights(reference / EXPORT_DIR),
                     "exported weights")
    final = ckpt.dir_name(STEPS)
    assert_identical(checkpoint_state(final_checkpoint or run / final), checkpoint_state(reference / final),
                     f"{final} (fp32 model and optimizer state)")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll until predicate() is truthy; fail naming what was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def complete_steps(run: Path) -> list[int]:
    """Steps of the checkpoints in a local run folder that the trainer would resume from."""
    store = Storage.from_uri(str(run))
    return [ckpt.step_of(n) for n in store.list_dirs() if ckpt.step_of(n) is not None and ckpt.is_complete(store, n)]
