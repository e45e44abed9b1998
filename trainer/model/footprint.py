"""Bytes per GPU of a fine-tune, from the model's own tensors built on the meta device: the memory plan's arithmetic.

Parameters, gradients and optimizer states are exact. FSDP2 (trainer.model.sharding) shards every
parameter on its first dimension in torch.chunk's pieces and pads every rank's piece to the first
one, so each rank allocates ceil(rows / ranks) x the other dimensions of each parameter. Per
parameter, by method (bf16 compute, fp32 gradient reduction, AdamW):

- full: fp32 weights 4 B + fp32 gradients 4 B + two fp32 moments 8 B = 16 B;
- lora: the frozen base in bf16 (2 B), the adapters (peft's A: rank x in, B: out x rank on each
  targeted linear of the decoder layers) at 16 B;
- qlora: the decoder layers' linear weights in torchao's NF4 layout (4 bits, an int8 scale per 64
  weights, a bf16 factor per 256 scales: ~0.516 B), everything else of the base in bf16, adapters as lora.

Activations and the transient buffers are an estimate (nothing allocates them before a step): the
largest of four moments of a step (end of forward, the loss, a layer's backward, the embedding's
backward), each the sum of what is alive then: the saved activations (each layer's input with
activation checkpointing, else every layer's activations), the gathered bf16 groups (the current and
the prefetched one), a group's unsharded gradients in bf16 and fp32 for the reduce-scatter, and the
chunked loss's logits (trainer.model.losses). With FSDP2's CPU offload (--offload cpu) the parameters,
gradients and optimizer states are host memory instead (pinned, per rank), and the GPU holds, beside the
rest, the host-to-device copies of the current and the prefetched group's shards. Imports torch and
transformers lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.model.losses import DEFAULT_CHUNK_BYTES
from trainer.model.parts import model_parts

METHODS = ("full", "lora", "qlora")
COMPUTE_BYTES = 2        # bf16 parameters in forward/backward (MixedPrecisionPolicy.param_dtype)
MASTER_BYTES = 4         # fp32 trained weights
REDUCE_BYTES = 4         # fp32 gradients (MixedPrecisionPolicy.reduce_dtype)
ADAM_BYTES = 8           # AdamW's two fp32 moments
NF4_BLOCK = 64           # torchao to_nf4 defaults: weights per int8 scale
NF4_SCALER_BLOCK = 256   # scales per bf16 quantization factor
NF4_PER_TENSOR = 2 + 16 * 2  # bf16 scaler mean, the 16 bf16 NF4 code values: on every rank, whole
DEFAULT_LORA_RANK = 16   # peft's LoraConfig.r is 8; TRL's ModelConfig.lora_r is 16
BUDGET = 0.9             # of a GPU's memory a plan may fill: what the micro-batch probe allows itself (trainer.loop.memory)
HOST_BUDGET = 0.8        # of the worker pod's memory limit offloaded states may fill: the rest for processes, Ray, cache
GIB = 2 ** 30


def shard_rows(rows: int, ranks: int) -> int:
    """Rows of a parameter's first dimension on rank 0, the largest piece (torch.chunk, FSDP2's padding)."""
    return -(-rows // ranks)


def nf4_bytes(numel: int) -> float:
    """Bytes of a bf16 weight (or a rank's shard of it) in torchao's NF4 layout: packed 4-bit codes, an int8
    scale per block, a bf16 factor per block of scales, and per tensor a bf16 mean and the 16 bf16 code values."""
    return numel / 2 + numel / NF4_BLOCK + 2 * numel / (NF4_BLOCK * NF4_SCALER_BLOCK) + NF4_PER_TENSOR


@dataclass(frozen=True)
class Param:
    """One parameter of the model (a tied weight once): its shape split as FSDP2 shards it."""

    rows: int
    rest: int            # product of the other dimensions
    group: int           # FSDP2 group: a decoder layer's index, EMBED or HEAD
    linear: bool         # the weight of an nn.Linear inside a decoder layer (LoRA's and NF4's target)
    name: str            # the module's last name (q_proj, ...), for the target modules

    @property
    def numel(self) -> int:
        return self.rows * self.rest

    def shard(self, ranks: int) -> int:
        return shard_rows(self.rows, ranks) * self.rest


EMBED, HEAD = -1, -2  # the groups outside the decoder layers (one group, EMBED, when the head is tied)


@dataclass(frozen=True)
class Census:
    """A model's parameters and the shape its activations are estimated from."""

    params: tuple[Param, ...]
    layers: int
    hidden: int
    intermediate: int
    kv_width: int
    vocab: int
    tied: bool

    @property
    def total(self) -> int:
        return sum(p.numel for p in self.params)

    def linears(self, targets: tuple[str, ...] | None = None) -> list[Param]:
        """The decoder layers' linear weights whose module name is in `targets` (None: every one)."""
        return [p for p in self.params if p.linear and (targets is None or p.name in targets)]


_CENSUS: dict[str, Census] = {}


def census(config: Any) -> Census:
    """The model's parameters, grouped as trainer.model.sharding groups them (built on the meta device, cached)."""
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    key = config.to_json_string(use_diff=False)
    if key in _CENSUS:
        return _CENSUS[key]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    parts = model_parts(model)
    group_of: dict[int, tuple[int, bool, str]] = {}
    for i, layer in enumerate(parts.layers):
        for name, module in layer.named_modules():
            for p in module.parameters(recurse=False):
                group_of.setdefault(id(p), (i, isinstance(module, nn.Linear) and p is module.weight,
                                            name.rsplit(".", 1)[-1]))
    head_group = EMBED if parts.tied else HEAD
    for module in (parts.norm, parts.head):
        for p in (module.parameters() if module is not None else ()):
            group_of.setdefault(id(p), (head_group, False, ""))
    params = []
    for p in model.parameters():  # a tied weight once
        group, linear, name = group_of.get(id(p), (EMBED, False, ""))
        rows = p.shape[0] if p.ndim else 1
        params.append(Param(rows, p.numel() // max(rows, 1), group, linear, name))
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    kv = int(getattr(text, "num_key_value_heads", None) or heads) * head_dim
    ff = int(getattr(text, "intermediate_size", None) or 4 * text.hidden_size)
    _CENSUS[key] = Census(tuple(params), len(parts.layers), int(text.hidden_size), ff, kv, int(text.vocab_size),
                          parts.tied)
    return _CENSUS[key]


def adapters(c: Census, rank: int, targets: tuple[str, ...] | None) -> list[Param]:
    """peft's LoRA matrices on each targeted linear: A (rank x in) and B (out x rank), in the linear's group."""
    found = []
    for p in c.linears(targets):
        found.append(Param(rank, p.rest, p.group, False, p.name + ".lora_A"))
        found.append(Param(p.rows, rank, p.group, False, p.name + ".lora_B"))
    return found


@dataclass(frozen=True)
class Footprint:
    """Bytes on the fullest GPU (rank 0) for one method, sharding and activation checkpointing."""

    method: str
    ranks: int                     # ranks each parameter is sharded over
    activation_checkpointing: bool
    trainable: int                 # parameters that carry gradients and optimizer state
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float       # saved for backward at its largest (estimate)
    transient_bytes: float         # the rest of the largest moment: gathered groups, unsharded gradients, loss
    offload: bool = False          # FSDP2's CPUOffloadPolicy: the states live in host memory

    @property
    def states_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def host_bytes(self) -> float:
        """Host memory this rank pins for its states with CPU offload (0 without)."""
        return self.states_bytes if self.offload else 0.0

    @property
    def peak_bytes(self) -> float:
        """GPU memory at the largest moment of a step."""
        return (0.0 if self.offload else self.states_bytes) + self.activations_bytes + self.transient_bytes


def stored_bytes(p: Param, method: str, ranks: int | None) -> float:
    """Bytes of a base parameter as stored: sharded over `ranks`, or unsharded (None) as gathered for compute."""
    numel = p.shard(ranks) if ranks else p.numel
    if method == "full":
        return numel * (MASTER_BYTES if ranks else COMPUTE_BYTES)
    if method == "qlora" and p.linear:
        return nf4_bytes(numel)
    return numel * COMPUTE_BYTES


def layer_activation_bytes(c: Census, tokens: int, lora_rank: int = 0, lora_linears: int = 0) -> float:
    """bf16 activations one decoder layer saves for backward: norms (with their fp32 upcasts), q/k/v,
    attention output (SDPA keeps no score matrix), the gated MLP's four intermediates, the adapters' rank-wide ones."""
    d, ff, kv = c.hidden, c.intermediate, c.kv_width
    return tokens * (16 * d + 2 * kv + 4 * ff + lora_rank * lora_linears) * COMPUTE_BYTES


def footprint(c: Census, method: str, ranks: int, *, seq_len: int, micro_batch: int = 1,
              activation_checkpointing: bool = False, lora_rank: int = DEFAULT_LORA_RANK,
              targets: tuple[str, ...] | None = None, offload: bool = False) -> Footprint:
    """What rank 0 allocates for `method` with every parameter sharded over `ranks` (`offload`: FSDP2's CPU
    offload, the states in host memory)."""
    if method not in METHODS:
        raise ValueError(f"method {method!r}: use one of {', '.join(METHODS)}")
    if offload and method == "qlora":
        raise ValueError("method 'qlora' with CPU offload: its NF4 base is not offloaded; use lora or full")
    full = method == "full"
    lora = [] if full else adapters(c, lora_rank, targets)
    trained = list(c.params) if full else lora
    params = sum(stored_bytes(p, method, ranks) for p in c.params) + sum(p.shard(ranks) * MASTER_BYTES for p in lora)
    trained_shard = sum(p.shard(ranks) for p in trained)
    groups = sorted({p.group for p in c.params})

    def gathered(g: int) -> float:
        return sum(stored_bytes(p, method, None) for p in c.params if p.group == g) + \
            sum(p.numel * COMPUTE_BYTES for p in lora if p.group == g)

    def unsharded_grads(g: int) -> float:
        return sum(p.numel for p in trained if p.group == g) * (COMPUTE_BYTES + REDUCE_BYTES)

    layer_groups = [g for g in groups if g >= 0]
    tokens = seq_len * micro_batch
    per_layer = layer_activation_bytes(c, tokens, lora_rank if lora else 0, len(c.linears(targets)) // max(c.layers, 1))
    saved = c.layers * tokens * c.hidden * COMPUTE_BYTES if activation_checkpointing else c.layers * per_layer
    recompute = per_layer if activation_checkpointing else 0.0
    layer = max((gathered(g) for g in layer_groups), default=0.0)
    layer_grads = max((unsharded_grads(g) for g in layer_groups), default=0.0)
    dequantized = max((p.numel * COMPUTE_BYTES for p in c.linears()), default=0) if method == "qlora" else 0
    head = HEAD if HEAD in groups else EMBED
    head_weight = next((p for p in c.params if p.group == head and p.rows == c.vocab), None)
    chunk = min(DEFAULT_CHUNK_BYTES, tokens * c.vocab * 6) + tokens * c.hidden * REDUCE_BYTES
    # The chunked loss accumulates the (trained) head's weight gradient in fp32 beside one chunk of logits, then
    # hands it over in bf16, which FSDP2 copies into its fp32 reduce-scatter input: whichever pair is larger.
    accumulated = head_weight.numel * REDUCE_BYTES if full and head_weight is not None else 0
    head_grads = max(chunk + accumulated, unsharded_grads(head))
    # CPU offload copies a group's sharded parameters (as stored) to the GPU before its all-gather: two groups
    staged = 2 * max((sum(stored_bytes(p, method, ranks) for p in c.params if p.group == g) +
                      sum(p.shard(ranks) * MASTER_BYTES for p in lora if p.group == g) for g in groups),
                     default=0.0) if offload else 0.0
    moments = {
        "end of forward": saved + recompute + 2 * layer + dequantized + staged,
        "loss": saved + gathered(head) + layer + head_grads + staged,
        "layer backward": saved + recompute + 2 * layer + layer_grads + dequantized + staged,
        "embedding backward": gathered(EMBED) + unsharded_grads(EMBED) + staged,
    }
    acts = saved + recompute  # at most the end of forward's moment, so the transient part is never negative
    largest = max(moments.values())
    return Footprint(method, ranks, activation_checkpointing, sum(p.numel for p in trained), float(params),
                     float(trained_shard * REDUCE_BYTES),
                     float(trained_shard * ADAM_BYTES), float(acts), float(largest - acts), offload)


def budget_bytes(gpu_memory_mib: int) -> float:
    """What a plan may fill of one GPU (BUDGET of the memory EC2 reports)."""
    return gpu_memory_mib * 2 ** 20 * BUDGET


def host_budget_bytes(pod_memory_gib: float) -> float:
    """What CPU-offloaded states of one node's ranks may fill of its Ray worker pod (HOST_BUDGET of its limit)."""
    return pod_memory_gib * GIB * HOST_BUDGET


def node_problem(c: Census, method: str, ranks_per_node: int, gpu_memory_mib: int, pod_memory_gib: float | None = None,
                 **kw: Any) -> str | None:
    """Why one node's shard group cannot hold the run (hybrid sharding's replica), or None when it can; with CPU
    offload (`offload` in kw) its ranks' states must fit the worker pod's memory (`pod_memory_gib`) too."""
    f = footprint(c, method, ranks_per_node, **kw)
    budget = budget_bytes(gpu_memory_mib)
    if f.peak_bytes > budget:
        return (f"{f.peak_bytes / GIB:.2f} GiB per GPU sharded over one node's {ranks_per_node} GPUs, "
                f"{budget / GIB:.2f} GiB usable")
    host = f.host_bytes * ranks_per_node
    if pod_memory_gib is not None and host > host_budget_bytes(pod_memory_gib):
        return (f"{host / GIB:.2f} GiB of offloaded states in host memory sharded over one node's {ranks_per_node} "
                f"GPUs, {host_budget_bytes(pod_memory_gib) / GIB:.2f} GiB usable of the worker pod")
    return None
