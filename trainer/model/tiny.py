"""A model's own config with its sizes shrunk: the same architecture, small enough to build and run on a CPU in
well under a second (the pre-flight's behaviour checks, trainer.model.probe).

Only sizes change (widths, depths, heads, experts, state sizes, vocabulary); every switch of the architecture
(layer types, attention kinds, norms, activations, softcaps) is the model's own. Sub-configs (a multimodal
model's text or vision config) are shrunk the same way. Imports transformers only.
"""

from __future__ import annotations

import copy

VOCAB = 96
HIDDEN = 32
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
LAYERS = 2

DEPTH = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers", "decoder_layers")
# (attribute names, tiny value): set where the config has the attribute (with a non-None value, for the optional
# ones). Widths first: several configs derive others from them.
SIZES: tuple[tuple[tuple[str, ...], int], ...] = (
    (("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "hidden_dim", "model_dim", "emb_dim"), HIDDEN),
    (("intermediate_size", "ffn_dim", "n_inner", "d_ff", "ffn_hidden_size", "intermediate_dim", "ffn_intermediate_size",
      "dense_intermediate_size"), 2 * HIDDEN),
    (DEPTH, LAYERS),
    (("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads"), HEADS),
    (("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num", "n_head_kv"), HEADS // 2),
    (("head_dim", "attention_head_dim", "kv_channels", "head_size", "global_head_dim", "rotary_dim"), HEAD_DIM),
    (("vocab_size", "n_vocab", "text_vocab_size", "vocab_size_per_layer_input", "encoder_hash_byte_group_vocab"),
     VOCAB),
    (("max_position_embeddings", "n_positions", "max_seq_len", "n_ctx", "max_sequence_length", "seq_length"), 256),
    (("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_total"), 4),
    (("num_experts_per_tok", "moe_topk", "top_k", "moe_k", "num_selected_experts", "experts_per_token"), 2),
    (("moe_intermediate_size", "expert_intermediate_size", "moe_ffn_hidden_size", "expert_dim",
      "expert_ffn_hidden_size"), HIDDEN),
    (("zero_expert_num",), 2),
    (("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"), HIDDEN),
    (("n_group", "topk_group", "num_expert_groups", "moe_num_shared_experts", "n_shared_experts",
      "num_shared_experts"), 1),
    (("q_lora_rank", "kv_lora_rank", "index_head_dim"), 16),
    (("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "index_topk"), HEAD_DIM),
    (("index_n_heads",), 2),
    (("qk_head_dim",), 2 * HEAD_DIM),  # qk_nope_head_dim + qk_rope_head_dim
    (("state_size", "mamba_d_state", "ssm_state_size", "d_state", "linear_key_head_dim", "linear_value_head_dim"), 8),
    (("linear_num_key_heads", "linear_num_value_heads", "num_linear_heads"), 2),
    (("mamba_n_heads", "mamba_num_heads"), HEADS),
    (("mamba_d_head", "mamba_head_dim", "mamba_headdim"), HEAD_DIM),
    (("expand", "mamba_expand"), 1),
    (("H_cycles", "L_cycles", "halt_max_steps"), 1),
    (("num_kv_shared_layers",), 0),
    (("attn_layer_offset", "expert_layer_offset"), 1),  # a hybrid's one attention (or MoE) layer: the second
    (("attn_layer_period", "expert_layer_period"), 2),
    (("mamba_d_ssm",), HIDDEN),
    (("n_mamba_heads",), HEADS),
    (("mamba_n_groups", "n_groups"), 1),
    (("time_step_rank",), 4),
    (("conv_kernel", "mamba_d_conv", "linear_conv_kernel_dim", "conv_L_cache", "short_conv_kernel_size"), 4),
    (("attention_window_size", "sliding_window", "window_size"), 64),
    (("first_k_dense_replace", "num_dense_layers", "n_dense_layers"), 1),
    (("rwkv_hidden_size", "attention_hidden_size", "lru_width", "block_size"), HIDDEN),
    (("hidden_size_per_layer_input", "laurel_rank", "altup_num_inputs"), 4),
)
OPTIONAL = {"sliding_window", "attention_window_size", "window_size", "q_lora_rank", "moe_intermediate_size",
            "shared_expert_intermediate_size", "head_dim", "kv_channels", "first_k_dense_replace", "n_group",
            "topk_group", "num_key_value_heads", "n_kv_heads", "num_kv_heads", "intermediate_size", "n_inner",
            "block_size", "attention_hidden_size", "index_topk", "index_head_dim", "index_n_heads"}
ALWAYS = {"head_dim", "num_key_value_heads"}  # None in some defaults that do not build without them
# Lists sized per layer (or per head) in the defaults: cut to the tiny depth, keeping the first entries.
PER_LAYER = ("layer_types", "layers_block_type", "hybrid_override_pattern", "block_types", "mlp_layer_types",
             "layers_types", "moe_layer_freq", "no_rope_layers", "sliding_window_pattern_list", "layer_block_types",
             "attention_layers")
# Lists of layer indices (the attention layers of a hybrid): the last tiny layer, so a hybrid keeps one.
LAYER_INDICES = ("full_attn_idxs", "attn_layer_indices")


def _sizes(config) -> dict:
    out: dict = {}
    for names, value in SIZES:
        for name in names:
            current = config.__dict__.get(name, False)
            if current is None and name in OPTIONAL and name not in ALWAYS:
                continue
            if current is None:
                out[name] = value
            elif isinstance(current, int) and not isinstance(current, bool):
                out[name] = min(current, value)  # never larger than the model's own (ZAYA: one expert per token)
    return out


def _depth(config) -> int | None:
    return next((v for n in DEPTH if isinstance(v := config.__dict__.get(n), int) and v > LAYERS), None)


def _layers(config) -> dict:
    """Per-layer lists cut to the tiny depth: those named so, and any list as long as the model is deep."""
    out: dict = {}
    depth = _depth(config)
    named = [n for n, v in config.__dict__.items() if isinstance(v, (list, tuple)) and depth and len(v) == depth]
    for name in dict.fromkeys([*PER_LAYER, *named]):
        current = config.__dict__.get(name)
        if isinstance(current, (list, tuple)) and len(current) > LAYERS:
            out[name] = _cut(current)
        elif isinstance(current, str) and len(current) > LAYERS and name == "hybrid_override_pattern":
            out[name] = _cut(current)
    kinds = config.__dict__.get("attention_types")  # GPT-Neo: [[["global", "local"], 12]]
    if isinstance(kinds, list) and kinds and isinstance(kinds[0], list) and len(kinds[0]) == 2:
        out["attention_types"] = [[kinds[0][0], max(1, LAYERS // len(kinds[0][0]))]]
    for name in LAYER_INDICES:
        current = config.__dict__.get(name)
        if isinstance(current, (list, tuple)) and current:
            out[name] = type(current)([LAYERS - 1])
    return out


def _overrides(config) -> dict:
    out = {**_sizes(config), **_layers(config)}
    if "num_key_value_heads" in out and "num_attention_heads" not in config.__dict__:
        del out["num_key_value_heads"]
    if config.__dict__.get("kv_lora_rank") and "num_key_value_heads" in out:  # MLA: a key/value head per head
        out["num_key_value_heads"] = HEADS
    for name, value in list(config.__dict__.items()):  # token ids inside the tiny vocabulary
        if name.endswith("_token_id") and isinstance(value, int) and not isinstance(value, bool) and value >= VOCAB:
            out[name] = VOCAB - 1 - (sum(map(ord, name)) % 8)
    return out


def _cut(seq):
    """The first tiny-depth entries, with one of each kind the list holds (a hybrid keeps its attention layer)."""
    kinds = list(dict.fromkeys(seq))
    if len(kinds) <= LAYERS and all(k in seq[:LAYERS] for k in kinds):
        return seq[:LAYERS]
    picked = [seq.index(k) for k in kinds[:LAYERS]]
    picked += [i for i in range(len(seq)) if i not in picked][: LAYERS - len(picked)]
    cut = [seq[i] for i in sorted(picked)]
    return "".join(cut) if isinstance(seq, str) else type(seq)(cut)


def shrink(config):
    """A copy of `config` with every size tiny (sub-configs included); the architecture's switches unchanged."""
    tiny = copy.deepcopy(config)
    for name, value in _overrides(tiny).items():
        setattr(tiny, name, value)
    for key in getattr(tiny, "sub_configs", {}) or {}:
        sub = getattr(tiny, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            setattr(tiny, key, shrink(sub))
    tiny.use_cache = False
    return _rebuilt(tiny)


def _rebuilt(config):
    """The config built again from its values, so what its __init__ derives (layer types, ...) follows the sizes."""
    values = config.to_dict()
    for name in PER_LAYER:
        if name in values and not isinstance(values[name], (list, tuple, str)):
            values.pop(name)  # None: derived by __init__ from the tiny depth
    try:
        rebuilt = type(config)(**{k: v for k, v in values.items() if k not in ("transformers_version",)})
    except Exception:  # noqa: BLE001 - a config whose __init__ rejects its own dict keeps the set values
        return config
    return rebuilt
