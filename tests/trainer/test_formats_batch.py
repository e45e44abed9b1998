"""The fast ways to the same tokens and masks: one render for every prefix, batched tokenizing, the mask rule.

References are the slow ways themselves, in real transformers and tokenizers code: each prefix
rendered by apply_chat_template, each record encoded alone (Renderer.encode, which the TRL
comparisons of test_formats.py also check), every token compared with every span.
"""

from __future__ import annotations

import json
import random

import pytest

from tests.guards import nonempty
from tests.trainer.test_formats import (
    CALL,
    CHATML_GEN,
    PLAIN_CONVERSATION,
    QWEN_TRAINING,
    TOOL_CONVERSATION,
    TOOLS,
    TRL_TEMPLATES,
    byte_tokenizer,
)
from trainer import demo
from trainer.bench.tokenize import QWEN2_TEMPLATE, chat_records
from trainer.data import packing
from trainer.data.formats import DataError, Renderer, _spans_to_mask, to_example
from trainer.data.prefix_renders import prefix_renders

CHATML = CHATML_GEN.replace("{% generation %}", "").replace("{% endgeneration %}", "")
TOOLS_CHATML = ("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
                "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}"
                "{% endif %}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>"
                "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}")
REWRITING = ("{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}"
             "{{ m.role }}:{{ m.content.split('</think>')[-1] }}{{ '\n' }}{% else %}"
             "{{ m.role }}:{{ m.content }}{{ '\n' }}{% endif %}{% endfor %}"
             "{% if add_generation_prompt %}assistant:{% endif %}")
TEMPLATES = {"qwen2": QWEN2_TEMPLATE, "chatml": CHATML, "chatml+generation": CHATML_GEN,
             "qwen2.5 training": QWEN_TRAINING, "qwen2.5": (TRL_TEMPLATES / "qwen2_5.jinja").read_text(),
             "tools chatml": TOOLS_CHATML, "demo": demo.CHAT_TEMPLATE, "rewriting": REWRITING}
SYSTEM_MULTI_TURN = {"messages": [{"role": "system", "content": "Be terse."}, *PLAIN_CONVERSATION["messages"],
                                  {"role": "user", "content": "again"}, {"role": "assistant", "content": "ok"}]}
RECORDS = [
    TOOL_CONVERSATION, PLAIN_CONVERSATION, SYSTEM_MULTI_TURN,
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "part "}, {"type": "text", "text": "two"}]},
                  {"role": "assistant", "content": "both"}]},
    {"messages": [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "fine"},
                  {"role": "assistant", "content": "thanks"}]},
    {"messages": [{"role": "user", "content": "think"}, {"role": "assistant", "content": "<think>t</think>ok"}],
     "chat_template_kwargs": {"enable_thinking": False}},
    {"conversations": [{"from": "human", "value": "hey"}, {"from": "gpt", "value": "hello"}]},
    {"instruction": "Add", "input": "2 and 3", "output": "5", "system": "Maths."},
    {"prompt": "Say hi", "response": "hi"},
    {"prompt": [{"role": "user", "content": "Weather?"}],
     "completion": [{"role": "assistant", "content": "", "tool_calls": [CALL]}, {"role": "tool", "content": "18C"},
                    {"role": "assistant", "content": "18C."}], "tools": json.dumps(TOOLS)},
    {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}],
     "completion": [{"role": "assistant", "content": "a"}]},
    {"prompt": "The sky is", "completion": " blue."},
    {"text": "Plain text to model."},
    {"text": "Ends with eos<|im_end|>"},
]


def outcome(renderer: Renderer, record: dict, i: int):
    """(ids, mask) of the record encoded alone, or its error's text."""
    try:
        return renderer.encode(to_example(record, f"dataset 'd' record {i}"))
    except DataError as e:
        return str(e)


def tokenized(renderer: Renderer, records: list[dict], batch: int) -> tuple[list, str | None]:
    out: list = []
    try:
        for item in packing.tokenize(records, renderer, "d", batch=batch):
            out.append(item)
    except DataError as e:
        return out, str(e)
    return out, None


@pytest.mark.parametrize("train_on", ["completion", "completion_only", "all"])
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_batched_tokenizing_gives_each_records_own_tokens_mask_or_error(name, train_on):
    """packing.tokenize (Renderer.encode_batch, 4 records a call) against Renderer.encode record by record: the
    same ids and masks, and the first failing record's own error after the records before it."""
    tok = demo.build_tokenizer()
    tok.chat_template = TEMPLATES[name]
    alone = [outcome(Renderer(tok, train_on), r, i) for i, r in enumerate(RECORDS)]
    good = [o for o in alone if not isinstance(o, str)]
    assert len(nonempty(good, "records this template encodes")) >= 4
    first_bad = next((i for i, o in enumerate(alone) if isinstance(o, str)), None)
    out, error = tokenized(Renderer(tok, train_on), RECORDS, batch=4)
    if first_bad is None:
        assert (out, error) == (alone, None)
    else:
        assert out == alone[:first_bad] and error == alone[first_bad]
        assert f"record {first_bad}" in error
    # only the records it encodes, all at once
    kept = [r for r, o in zip(RECORDS, alone, strict=True) if not isinstance(o, str)]
    examples = [to_example(r, f"record {i}") for i, r in enumerate(kept)]
    assert Renderer(tok, train_on).encode_batch(examples) == good


def test_a_record_that_does_not_parse_in_a_later_batch_is_named_after_the_records_before_it():
    tok = demo.build_tokenizer()
    records = [PLAIN_CONVERSATION] * 9 + [{"messages": [{"role": "narrator", "content": "x"}]}, PLAIN_CONVERSATION]
    out, error = tokenized(Renderer(tok), records, batch=4)
    assert len(out) == 9 and "dataset 'd' record 9 field messages[0].role" in error
    # a template error inside a batch, after a good record of the same batch
    tok.chat_template = "{% for m in messages %}{{ m.role }}{{ m.content.upper(1) }}{% endfor %}"
    out, error = tokenized(Renderer(tok, "all"), [{"text": "ok"}, PLAIN_CONVERSATION], batch=4)
    assert len(out) == 1 and error.startswith("dataset 'd' record 1: the chat template cannot render this record")


def test_a_bpe_tokenizer_whose_tokens_cross_turn_boundaries_gets_the_same_masks(tmp_path):
    """A real byte-level BPE trained here on the records' own text: tokens span template and content
    characters, so a turn's edges fall inside tokens, as with a real model's tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    records = chat_records(40, 120, seed=3)
    tok = demo.build_tokenizer()
    tok.chat_template = QWEN2_TEMPLATE
    corpus = [tok.apply_chat_template(r["messages"], tokenize=False) for r in records]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)  # merges across words
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=["<|im_end|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>")
    fast.chat_template = QWEN2_TEMPLATE
    alone = [outcome(Renderer(fast), r, i) for i, r in enumerate(records)]
    out, error = tokenized(Renderer(fast), records, batch=16)
    assert error is None and out == alone
    assert len(nonempty(out, "records")[0][0]) < len(corpus[0]) / 2  # merged: far fewer tokens than characters


def test_the_mask_rule_is_every_token_overlapping_a_span_whatever_the_offsets():
    def every_pair(offsets, spans):
        return [any(a < e and b > s for s, e in spans) for a, b in offsets]

    rng = random.Random(0)
    for trial in range(2000):
        starts = [rng.randint(0, 40) for _ in range(rng.randint(0, 25))]
        if trial % 2:  # ordered, as a tokenizer gives them (zero-width tokens included)
            starts.sort()
        offsets = [(a, a + rng.randint(0, 4)) for a in starts]
        spans = sorted((s, s + rng.randint(0, 12)) for s in (rng.randint(0, 40) for _ in range(rng.randint(0, 3))))
        assert _spans_to_mask(offsets, spans) == every_pair(offsets, spans), (offsets, spans)


# ---------------------------------------------------------------- one render for every prefix

CONVERSATIONS = [r["messages"] for r in RECORDS if "messages" in r] + [
    [{"role": "user", "content": "a"}, {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"},
     {"role": "assistant", "content": "b"}]]


def prefixes_by_transformers(tok, messages, **kw) -> dict[tuple[int, bool], str]:
    return {(k, agp): tok.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=agp, **kw)
            for k in range(1, len(messages) + 1) for agp in (False, True)}


def context(tok, tools=None, **kw) -> dict:
    return {"tools": tools, "documents": None, **tok.special_tokens_map, **kw}


@pytest.mark.parametrize("name", ["qwen2", "chatml", "tools chatml", "demo", "gemma", "phi3"])
def test_a_loop_local_templates_prefixes_all_come_from_one_render(name):
    template = TEMPLATES.get(name) or (TRL_TEMPLATES / f"{name}.jinja").read_text()
    tok = byte_tokenizer(template)
    checked = 0
    for messages in nonempty(CONVERSATIONS, "conversations"):
        messages = [{**m, "content": m["content"] if isinstance(m["content"], str) else
                     "".join(p["text"] for p in m["content"])} for m in messages if "tool_calls" not in m]
        for kw in ({}, {"enable_thinking": False}):
            try:
                want = prefixes_by_transformers(tok, messages, **kw)
            except Exception:  # noqa: BLE001 - the template refuses this conversation (gemma: alternating roles)
                assert prefix_renders(template, messages, context(tok, **kw)) is None
                continue
            render = prefix_renders(template, messages, context(tok, **kw))
            assert render is not None, (name, messages)
            assert {key: render(*key) for key in want} == want
            checked += 1
    tools = prefixes_by_transformers(tok, PLAIN_CONVERSATION["messages"], tools=TOOLS)
    render = prefix_renders(template, PLAIN_CONVERSATION["messages"], context(tok, TOOLS))
    assert {key: render(*key) for key in tools} == tools
    assert checked >= 3


def test_templates_whose_prefixes_do_not_follow_from_one_render_are_rendered_prefix_by_prefix():
    messages = PLAIN_CONVERSATION["messages"]
    tok = byte_tokenizer(CHATML)
    refused = {
        "looks ahead (loop.last)": REWRITING,
        "reads other messages (Qwen2.5's tool grouping)": (TRL_TEMPLATES / "qwen2_5.jinja").read_text(),
        "scans the messages first (Qwen3)": (TRL_TEMPLATES / "qwen3.jinja").read_text(),
        "counts the messages": CHATML.replace("{% if add_generation_prompt %}", "{{ messages | length }}"
                                                                                 "{% if add_generation_prompt %}"),
        "carries state out of the loop": "{% set ns = namespace(n=0) %}" + CHATML.replace(
            "{% endfor %}", "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"),
        "prompts inside the loop": CHATML.replace("{% endfor %}", "{% if add_generation_prompt %}!{% endif %}"
                                                                  "{% endfor %}"),
        "two loops over the messages": CHATML + CHATML,
    }
    for why, template in nonempty(refused.items(), "templates"):
        assert prefix_renders(template, messages, context(tok)) is None, why
    # content holding the marker character: its record is rendered prefix by prefix too
    assert prefix_renders(CHATML, [{"role": "user", "content": "\ufdd0"}], context(tok)) is None
    assert prefix_renders(CHATML, messages, context(tok)) is not None



def test_the_tokenize_benchmark_prints_one_line_per_path_all_identical(capsys):
    from trainer.bench import main as bench_main

    assert bench_main(["tokenize", "--records", "6", "--tokens", "200", "--repeat", "1"]) == 0
    header, *lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert header["tokenizer_threads"] is False and header["template"] == "own"
    paths = {line["path"]: line for line in lines}
    assert {"encode", "batched"} <= set(paths) <= {"before", "encode", "batched"}
    for line in nonempty(lines, "paths"):
        assert line["identical"] is True and line["records"] == 6 and line["us_per_token"] > 0
    assert 100 < paths["batched"]["tokens"] / 6 < 400  # about --tokens tokens a record


def test_every_trl_template_batched_and_from_one_render_gives_what_record_by_record_and_prefix_by_prefix_give():
    """Each template TRL ships (read here, not listed): where its prefixes come from one render they are
    transformers' own, and packing.tokenize gives every record's own tokens, mask or error."""
    one_render = 0
    for path in nonempty(sorted(TRL_TEMPLATES.glob("*.jinja")), "TRL chat templates"):
        template = path.read_text()
        tok = byte_tokenizer(template)
        messages = SYSTEM_MULTI_TURN["messages"]
        render = prefix_renders(template, messages, context(tok))
        if render is not None:
            want = prefixes_by_transformers(tok, messages)
            assert {key: render(*key) for key in want} == want, path.name
            one_render += 1
        for train_on in ("completion", "all"):
            alone = [outcome(Renderer(tok, train_on), r, i) for i, r in enumerate(RECORDS)]
            first_bad = next((i for i, o in enumerate(alone) if isinstance(o, str)), len(alone))
            out, error = tokenized(Renderer(tok, train_on), RECORDS, batch=5)
            expected_error = alone[first_bad] if first_bad < len(alone) else None
            assert (out, error) == (alone[:first_bad], expected_error), (path.name, train_on)
    assert one_render >= 4  # gemma, phi3, phi3_5, idefics3, smolvlm: their prefixes from one render
