"""Every prefix rendering of a conversation from ONE render, for chat templates where that is provable.

Finding a template's assistant turns without {% generation %} markers takes the rendering of
each prefix of the conversation (trainer.data.formats.Renderer.assistant_spans): ~2 renders per
assistant turn. For a "loop-local" template the prefixes follow from one render. Such a template
is, at its top level, PRE, one `{% for m in messages %}BODY{% endfor %}`, TAIL, where

    - `messages` is read only by that loop and as `messages[0]` (the same in every non-empty prefix);
    - BODY reads the loop only as loop.first / loop.index / loop.index0 (nothing looks ahead);
    - `add_generation_prompt` is read only in TAIL, and TAIL assigns nothing;
    - nothing carries state out of an iteration (no namespace(), cycler(), joiner(), macros, imports,
      {% break %}; Jinja scopes a loop's {% set %} to its iteration, and the sandbox is immutable).

Rendering messages[:k] is then PRE + BODY(m_0) + ... + BODY(m_k-1) + TAIL(add_generation_prompt),
each part computed from the same values as in the full render. One render of the template with a
marker character before each iteration, after the loop, and a second TAIL with
add_generation_prompt true gives all the parts. Any other template (or a record whose text holds
the marker, or whose render raises) gets None: the caller renders the prefixes one by one.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

MARK = "\ufdd0"  # a Unicode noncharacter: one character, so template text and content cannot form it by accident
_LOOP_ATTRS = frozenset({"first", "index", "index0"})
_WATCHED = frozenset({"messages", "add_generation_prompt", "loop"})
_STATEFUL = frozenset({"namespace", "cycler", "joiner"})


def _forbidden():
    from jinja2 import nodes

    return (nodes.Macro, nodes.CallBlock, nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends,
            nodes.Block, nodes.NSRef, nodes.ExprStmt, nodes.Break, nodes.Scope, nodes.OverlayScope,
            nodes.EvalContextModifier, nodes.ScopedEvalContextModifier)


def _reads_ok(node, region: str, in_inner_loop: bool, parent=None) -> bool:
    """Every name the nodes under `node` read is one the loop-local rule allows in `region` (pre, body, tail)."""
    from jinja2 import nodes

    if isinstance(node, nodes.For):
        # a nested loop: its iterable is read in the enclosing scope, its body's `loop` is its own
        outer = [node.iter, node.target] + ([node.test] if node.test is not None else [])
        return (all(_reads_ok(n, region, in_inner_loop, node) for n in outer)
                and all(_reads_ok(n, region, True, node) for n in [*node.body, *node.else_]))
    if isinstance(node, nodes.Name) and node.name in _WATCHED and node.ctx != "load":
        return False  # the template assigns one of the names the rule follows
    if isinstance(node, nodes.Name) and node.ctx == "load":
        if node.name == "messages":
            return (isinstance(parent, nodes.Getitem) and parent.node is node and isinstance(parent.arg, nodes.Const)
                    and parent.arg.value == 0 and type(parent.arg.value) is int)
        if node.name == "add_generation_prompt":
            return region == "tail"
        if node.name == "loop" and not in_inner_loop:
            return region == "body" and isinstance(parent, nodes.Getattr) and parent.attr in _LOOP_ATTRS
        return True
    if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name) and node.node.name in _STATEFUL:
        return False
    return all(_reads_ok(child, region, in_inner_loop, node) for child in node.iter_child_nodes())


def _instrumented(template: str) -> Any:
    """The template with MARK before each iteration, after the loop and before a second, generation-prompt TAIL;
    or None when the template is not loop-local."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer
    from transformers.utils.chat_template_utils import _compile_jinja_template

    env = _compile_jinja_template(template).environment
    try:
        ast, again = env.parse(template), env.parse(template)  # again: a second TAIL (nodes hold the environment)
    except Exception:  # noqa: BLE001 - the caller's own rendering reports a template that does not parse
        return None
    loops = [i for i, n in enumerate(ast.body) if isinstance(n, nodes.For) and isinstance(n.iter, nodes.Name)
             and n.iter.name == "messages"]
    if len(loops) != 1 or any(True for _ in ast.find_all(_forbidden())):
        return None
    at = loops[0]
    loop, pre, tail = ast.body[at], ast.body[:at], ast.body[at + 1:]
    if loop.else_ or loop.test is not None or loop.recursive or not isinstance(loop.target, nodes.Name):
        return None
    if any(True for n in tail for _ in n.find_all((nodes.Assign, nodes.AssignBlock))):
        return None
    if not (all(_reads_ok(n, "pre", False) for n in pre) and all(_reads_ok(n, "body", False) for n in loop.body)
            and all(_reads_ok(n, "tail", False) for n in tail)):
        return None

    class _Prompted(NodeTransformer):
        def visit_Name(self, node):
            if node.name == "add_generation_prompt" and node.ctx == "load":
                return nodes.Const(True, lineno=node.lineno)
            return node

    def mark():
        return nodes.Output([nodes.TemplateData(MARK, lineno=1)], lineno=1)

    loop.body = [mark(), *loop.body]
    prompted_tail = [_Prompted().visit(n) for n in again.body[at + 1:]]
    body = [*pre, loop, mark(), *tail, mark(), *prompted_tail]
    code = env.compile(nodes.Template(body, lineno=1))
    return env.template_class.from_code(env, code, env.make_globals(None))


_cached = lru_cache(maxsize=16)(_instrumented)


def prefix_renders(template: str, messages: list[dict], context: dict) -> Callable[[int, bool], str] | None:
    """render(k, add_generation_prompt) -> the template's rendering of messages[:k] (k >= 1), from one render;
    None when the template is not loop-local, the render raises or its text holds MARK.

    `context`: every other variable the template is rendered with (tools, documents, special tokens, the
    record's template kwargs), as transformers passes them."""
    compiled = _cached(template)
    if compiled is None or not messages:
        return None
    try:
        out = compiled.render(messages=messages, add_generation_prompt=False, **context)
    except Exception:  # noqa: BLE001 - the caller renders prefix by prefix and reports what that finds
        return None
    pieces = out.split(MARK)
    if len(pieces) != len(messages) + 3:
        return None
    *parts, tail, prompted = pieces
    text = "".join(parts)
    ends = [len(parts[0])]
    for body in parts[1:]:
        ends.append(ends[-1] + len(body))

    def render(k: int, add_generation_prompt: bool) -> str:
        return text[:ends[k]] + (prompted if add_generation_prompt else tail)

    return render
