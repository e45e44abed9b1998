"""The Hugging Face export at the end of a run: full bf16 weights in safetensors, config, tokenizer, card.

Beside the checkpoints (trainer.run_folder.checkpoint) in the run folder, under `model/`: a folder
`from_pretrained` loads as it is, in the checkpoint's own key layout as save_pretrained writes it.
With LoRA (--method lora) `model/` holds the adapters merged into the base (peft's merge_and_unload,
in fp32, then bf16) and `adapter/` the adapters themselves (fp32), which peft loads onto the base. With QLoRA
the base merged into is the one that trained: the NF4 weights dequantized (trainer.model.quantize).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.model import adapters, quantize
from trainer.storage import Storage

EXPORT_DIR = "model"
ADAPTER_DIR = "adapter"  # --method lora: the adapters as peft writes them (PeftModel.from_pretrained)


def export_hf(storage: Storage, model, tokenizer, source: str | Path | None = None, name: str = EXPORT_DIR,
              card: str | None = None, eos_token: str | None = None, lora: dict | None = None) -> str:
    """Collective: gather full weights to rank 0 and write a Hugging Face folder (bf16 safetensors),
    with `card` (rank 0's model card text) as its README.md; `eos_token`: the --eos-token the tokenizer was given;
    with `lora` (apply_lora's arguments) merged, and the adapter folder beside it."""
    from transformers.core_model_loading import revert_weight_conversion

    rank = dist.get_rank() if dist.is_initialized() else 0
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is embed.weight
    tied_keys = set(getattr(model, "all_tied_weights_keys", None) or {"lm_head.weight"}) if tied else set()
    full: dict[str, torch.Tensor] = {}
    nf4 = quantize.dequantized(model) if any(quantize.is_nf4(p) for p in model.parameters()) else {}
    for key, value in model.state_dict().items():
        tensor = nf4.pop(key) if key in nf4 else value.full_tensor() if hasattr(value, "full_tensor") else value
        if rank == 0 and key not in tied_keys:  # adapted weights stay fp32 until merged
            full[key] = tensor.detach().to("cpu", torch.float32 if lora and (
                ".lora_" in key or ".base_layer." in key) else torch.bfloat16).contiguous()
        del tensor
    if rank == 0:
        tmp = Path(tempfile.mkdtemp(prefix="export-"))
        try:
            if lora:
                _export_adapter(storage, full, lora, source)
                full = {k: v.to(torch.bfloat16) for k, v in adapters.merged(full, adapters.scaling(lora)).items()}
            # the checkpoint's own key layout, as save_pretrained writes it (per-expert MoE keys, not the fused ones)
            full = {k: v.contiguous() for k, v in revert_weight_conversion(model, full).items()}
            save_safetensors(full, tmp)
            config = model.config
            config.use_cache = True
            config.dtype = torch.bfloat16
            config.save_pretrained(tmp)
            _save_generation_config(tmp, config, tokenizer, source, eos_token)
            tokenizer.save_pretrained(tmp)
            if card:
                (tmp / "README.md").write_text(card)
            if storage.exists(name):
                storage.delete_dir(name)
            storage.upload_dir(tmp, name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    return storage.path(name)



def _save_generation_config(tmp: Path, config, tokenizer, source, eos_token: str | None) -> None:
    """The source's generation config (or one from the model config) that stops on the tokenizer's EOS."""
    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(str(source))
    except Exception:  # noqa: BLE001 - the source model has no generation config
        gen = GenerationConfig.from_model_config(config)
    if tokenizer.eos_token_id is not None and gen.eos_token_id is None:
        gen.eos_token_id = tokenizer.eos_token_id
    if eos_token:  # --eos-token (TRL's eos_token): the model stops on it, as TRL's SFTTrainer sets it
        config.get_text_config().eos_token_id = tokenizer.eos_token_id
        ids = [gen.eos_token_id] if isinstance(gen.eos_token_id, int) else list(gen.eos_token_id or [])
        if tokenizer.eos_token_id not in ids:
            gen.eos_token_id = [tokenizer.eos_token_id, *ids]
        config.save_pretrained(tmp)
    if gen.pad_token_id is None and tokenizer.pad_token_id is not None:
        gen.pad_token_id = tokenizer.pad_token_id
    gen.save_pretrained(tmp)

def _export_adapter(storage: Storage, full: dict[str, torch.Tensor], lora: dict, source) -> None:
    """adapter_config.json and adapter_model.safetensors as peft's save_pretrained writes them."""
    from safetensors.torch import save_file

    state = adapters.peft_state(full)
    targets = sorted({k.split(".lora_")[0].rsplit(".", 1)[-1] for k in state})
    tmp = Path(tempfile.mkdtemp(prefix="adapter-"))
    try:
        adapters.peft_config(lora, targets, str(source) if source else None).save_pretrained(str(tmp))
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "adapter_model.safetensors"),
                  metadata={"format": "pt"})
        if storage.exists(ADAPTER_DIR):
            storage.delete_dir(ADAPTER_DIR)
        storage.upload_dir(tmp, ADAPTER_DIR)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def save_safetensors(state: dict[str, torch.Tensor], folder: Path, max_shard_size: str = "5GB") -> None:
    """model.safetensors, or shards plus model.safetensors.index.json, as save_pretrained writes them."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    split = split_torch_state_dict_into_shards(state, max_shard_size=max_shard_size)
    for filename, names in split.filename_to_tensors.items():
        save_file({n: state[n] for n in names}, str(folder / filename), metadata={"format": "pt"})
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
