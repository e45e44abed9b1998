"""TRL's dataset formats: rendered by the tokenizer's own chat template, masks equal to what TRL computes.

The reference is TRL itself: each record goes through SFTTrainer's own dataset preparation
(its tokenization, completion and assistant masks, labels) with the same tokenizer and
template, TRL's own Qwen2.5 training template (tools, tool calls, `{% generation %}`
markers) read from the installed package. The tokenizer is the demo's character tokenizer,
so every character of the rendering is a token and nothing downloads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.guards import nonempty
from trainer import demo
from trainer.data.formats import Renderer, to_example
from trainer.data.packing import DataError

trl = pytest.importorskip("trl")
QWEN_TRAINING = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5_training.jinja").read_text()
# ChatML with {% generation %} right after the generation prompt: exactly what prefix rendering finds
CHATML_GEN = ("{% for m in messages %}{% if m.role == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
              "{{ m.content + '<|im_end|>\n' }}{% endgeneration %}{% else %}"
              "{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL_CONVERSATION = {"messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "18C, sunny"},
    {"role": "assistant", "content": "18C and sunny."},
], "tools": json.dumps(TOOLS)}
PLAIN_CONVERSATION = {"messages": [
    {"role": "user", "content": "reverse: abc"}, {"role": "assistant", "content": "cba"},
    {"role": "user", "content": "upper: xy"}, {"role": "assistant", "content": "XY"}], "tools": None}


def tokenizer(template: str | None = QWEN_TRAINING):
    tok = demo.build_tokenizer()
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def model():
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(demo.model_config())


def trl_tokenized(model, tok, rows, tmp_path, **sft) -> list[tuple[list[int], list[bool]]]:
    """input_ids and trained positions (labels != -100) as TRL's SFTTrainer prepares them (rows: dicts or a
    datasets.Dataset)."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(output_dir=str(tmp_path / "trl"), report_to=[], max_length=None, bf16=False, use_cpu=True,
                     gradient_checkpointing=False, **sft)
    dataset = rows if isinstance(rows, datasets.Dataset) else datasets.Dataset.from_list(rows)
    prepared = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tok).train_dataset
    return [(list(r["input_ids"]), [label != -100 for label in r["labels"]]) for r in prepared]


def ours(tok, rows: list[dict], train_on: str = "completion") -> list[tuple[list[int], list[bool]]]:
    import datasets

    renderer = Renderer(tok, train_on)
    # through Arrow, as the job reads them: unset struct fields come back as None
    examples = [to_example(r, f"record {i}") for i, r in enumerate(datasets.Dataset.from_list(rows))]
    alone = [renderer.encode(ex) for ex in examples]
    assert Renderer(tok, train_on).encode_batch(examples) == alone  # the batched path: the same, record for record
    return alone


def trained_text(tok, ids: list[int], mask: list[bool]) -> str:
    return tok.decode([i for i, m in zip(ids, mask, strict=True) if m])


def test_conversations_with_tools_and_tool_calls_match_trl_assistant_only_loss(model, tmp_path):
    tok = tokenizer()
    rows = [TOOL_CONVERSATION, PLAIN_CONVERSATION]
    reference = trl_tokenized(model, tok, rows, tmp_path, assistant_only_loss=True)
    assert ours(tok, rows) == reference
    ids, mask = reference[0]
    text = tok.decode(ids)
    assert "get_weather" in text and '"city": "Paris"' in text and "<tools>" in text  # tools and the call rendered
    learned = trained_text(tok, ids, mask)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in learned
    assert "18C and sunny.<|im_end|>" in learned and "18C, sunny" not in learned  # tool output is not learned
    assert "Weather in Paris?" not in learned


def test_prefix_rendering_finds_exactly_the_tokens_generation_markers_mark(model, tmp_path):
    plain = CHATML_GEN.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    rows = [PLAIN_CONVERSATION, {"messages": [{"role": "system", "content": "S"}, *PLAIN_CONVERSATION["messages"]]}]
    reference = trl_tokenized(model, tokenizer(CHATML_GEN), rows, tmp_path, assistant_only_loss=True)
    assert ours(tokenizer(plain), rows) == reference
    assert trained_text(tokenizer(plain), *reference[0]) == "cba<|im_end|>\nXY<|im_end|>\n"


def test_conversational_prompt_completion_matches_trl_completion_only_loss(model, tmp_path):
    tok = tokenizer()
    rows = [{"prompt": [{"role": "user", "content": "Weather in Paris?"}],
             "completion": [{"role": "assistant", "content": "", "tool_calls": [CALL]},
                            {"role": "tool", "content": "18C"}, {"role": "assistant", "content": "18C."}],
             "tools": json.dumps(TOOLS)},
            {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
             "completion": [{"role": "assistant", "content": "yo"}], "tools": None}]
    reference = trl_tokenized(model, tok, rows, tmp_path)  # TRL's default for prompt/completion: completion only
    assert ours(tok, rows, "completion_only") == reference
    assert trained_text(tok, *reference[1]) == "yo<|im_end|>\n"
    # --train-on completion is TRL's assistant_only_loss: the completion's assistant turns, not its tool message
    assistant_only = trl_tokenized(model, tok, rows, tmp_path, assistant_only_loss=True)
    assert ours(tok, rows) == assistant_only != reference
    assert "18C<|im_end|>" not in trained_text(tok, *assistant_only[0]) and "18C." in trained_text(tok, *assistant_only[0])
    assert ours(tok, rows, "all") == trl_tokenized(model, tok, rows, tmp_path, completion_only_loss=False)


def test_standard_prompt_completion_and_text_match_trl(model, tmp_path):
    tok = tokenizer()
    pc = [{"prompt": "The sky is", "completion": " blue."}, {"prompt": "2+2=", "completion": "4"}]
    reference = trl_tokenized(model, tok, pc, tmp_path)
    assert ours(tok, pc) == reference
    assert trained_text(tok, *reference[0]) == " blue.<|im_end|>"  # TRL appends EOS to the completion
    text = [{"text": "Plain text to model."}, {"text": "Ends with eos<|im_end|>"}]
    reference = trl_tokenized(model, tok, text, tmp_path)
    assert ours(tok, text) == reference and all(all(m) for _, m in nonempty(reference, "tokenized rows"))
    assert tok.decode(reference[1][0]) == "Ends with eos<|im_end|>"  # no second EOS


def test_train_on_all_matches_trl_without_assistant_only_loss(model, tmp_path):
    tok = tokenizer()
    rows = [TOOL_CONVERSATION]
    assert ours(tok, rows, "all") == trl_tokenized(model, tok, rows, tmp_path)


def test_text_only_content_parts_render_as_the_text_they_spell_never_as_repr():
    tok = tokenizer()  # Qwen's template concatenates content: it takes strings
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Weather "},
                                                       {"type": "text", "text": "in Paris?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "Sunny."}]}]}
    strings = {"messages": [{"role": "user", "content": "Weather in Paris?"},
                            {"role": "assistant", "content": "Sunny."}]}
    got = ours(tok, [parts])[0]
    assert got == ours(tok, [strings])[0]
    assert "'type'" not in tok.decode(got[0]) and "[{" not in tok.decode(got[0])
    lists = ("{% for m in messages %}{{ m.role }}:{% if m.content is string %}{{ m.content }}{% else %}"
             "{% for p in m.content %}<{{ p.text }}>{% endfor %}{% endif %}{{ '\n' }}{% endfor %}"
             "{% if add_generation_prompt %}assistant:{% endif %}")
    ids, mask = ours(tokenizer(lists), [parts])[0]  # a template that takes parts gets them as they are
    assert tokenizer(lists).decode(ids) == "user:<Weather ><in Paris?>\nassistant:<Sunny.>\n"
    assert trained_text(tokenizer(lists), ids, mask) == "<Sunny.>\n"


BAD_RECORDS = {
    "content of the wrong type": ({"messages": [{"role": "user", "content": 5}]},
                                  ["record 3", "messages[0].content", "found int 5"]),
    "an unknown role": ({"messages": [{"role": "narrator", "content": "x"}]},
                        ["messages[0].role", "system, user, assistant, tool", "'narrator'"]),
    "an image part": ({"messages": [{"role": "user", "content": [{"type": "image", "url": "x.png"}]}]},
                      ["messages[0].content[0]", "'image' part", "text-only"]),
    "tool calls on a user message": ({"messages": [{"role": "user", "content": "x", "tool_calls": [CALL]}]},
                                     ["messages[0].tool_calls", "only assistant messages"]),
    "tools that are not JSON": ({"messages": PLAIN_CONVERSATION["messages"], "tools": "[{oops"},
                                ["field tools", "not valid JSON"]),
    "a string prompt with a message completion": ({"prompt": "hi", "completion": [{"role": "assistant",
                                                                                   "content": "yo"}]},
                                                  ["prompt/completion", "two strings", "two lists of messages"]),
    "no known fields": ({"question": "q", "answer": "a"}, ["record 3", "messages", "prompt + completion",
                                                          "its fields are: answer, question"]),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_a_bad_record_is_refused_naming_the_dataset_record_field_and_what_was_found(case):
    record, needles = BAD_RECORDS[case]
    with pytest.raises(DataError) as e:
        Renderer(tokenizer()).encode(to_example(record, "dataset 'chat.jsonl' record 3"))
    assert "dataset 'chat.jsonl' record 3" in str(e.value)
    for needle in nonempty(needles, "expected phrases"):
        assert needle in str(e.value), (needle, str(e.value))


def test_a_template_that_would_drop_tool_calls_or_tools_is_refused_not_silently_used():
    demo_template = tokenizer(demo.CHAT_TEMPLATE)  # renders role and content only
    with pytest.raises(DataError, match=r"record 0 field messages\[2\]\.tool_calls: the chat template does not "
                                        r"render tool calls.*--chat-template FILE"):
        Renderer(demo_template).encode(to_example({**TOOL_CONVERSATION, "tools": None}, "record 0"))
    with pytest.raises(DataError, match="record 0 field tools: the chat template does not render a tools list"):
        Renderer(demo_template).encode(to_example({**PLAIN_CONVERSATION, "tools": TOOLS}, "record 0"))


def test_no_chat_template_and_history_rewriting_templates_name_the_fix():
    with pytest.raises(DataError, match="no chat template.*--chat-template FILE"):
        Renderer(tokenizer(None)).encode(to_example(PLAIN_CONVERSATION, "record 0"))
    assert Renderer(tokenizer(None)).encode(to_example({"text": "abc"}, "r"))[0]  # text needs no template
    # drops earlier assistant turns' reasoning once a later turn follows (as Qwen3's template does)
    rewriting = ("{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}"
                 "{{ m.role }}:{{ m.content.split('</think>')[-1] }}{{ '\n' }}{% else %}"
                 "{{ m.role }}:{{ m.content }}{{ '\n' }}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
    record = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>t</think>b"},
                           {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}
    with pytest.raises(DataError, match=r"messages\[3\]: the chat template renders earlier turns differently.*"
                                        r"generation %\} markers \(--chat-template FILE\), or --train-on all"):
        Renderer(tokenizer(rewriting)).encode(to_example(record, "record 0"))
    ids, mask = Renderer(tokenizer(rewriting), "all").encode(to_example(record, "record 0"))
    assert all(mask) and tokenizer(rewriting).decode(ids) == "user:a\nassistant:b\nuser:c\nassistant:d\n"


def test_a_conversation_without_an_assistant_turn_is_refused_unless_training_on_all():
    record = {"messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(DataError, match="no assistant message to learn from.*--train-on all"):
        Renderer(tokenizer()).encode(to_example(record, "record 0"))
    assert all(Renderer(tokenizer(), "all").encode(to_example(record, "record 0"))[1])


# ---------------------------------------------------------------- every chat template TRL ships

TRL_TEMPLATES = Path(trl.__file__).parent / "chat_templates"
ONE_TURN = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
MULTI_TURN = {"messages": [{"role": "user", "content": "ab"},
                           {"role": "assistant", "content": "<think>t</think>ba"},  # reasoning: Qwen3 drops it
                           {"role": "user", "content": "cd"}, {"role": "assistant", "content": "dc"}]}


def byte_tokenizer(template: str):
    """A tokenizer for any template: every byte one token (GPT-2's byte alphabet, no merges), plus the special
    tokens the template spells (<|...|>, DeepSeek's <｜...｜>, Gemma's <..._of_turn>) as single tokens."""
    import re

    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    alphabet = sorted({demo._byte_level(chr(b)) for b in range(128)} |
                      {demo._byte_level(bytes([b]).decode("latin-1"))[-1] for b in range(128, 256)})
    specials = sorted(set(re.findall(r"<\|[^|'\"\s]+\|>|<｜[^｜'\"]+｜>|<[a-z_]+_of_turn>", template)))
    vocab = {t: i for i, t in enumerate(["<|endoftext|>", "<unk>", *specials, *alphabet])}
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                         bos_token="<|endoftext|>", unk_token="<unk>", additional_special_tokens=specials,
                         model_max_length=4096)
    tok.chat_template = template
    return tok


def test_every_chat_template_trl_ships_trains_one_and_many_turns_with_trls_tokens_and_masks(model, tmp_path):
    """For each template of TRL's chat_templates folder (read here, not listed): TRL's SFTTrainer with
    assistant_only_loss (it swaps in its training version when the template has no generation markers)
    and this trainer's --train-on completion give the same tokens and masks, one turn and several.
    Where TRL refuses a template, this trainer either refuses it too or (its prefix rule, documented in
    docs/trl.md) trains exactly the assistant turns. One SFTTrainer per template: ~20 s, the price of
    checking all of them."""

    names = nonempty(sorted(p.name for p in TRL_TEMPLATES.glob("*.jinja") if not p.stem.endswith("_training")),
                     "TRL chat templates")
    matched, refused = [], []
    for name in names:
        tok = byte_tokenizer((TRL_TEMPLATES / name).read_text())
        rows = [ONE_TURN, MULTI_TURN]
        try:
            reference = trl_tokenized(model, tok, rows, tmp_path / name, assistant_only_loss=True)
        except Exception:  # noqa: BLE001 - TRL refuses this template (no training version, or cannot render)
            reference = None
        try:
            mine = ours(tok, rows)
        except DataError:
            mine = None
        if reference is not None:
            assert mine == reference, name
            matched.append(name)
            continue
        refused.append(name)
        if mine is None:  # refused here too
            continue
        for (ids, mask), row in zip(mine, rows, strict=True):
            trained = trained_text(tok, ids, mask)
            for m in row["messages"]:
                assert (m["content"].split("</think>")[-1] in trained) == (m["role"] == "assistant"), (name, trained)
    # the templates the issue names train with TRL's masks: Qwen3's history rewriting, Phi-3, DeepSeek, gpt-oss...
    for name in ("qwen2_5.jinja", "qwen3.jinja", "phi3.jinja", "phi3_5.jinja", "qwen3_6.jinja", "gptoss.jinja",
                 "deepseek_r1_distill.jinja", "deepseekv3.jinja", "nemotron_3_nano.jinja"):
        assert name in matched, (name, refused)
    assert len(matched) >= 30, (matched, refused)


def test_qwen25s_original_template_trains_trls_masks_and_completion_only_trains_every_token(model, tmp_path):
    tok = tokenizer((TRL_TEMPLATES / "qwen2_5.jinja").read_text())
    rows = [PLAIN_CONVERSATION, TOOL_CONVERSATION]
    reference = trl_tokenized(model, tok, rows, tmp_path / "a", assistant_only_loss=True)
    assert ours(tok, rows) == reference
    trained = trained_text(tok, *reference[0])
    assert "cba<|im_end|>" in trained and "XY<|im_end|>" in trained and "reverse" not in trained
    everything = trl_tokenized(model, tok, rows, tmp_path / "b")  # TRL's default: messages train every token
    assert ours(tok, rows, "completion_only") == everything and all(everything[0][1])


def test_a_records_chat_template_kwargs_reach_the_template_as_in_trl(model, tmp_path):
    template = ("{% if enable_thinking is defined and not enable_thinking %}/no_think\n{% endif %}"
                "{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    tok = tokenizer(template)
    rows = [{"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}],
             "chat_template_kwargs": {"enable_thinking": False}},
            {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}],
             "chat_template_kwargs": {"enable_thinking": True}}]
    reference = trl_tokenized(model, tok, rows, tmp_path)
    mine = ours(tok, rows, "completion_only")
    assert mine == reference
    assert mine[0] != mine[1]  # the two records' variables rendered differently


def test_explicit_json_nulls_in_tool_call_arguments_and_tool_schemas_render_as_trl_renders_them(model, tmp_path):
    import datasets

    from trainer.data.packing import load_records

    tools = [{"type": "function", "function": {"name": "search", "description": "Search the web", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"},
                                         "site": {"type": ["string", "null"], "default": None}},
        "required": ["query"]}}}]
    call = {"type": "function", "function": {"name": "search", "arguments": {"query": "ray", "site": None}}}
    rows = [{"messages": [{"role": "user", "content": "Find ray"},
                          {"role": "assistant", "content": "", "tool_calls": [call]},
                          {"role": "tool", "content": "found"}, {"role": "assistant", "content": "Done."}],
             "tools": tools},
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    file = tmp_path / "tools.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = tokenizer()
    # each side reads the file as it does: TRL from datasets' json loader, this trainer through its sources
    reference = trl_tokenized(model, tok, datasets.load_dataset("json", data_files=str(file), split="train"),
                              tmp_path, assistant_only_loss=True)
    renderer = Renderer(tok, "completion")
    mine = [renderer.encode(to_example(r, f"record {i}")) for i, r in enumerate(load_records(str(file)))]
    assert mine == reference
    text = tok.decode(mine[0][0])
    assert '"arguments": {"query": "ray", "site": null}' in text  # the call's null argument, as the data holds it
    assert '"default": null' in text and '["string", "null"]' in text  # and the schema's
