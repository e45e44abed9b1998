"""Assets of the local demo: a tiny Qwen2 config, a character tokenizer, a learnable task.

Everything here is built deterministically from code and one small JSON config, so the
demo (and the tests) need no download: the same files a hub model provides (config,
safetensors weights, tokenizer with a chat template) are written to a local folder and
then loaded by the ordinary model-loading code.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

CONFIG_PATH = Path(__file__).with_name("tiny_qwen2.json")

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
ROLE_TOKENS = ["system", "user", "assistant"]  # whole-word tokens: shorter sequences, faster demo
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]

# Qwen's ChatML layout without the default system prompt (keeps demo sequences short).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TASKS = ("reverse", "sort", "upper")


def _byte_level(text: str) -> str:
    """GPT-2's byte-to-unicode mapping (what a byte-level BPE vocabulary spells bytes as): ' ' -> 'Ġ'."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return "".join(mapping[b] for b in text.encode())


def build_tokenizer():
    """A character-level Qwen2Tokenizer with ChatML special tokens, whole role words and a chat template.

    It is a Qwen2Tokenizer (byte-level BPE without merges) because that is what AutoTokenizer gives
    back for a folder whose config.json says qwen2, whatever tokenizer_config.json names (transformers
    lists qwen2 among the models whose hub tokenizer class it overrides); any other tokenizer would be
    reloaded as one, with Qwen's pre-tokenizer, and train on different tokens than it was built with.
    """
    from tokenizers import AddedToken
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + ROLE_TOKENS + [_byte_level(c) for c in CHARS])}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=512,
    )
    tokenizer.add_tokens([AddedToken(word, special=False, normalized=False) for word in ROLE_TOKENS])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def model_config():
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(CONFIG_PATH))


def write_init_model(folder: str | Path, seed: int) -> Path:
    """Random-init tiny Qwen2 plus tokenizer, saved like a hub model (safetensors, config, tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    folder = Path(folder)
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    tokenizer = build_tokenizer()
    config = model_config()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(folder)
    return folder


def make_example(task: str, word: str) -> dict:
    answer = {"reverse": word[::-1], "sort": "".join(sorted(word)), "upper": word.upper()}[task]
    return {"messages": [{"role": "user", "content": f"{task}: {word}"},
                         {"role": "assistant", "content": answer}]}


def make_dataset(seed: int = 0, n_train: int = 4000, n_eval: int = 200,
                 min_len: int = 3, max_len: int = 7) -> tuple[list[dict], list[dict]]:
    """Disjoint train/held-out instruction examples; the held-out words never appear in training."""
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < n_train + n_eval:
        n = rng.randint(min_len, max_len)
        words.add("".join(rng.choice(string.ascii_lowercase) for _ in range(n)))
    ordered = sorted(words)
    rng.shuffle(ordered)
    held_out, train = ordered[:n_eval], ordered[n_eval:]
    train_rows = [make_example(rng.choice(TASKS), w) for w in train]
    eval_rows = [make_example(TASKS[i % len(TASKS)], w) for i, w in enumerate(held_out)]
    return train_rows, eval_rows


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(path)
    return path


def prompts_and_answers(rows: list[dict]) -> tuple[list[list[dict]], list[str]]:
    return [r["messages"][:-1] for r in rows], [r["messages"][-1]["content"] for r in rows]


def exact_match(model, tokenizer, rows: list[dict], batch_size: int = 64, max_new_tokens: int = 12) -> float:
    """Share of held-out prompts whose greedy completion equals the reference answer exactly."""
    import torch

    prompts, answers = prompts_and_answers(rows)
    tokenizer.padding_side = "left"
    model.eval()
    hits = 0
    with torch.no_grad():
        for i in range(0, len(prompts), batch_size):
            texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                     for p in prompts[i:i + batch_size]]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
            for j, seq in enumerate(out[:, enc["input_ids"].shape[1]:]):
                hits += tokenizer.decode(seq, skip_special_tokens=True).strip() == answers[i + j]
    return hits / max(1, len(prompts))
