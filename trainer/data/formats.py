"""Dataset records as TRL defines them, rendered by the tokenizer's own chat template, with loss masks.

Formats (TRL's "standard" and "conversational" dataset types, plus three common layouts):

    messages            [{role, content, tool_calls?}, ...] (+ optional `tools` column): a conversation
    prompt, completion  both strings (standard: plain text, no template) or both message lists (conversational)
    text                plain text (language modelling; the field is --dataset-text-field)
    conversations       ShareGPT {from, value} turns: converted to messages, as TRL does
    prompt, response    / instruction (+ input), output: one user and one assistant turn through the template

Nothing is ever turned into Python repr text: a record is rendered by the chat template
(content parts that are all text become the string they spell when the template expects
strings), or refused with an error naming the dataset, the record, the field and what was
found there. A record's `chat_template_kwargs` (e.g. {enable_thinking: false}) reach the
template, as in TRL. Token masks follow TRL's SFTTrainer for the same record and template:

    --train-on completion (default)  prompt/completion: the completion tokens (TRL completion_only_loss);
                                     messages: the assistant turns (TRL assistant_only_loss); text: all tokens
    --train-on completion_only       prompt/completion: the completion; messages, text: every token
                                     (TRL's defaults: completion_only_loss without assistant_only_loss)
    --train-on all                   every token

Assistant turns are located as TRL locates them: with the template's `{% generation %}` markers
when it has them (transformers' return_assistant_tokens_mask); otherwise, when TRL is installed
and ships a training version of the template (`get_training_chat_template`), with that version:
the conversation is then rendered by it, exactly as TRL's SFTTrainer renders it. Otherwise (no
TRL, or a template TRL refuses) each turn is what rendering the conversation up to it adds after
the generation prompt (what the model sees at inference), all prefixes from one render where the
template provably allows it (trainer.data.prefix_renders); a template that rewrites earlier turns
is then refused. `Renderer.encode_batch` gives the same as `encode` per record, with the texts of
many records tokenized in one call of the fast tokenizer.
"""

from __future__ import annotations

import bisect
import functools
import inspect
import json
import re
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Callable, Sequence

import numpy as np

from facts.errors import UserError, first_line
from trainer.data.prefix_renders import prefix_renders

ROLES = ("system", "user", "assistant", "tool")
TRAIN_ON = ("completion", "completion_only", "all")
_SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant",
                   "function_call": "assistant", "observation": "tool", "function": "tool"}
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
FORMATS = ("messages (+ tools)", "prompt + completion", "text", "conversations",
           "prompt + response", "instruction (+ input) + output")


class DataError(UserError, ValueError):
    """The dataset cannot be used: missing, empty, malformed or without the needed fields."""


def _found(value: Any, limit: int = 80) -> str:
    """What a field holds, short enough for an error message."""
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(value).__name__} {text}"


@dataclass
class Example:
    """One record, normalised: kind is messages, prompt_completion or text."""

    kind: str
    conversational: bool
    messages: list[dict] = field(default_factory=list)
    prompt: Any = None
    completion: Any = None
    text: str | None = None
    tools: list[dict] | None = None
    where: str = ""
    template_kwargs: dict = field(default_factory=dict)  # the record's chat_template_kwargs


def _drop_none(value: Any, verbatim: frozenset[str] = frozenset()) -> Any:
    """Arrow gives every struct the union of all records' keys, unset ones as None: drop those again.

    The values under a `verbatim` key are data, not structure (a tool call's arguments): an explicit
    JSON null there stays, as TRL renders it.
    """
    if isinstance(value, dict):
        return {k: v if k in verbatim else _drop_none(v, verbatim) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v, verbatim) for v in value]
    return value


class RecordError(DataError):
    """A record that cannot be used; `field` is where in it."""


def _message_list(value: Any, where: str, name: str, *, sharegpt: bool = False) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise RecordError(f"{where} field {name}: expected a non-empty list of messages, found {_found(value)}")
    return [_message(raw, where, f"{name}[{i}]", sharegpt) for i, raw in enumerate(value)]


def _message(raw: Any, where: str, at: str, sharegpt: bool) -> dict:
    """One message with its role, content and tool calls checked (a ShareGPT one renamed to role/content)."""
    if not isinstance(raw, dict):
        raise RecordError(f"{where} field {at}: expected a message object with role and content, "
                          f"found {_found(raw)}")
    m = _drop_none(raw, frozenset({"arguments"}))
    if sharegpt or ("from" in m and "role" not in m):
        if "from" in m:
            m["role"] = m.pop("from")
        if "value" in m:
            m["content"] = m.pop("value")
        m["role"] = _SHAREGPT_ROLES.get(str(m.get("role")), m.get("role"))
    role = m.get("role")
    if role not in ROLES:
        raise RecordError(f"{where} field {at}.role: expected one of {', '.join(ROLES)}, found {_found(role)}")
    content = m.get("content")
    if content is None and not (role == "assistant" and m.get("tool_calls")):
        raise RecordError(f"{where} field {at}.content: missing; every message needs content (a string or a "
                          f"list of content parts), except an assistant message with tool_calls")
    if content is not None and not isinstance(content, (str, list)):
        raise RecordError(f"{where} field {at}.content: expected a string or a list of content parts, "
                          f"found {_found(content)}")
    if isinstance(content, list):
        _check_parts(content, where, at)
    if m.get("tool_calls") is not None:
        _check_tool_calls(m["tool_calls"], role, where, at)
    return m


def _check_parts(content: list, where: str, at: str) -> None:
    """Content parts: text ones only (a text-only causal LM)."""
    for j, part in enumerate(content):
        if not isinstance(part, dict) or "type" not in part:
            raise RecordError(f"{where} field {at}.content[{j}]: expected a content part "
                              f"{{type, ...}}, found {_found(part)}")
        if part["type"] != "text":
            raise RecordError(f"{where} field {at}.content[{j}]: a {part['type']!r} part; this trainer "
                              f"fine-tunes text-only causal LMs, so only 'text' parts can be used")
        if not isinstance(part.get("text"), str):
            raise RecordError(f"{where} field {at}.content[{j}].text: expected a string, "
                              f"found {_found(part.get('text'))}")


def _check_tool_calls(calls: Any, role: str, where: str, at: str) -> None:
    """An assistant message's list of calls, each naming its function."""
    if role != "assistant" or not isinstance(calls, list):
        what = "only assistant messages carry tool_calls" if role != "assistant" else "expected a list"
        raise RecordError(f"{where} field {at}.tool_calls: {what}, found {_found(calls)}")
    for j, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RecordError(f"{where} field {at}.tool_calls[{j}]: expected "
                              f"{{type: function, function: {{name, arguments}}}}, found {_found(call)}")


def _tools(record: dict, where: str) -> list[dict] | None:
    tools = record.get("tools")
    if tools is None:
        return None
    if isinstance(tools, str):  # TRL accepts a JSON string (Arrow cannot hold heterogeneous schemas)
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise RecordError(f"{where} field tools: a string that is not valid JSON ({e.msg})") from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RecordError(f"{where} field tools: expected a list of tool (JSON schema) objects, found {_found(tools)}")
    return tools or None  # JSON schemas as the dataset holds them: a null (a default, an enum member) is data


def _text(record: dict, name: str, where: str) -> str:
    value = record[name]
    if not isinstance(value, str):
        raise RecordError(f"{where} field {name}: expected a string, found {_found(value)}")
    return value


def _template_kwargs(record: dict, where: str) -> dict:
    """The record's chat_template_kwargs column (TRL passes it to the template), unset keys dropped."""
    value = record.get("chat_template_kwargs")
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise RecordError(f"{where} field chat_template_kwargs: a string that is not valid JSON ({e.msg})") from None
    if not isinstance(value, dict):
        raise RecordError(f"{where} field chat_template_kwargs: expected an object of template variables "
                          f"(e.g. {{\"enable_thinking\": false}}), found {_found(value)}")
    return _drop_none(value)


def to_example(record: Any, where: str, text_field: str = "text") -> Example:
    """A record as an Example, or a RecordError naming the field and what it holds."""
    if not isinstance(record, dict):
        raise RecordError(f"{where}: expected an object (a row with named fields), found {_found(record)}")
    # Arrow gives a file's every record the union of all records' fields, the missing ones as None
    ex = _to_example({k: v for k, v in record.items() if v is not None}, where, text_field)
    if ex.conversational:
        ex.template_kwargs = _template_kwargs(record, where)
    return ex


def _to_example(record: dict, where: str, text_field: str) -> Example:
    tools = _tools(record, where)
    if "prompt" in record and "completion" in record:
        prompt, completion = record["prompt"], record["completion"]
        if isinstance(prompt, str) and isinstance(completion, str):
            return Example("prompt_completion", False, prompt=prompt, completion=completion, where=where)
        if isinstance(prompt, list) and isinstance(completion, list):
            return Example("prompt_completion", True, prompt=_message_list(prompt, where, "prompt"),
                           completion=_message_list(completion, where, "completion"), tools=tools, where=where)
        raise RecordError(f"{where} fields prompt/completion: expected two strings (standard) or two lists of "
                          f"messages (conversational), found prompt {_found(prompt, 40)} and completion "
                          f"{_found(completion, 40)}")
    if "messages" in record:
        return Example("messages", True, messages=_message_list(record["messages"], where, "messages"),
                       tools=tools, where=where)
    if "conversations" in record:
        msgs = _message_list(record["conversations"], where, "conversations", sharegpt=True)
        return Example("messages", True, messages=msgs, tools=tools, where=where)
    chat_pair = _chat_pair(record, where)
    if chat_pair:
        msgs = [{"role": "user", "content": chat_pair[0]}, {"role": "assistant", "content": chat_pair[1]}]
        if record.get("system"):
            msgs.insert(0, {"role": "system", "content": _text(record, "system", where)})
        return Example("messages", True, messages=msgs, tools=tools, where=where)
    if text_field in record:
        return Example("text", False, text=_text(record, text_field, where), where=where)
    names = ", ".join(sorted(map(str, record))) or "none"
    hint = "" if text_field == "text" else f" (the text field is {text_field!r}: --dataset-text-field)"
    raise RecordError(f"{where}: has none of the supported field sets ({'; '.join(FORMATS)}){hint}; "
                      f"its fields are: {names}")


def format_name(ex: Example) -> str:
    """The record format's name in messages: messages, prompt/completion (conversational or standard), text."""
    if ex.kind == "prompt_completion":
        return f"prompt/completion ({'conversational' if ex.conversational else 'standard'})"
    return ex.kind


def _chat_pair(record: dict, where: str) -> tuple[str, str] | None:
    """(prompt, answer) of a prompt + response or an instruction (+ input) + output record, else None."""
    if "prompt" in record and "response" in record:
        return _text(record, "prompt", where), _text(record, "response", where)
    if "instruction" in record and "output" in record:
        prompt = _text(record, "instruction", where)
        if record.get("input"):
            prompt += "\n\n" + _text(record, "input", where)
        return prompt, _text(record, "output", where)
    return None


# ---------------------------------------------------------------- rendering and masks

_PROBE = "zqxprobe"


def _spans_to_mask(offsets: Sequence[tuple[int, int]], spans: list[tuple[int, int]]) -> list[bool]:
    """Tokens whose characters overlap a span (the rule of transformers' assistant mask: char_to_token).

    Where the tokens' starts and ends both never decrease (the usual case), the tokens overlapping [s, e)
    are exactly those from the first ending after s to the last starting before e: two bisections per span.
    Otherwise every token is compared with every span (numpy)."""
    mask = [False] * len(offsets)
    if not spans or not offsets:
        return mask
    starts, ends = list(map(itemgetter(0), offsets)), list(map(itemgetter(1), offsets))
    if starts == sorted(starts) and ends == sorted(ends):
        for s, e in spans:
            lo, hi = bisect.bisect_right(ends, s), bisect.bisect_left(starts, e)
            mask[lo:hi] = [True] * max(0, hi - lo)
        return mask
    a, b = np.asarray(starts)[:, None], np.asarray(ends)[:, None]
    s, e = np.asarray(spans).T
    return ((a < e) & (b > s)).any(axis=1).tolist()


def _empty_turn(message: dict) -> bool:
    """An assistant message with no text (blank, or content parts without any) and no tool calls."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return not (content or "").strip() and not message.get("tool_calls")


def _common_prefix(a: list[int], b: list[int]) -> int:
    if b[:len(a)] == a:  # the usual case: the prompt's tokens start the whole record's
        return len(a)
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


@dataclass
class _Job:
    """One record's texts to tokenize, as (text, add_special_tokens, offsets), and what makes its (ids, mask)
    of their tokens ((the tokenizer's batch output, the text's index in it), one per text)."""

    texts: list[tuple[str, bool, bool]]
    finish: Callable[[list[tuple[Any, int]]], tuple[list[int], list[bool]]]


def _ready(done: tuple[list[int], list[bool]]) -> _Job:
    return _Job([], lambda _: done)


def _ids(tokens: tuple[Any, int]) -> list[int]:
    return tokens[0]["input_ids"][tokens[1]]


def _offsets(tokens: tuple[Any, int]) -> list[tuple[int, int]]:
    return tokens[0]["offset_mapping"][tokens[1]]


def _all_trained(tokens: tuple[Any, int]) -> tuple[list[int], list[bool]]:
    ids = list(_ids(tokens))
    return ids, [True] * len(ids)


class Renderer:
    """Turns Examples into (token ids, trained mask) with one tokenizer and its chat template."""

    def __init__(self, tokenizer, train_on: str = "completion"):
        if train_on not in TRAIN_ON:
            raise ValueError(f"train_on must be one of {TRAIN_ON}, got {train_on!r}")
        self.tok = tokenizer
        self.train_on = train_on
        self._probes: dict[str, bool] = {}
        self._training: tuple[str | None] | None = None  # (TRL's training template or None,), once asked

    # -- the template the conversations are rendered with: TRL's training version when it swaps one in
    def training_template(self) -> str | None:
        """TRL's training version of the tokenizer's template, used (as TRL uses it) when locating assistant
        turns of a template without {% generation %} markers; None: the tokenizer's own template."""
        if self._training is None:
            use = self.train_on == "completion" and self.has_template and not self._own_markers
            self._training = (trl_training_template(self.tok) if use else None,)
        return self._training[0]

    @property
    def _own_markers(self) -> bool:
        template = self.tok.chat_template
        template = template.get("default", "") if isinstance(template, dict) else template or ""
        return bool(_GENERATION.search(template))

    def _apply(self, messages: list[dict], **kw):
        template = self.training_template() if self.train_on == "completion" else None
        if template is not None:
            kw["chat_template"] = template
        return self.tok.apply_chat_template(messages, **kw)

    # -- what the template can do (asked once each, when a record needs it)
    def _render(self, messages: list[dict], **kw) -> str:
        return self._apply(messages, tokenize=False, **kw)

    def _probe(self, name: str) -> bool:
        if name not in self._probes:
            user = {"role": "user", "content": "hi"}
            try:
                if name == "list_content":
                    out = self._render([{"role": "user", "content": [{"type": "text", "text": _PROBE}]}])
                    self._probes[name] = _PROBE in out and "'type'" not in out and '"type"' not in out
                elif name == "tool_calls":
                    call = {"type": "function", "function": {"name": _PROBE, "arguments": {}}}
                    out = self._render([user, {"role": "assistant", "content": "", "tool_calls": [call]}])
                    self._probes[name] = _PROBE in out
                elif name == "tools":
                    tool = {"type": "function", "function": {"name": _PROBE, "description": "probe",
                                                             "parameters": {"type": "object", "properties": {}}}}
                    self._probes[name] = _PROBE in self._render([user], tools=[tool])
            except Exception:  # noqa: BLE001 - a template that raises on it cannot take it either
                self._probes[name] = False
        return self._probes[name]

    @property
    def has_template(self) -> bool:
        return bool(getattr(self.tok, "chat_template", None))

    @property
    def generation_markers(self) -> bool:
        """Whether the template the assistant turns are located with has {% generation %} markers."""
        return self._own_markers or self.training_template() is not None

    def _prepare(self, ex: Example, messages: list[dict], name: str) -> list[dict]:
        """Content parts flattened when the template expects strings; tool calls only if it renders them."""
        flatten = None
        out = []
        for i, m in enumerate(messages):
            m = dict(m)
            if isinstance(m.get("content"), list):
                if flatten is None:
                    flatten = not self._probe("list_content")
                if flatten:
                    m["content"] = "".join(p["text"] for p in m["content"])
            if m.get("tool_calls") and not self._probe("tool_calls"):
                raise RecordError(f"{ex.where} field {name}[{i}].tool_calls: the chat template does not render "
                                  f"tool calls, so they would be silently dropped from training; use a model whose "
                                  f"template supports tools, or pass one with --chat-template FILE")
            out.append(m)
        return out

    def _kwargs(self, ex: Example) -> dict:
        if not ex.tools:
            return dict(ex.template_kwargs)
        if not self._probe("tools"):
            raise RecordError(f"{ex.where} field tools: the chat template does not render a tools list, so the "
                              f"tool definitions would be silently dropped; use a template that supports tools "
                              f"(--chat-template FILE)")
        return {**ex.template_kwargs, "tools": ex.tools}

    def _template_error(self, ex: Example, err: Exception) -> RecordError:
        return RecordError(f"{ex.where}: the chat template cannot render this record "
                           f"({first_line(err)})")

    # -- encoding
    def encode(self, ex: Example) -> tuple[list[int], list[bool]]:
        """Token ids of the rendered record and which of them are trained."""
        return self._guarded(ex, self._encode)

    def encode_batch(self, examples: Sequence[Example]) -> list[tuple[list[int], list[bool]]]:
        """encode() of each example, with the texts of all of them tokenized in one call (a fast tokenizer's
        Rust batch path); the first record that fails raises what encode() raises for it."""
        if not getattr(self.tok, "is_fast", False):
            return [self.encode(ex) for ex in examples]
        jobs: list[_Job] = []
        failure = None
        for ex in examples:
            try:
                jobs.append(self._guarded(ex, self._plan))
            except Exception as e:  # noqa: BLE001 - raised once the records before it are done
                failure = e
                break
        try:
            done = self._run(jobs)
        except Exception:  # noqa: BLE001 - one record's problem: encode() record by record names that record
            done = [self.encode(ex) for ex in examples[:len(jobs)]]
        if failure is not None:
            raise failure
        return done

    def _guarded(self, ex: Example, step: Callable[[Example], Any]) -> Any:
        if ex.conversational and not self.has_template:
            raise DataError("the tokenizer has no chat template, so conversational records cannot be rendered; "
                            "pass one with --chat-template FILE (a Jinja file), or use a tokenizer that has one")
        try:
            return step(ex)
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001 - jinja and tokenizer errors, named with the record
            raise self._template_error(ex, e) from None

    def _encode(self, ex: Example) -> tuple[list[int], list[bool]]:
        if ex.kind == "text":
            return self._encode_text(ex)
        if ex.kind == "prompt_completion":
            return self._encode_prompt_completion(ex)
        return self._encode_messages(ex)

    def _eos(self, text: str) -> str:
        eos = self.tok.eos_token
        if not eos:
            raise DataError("the tokenizer has no EOS token (eos_token is unset), so text and completion records "
                            "would end without one and the model would never learn to stop; use a tokenizer that "
                            "has one (--tokenizer), or set eos_token in its tokenizer_config.json")
        return text if text.endswith(eos) else text + eos

    def _encode_text(self, ex: Example) -> tuple[list[int], list[bool]]:
        ids = list(self.tok(text=self._eos(ex.text))["input_ids"])
        return ids, [True] * len(ids)

    def _encode_prompt_completion(self, ex: Example) -> tuple[list[int], list[bool]]:
        if ex.conversational:
            kw = self._kwargs(ex)
            prompt = self._prepare(ex, ex.prompt, "prompt")
            completion = self._prepare(ex, ex.completion, "completion")
            prompt_ids = self._apply(prompt, tokenize=True, return_dict=True, add_generation_prompt=True,
                                     **kw)["input_ids"]
            assistant = self.train_on == "completion" and self.generation_markers
            out = self._apply(prompt + completion, tokenize=True, return_dict=True,
                              return_assistant_tokens_mask=assistant, **kw)
            ids = list(out["input_ids"])
            if self.train_on != "all":
                start = _common_prefix(list(prompt_ids), ids)
                mask = [False] * start + [True] * (len(ids) - start)
                if assistant:  # TRL: the completion mask and the assistant mask, both
                    mask = [m and bool(a) for m, a in zip(mask, out["assistant_masks"], strict=True)]
                return ids, mask
            return ids, [True] * len(ids)
        prompt_ids = self.tok(text=ex.prompt)["input_ids"]
        return self._after_prompt(prompt_ids, self.tok(text=ex.prompt + self._eos(ex.completion))["input_ids"])

    def _after_prompt(self, prompt_ids: list[int], ids: list[int]) -> tuple[list[int], list[bool]]:
        """A standard prompt/completion record's ids, trained from where they stop being the prompt's."""
        ids = list(ids)
        if self.train_on == "all":
            return ids, [True] * len(ids)
        start = _common_prefix(list(prompt_ids), ids)
        return ids, [False] * start + [True] * (len(ids) - start)

    # -- the batch path: each record's texts, tokenized together, then its (ids, mask) made of them
    def _plan(self, ex: Example) -> _Job:
        if ex.kind == "text":
            return _Job([(self._eos(ex.text), True, False)], lambda t: _all_trained(t[0]))
        if ex.kind == "prompt_completion" and not ex.conversational:
            texts = [(ex.prompt, True, False), (ex.prompt + self._eos(ex.completion), True, False)]
            return _Job(texts, lambda t: self._after_prompt(_ids(t[0]), _ids(t[1])))
        if ex.kind == "prompt_completion":
            return _ready(self._encode_prompt_completion(ex))
        kw = self._kwargs(ex)
        if self._template_context(kw) is None:
            return _ready(self._encode_messages(ex))
        messages = self._prepare(ex, ex.messages, "messages")
        if self.train_on != "completion":
            return _Job([(self._render(messages, **kw), False, False)], lambda t: _all_trained(t[0]))
        self._check_assistant_turns(ex, messages)
        if self.generation_markers:
            text, generation = self._render_marked(messages, kw)
            return _Job([(text, False, False)], lambda t: self._marked_mask(ex, t[0], generation))
        text, spans = self.assistant_spans(ex, messages, kw)
        return _Job([(text, False, True)], lambda t: (_ids(t[0]), _spans_to_mask(_offsets(t[0]), spans)))

    def _run(self, jobs: list[_Job]) -> list[tuple[list[int], list[bool]]]:
        """Every job's texts through the tokenizer, one call per kind of call, then each job finished in order."""
        groups: dict[tuple[bool, bool], list[str]] = {}
        places = []
        for job in jobs:
            at = []
            for text, special, offsets in job.texts:
                group = groups.setdefault((special, offsets), [])
                at.append(((special, offsets), len(group)))
                group.append(text)
            places.append(at)
        encoded = {key: self.tok(texts, add_special_tokens=key[0], return_offsets_mapping=key[1],
                                 return_attention_mask=False, return_token_type_ids=False)  # unused lists
                   for key, texts in groups.items()}
        return [job.finish([(encoded[key], i) for key, i in at]) for job, at in zip(jobs, places, strict=True)]

    def _render_marked(self, messages: list[dict], kw: dict) -> tuple[str, list[tuple[int, int]]]:
        """The conversation rendered as apply_chat_template renders it, with its {% generation %} spans."""
        from transformers.utils.chat_template_utils import render_jinja_template

        tools = kw.get("tools")
        rest = {k: v for k, v in kw.items() if k != "tools"}
        rendered, generation = render_jinja_template(
            conversations=[messages], tools=tools, documents=None, chat_template=self._template_source(tools),
            return_assistant_tokens_mask=True, continue_final_message=False, add_generation_prompt=False,
            **{**self.tok.special_tokens_map, **rest})
        return rendered[0], generation[0]

    def _marked_mask(self, ex: Example, tokens: tuple[Any, int],
                     generation: list[tuple[int, int]]) -> tuple[list[int], list[bool]]:
        """apply_chat_template's assistant mask (its char_to_token rule, quirks included), by slices."""
        encoding, at = tokens
        ids = _ids(tokens)
        mask = [False] * len(ids)
        for start_char, end_char in generation:
            start = encoding.char_to_token(at, start_char)
            end = encoding.char_to_token(at, end_char - 1)
            if start is None:
                break
            stop = end + 1 if end else len(ids)
            mask[start:stop] = [True] * len(mask[start:stop])
        if not any(mask):
            raise self._no_marked_tokens(ex)
        return ids, mask

    def _no_marked_tokens(self, ex: Example) -> RecordError:
        return RecordError(f"{ex.where} field messages: the chat template's {{% generation %}} markers mark "
                           f"no token of this conversation (as TRL finds too); fix the template's markers "
                           f"(--chat-template FILE), or pass --train-on all")

    def _check_assistant_turns(self, ex: Example, messages: list[dict]) -> None:
        if not any(m["role"] == "assistant" for m in messages):
            raise RecordError(f"{ex.where} field messages: no assistant message to learn from (roles: "
                              f"{', '.join(m['role'] for m in messages)}); add one, or pass --train-on all")
        if all(_empty_turn(m) for m in messages if m["role"] == "assistant"):
            raise RecordError(f"{ex.where} field messages: every assistant message is empty, so only the end of "
                              f"the turn would be trained (the model learns to answer nothing); fill them in, or "
                              f"remove the record")

    def _encode_messages(self, ex: Example) -> tuple[list[int], list[bool]]:
        kw = self._kwargs(ex)
        messages = self._prepare(ex, ex.messages, "messages")
        if self.train_on != "completion":
            ids = list(self._apply(messages, tokenize=True, return_dict=True, **kw)["input_ids"])
            return ids, [True] * len(ids)
        self._check_assistant_turns(ex, messages)
        if self.generation_markers:
            out = self._apply(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **kw)
            mask = [bool(b) for b in out["assistant_masks"]]
            if not any(mask):
                raise self._no_marked_tokens(ex)
            return list(out["input_ids"]), mask
        text, spans = self.assistant_spans(ex, messages, kw)
        try:
            enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        except NotImplementedError:  # a slow (Python) tokenizer has no offsets: tokenize span by span
            return self._encode_segments(text, spans)
        return list(enc["input_ids"]), _spans_to_mask(enc["offset_mapping"], spans)

    def assistant_spans(self, ex: Example, messages: list[dict], kw: dict) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the character span of each assistant turn, found by prefixes
        (all of them from one render where the template provably allows it: trainer.data.prefix_renders)."""
        render = self._prefix_renders(messages, kw)
        if render is not None:
            def prompt_of(i: int) -> str:
                return render(i, True)

            def full_of(i: int) -> str:
                return render(i + 1, False)

            def text_of() -> str:
                return render(len(messages), False)
        else:
            def prompt_of(i: int) -> str:
                return self._render(messages[:i], add_generation_prompt=True, **kw)

            def full_of(i: int) -> str:
                return self._render(messages[: i + 1], **kw)

            def text_of() -> str:
                return self._render(messages, **kw)
        spans: list[tuple[int, int]] = []
        done = ""
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            prompt = prompt_of(i) if i else ""
            full = full_of(i)
            if not prompt.startswith(done) or not full.startswith(prompt):
                raise RecordError(f"{ex.where} field messages[{i}]: the chat template renders earlier turns "
                                  f"differently once later ones follow (it rewrites history, e.g. drops reasoning), "
                                  f"so the assistant tokens cannot be located; use a template with "
                                  f"{{% generation %}} markers (--chat-template FILE), or --train-on all")
            spans.append((len(prompt), len(full)))
            done = full
        text = text_of()
        if not text.startswith(done):
            raise RecordError(f"{ex.where} field messages: the chat template renders the assistant turns "
                              f"differently once later messages follow; use a template with {{% generation %}} "
                              f"markers (--chat-template FILE), or --train-on all")
        return text, spans

    def _template_source(self, tools: list[dict] | None) -> str:
        """The template text apply_chat_template renders these records with (`_apply`'s choice)."""
        template = self.training_template() if self.train_on == "completion" else None
        return self.tok.get_chat_template(template, tools)

    def _template_context(self, kw: dict) -> dict | None:
        """The variables apply_chat_template gives the template besides messages and add_generation_prompt;
        None when a record's template kwargs name one of its own parameters (it would take them itself)."""
        rest = {k: v for k, v in kw.items() if k != "tools"}
        if rest.keys() & _own_parameters():
            return None
        return {"tools": kw.get("tools"), "documents": None, **self.tok.special_tokens_map, **rest}

    def _prefix_renders(self, messages: list[dict], kw: dict) -> Callable[[int, bool], str] | None:
        context = self._template_context(kw)
        if context is None:
            return None
        return prefix_renders(self._template_source(kw.get("tools")), messages, context)

    def _encode_segments(self, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[bool]]:
        ids: list[int] = []
        mask: list[bool] = []
        at = 0
        for s, e in [*spans, (len(text), len(text))]:
            for piece, trained in ((text[at:s], False), (text[s:e], True)):
                if piece:
                    seg = self.tok(piece, add_special_tokens=False)["input_ids"]
                    ids += seg
                    mask += [trained] * len(seg)
            at = e
        return ids, mask


@functools.cache
def _own_parameters() -> frozenset[str]:
    """Names apply_chat_template (and transformers' renderer) take for themselves, not as template variables."""
    from transformers import PreTrainedTokenizerBase
    from transformers.utils.chat_template_utils import render_jinja_template

    return frozenset({*inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters,
                      *inspect.signature(render_jinja_template).parameters, "messages"}) - {"kwargs"}


def trl_training_template(tokenizer) -> str | None:
    """TRL's training version of the tokenizer's template (what TRL's SFTTrainer swaps in for assistant-only
    loss), or None: TRL is not installed here, or it has no training version of this template (TRL refuses
    it; this trainer then finds the turns by rendering prefixes, refusing templates that rewrite history)."""
    try:
        from trl.chat_template_utils import get_training_chat_template
    except Exception:  # noqa: BLE001 - TRL is not installed here: prefix rendering
        return None
    try:
        return get_training_chat_template(tokenizer)
    except ValueError:
        return None
