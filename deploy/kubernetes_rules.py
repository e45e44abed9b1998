"""pulumi-kubernetes' replace rules, read from its own Go source (deploy/data/pulumi-kubernetes/).

diff.go is the provider's file as it is at tag v4.32.0 (`forceNewProperties` and its `forceNew`
table: which fields of which group/version/kind force a replacement); excerpts.go holds the lines
of helm_release.go (a Release is replaced when its name or namespace changes) and provider.go (a
Patch resource only on metadata.name/namespace). The table is evaluated from the Go text, so a
vendored file from another version is read as that version says, and a shape this reader does not
know fails loudly instead of giving a rule by guess.
"""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "data" / "pulumi-kubernetes"
DIFF_GO = SOURCE / "diff.go"
EXCERPTS_GO = SOURCE / "excerpts.go"
TAG = "v4.32.0"  # the newest tag in the stored pulumi/pulumi-kubernetes snapshot; diff.go is the same at its HEAD
# The provider's defaults the program keeps (deploy/program.py sets neither): Secret and ConfigMap
# data are immutable, so a change replaces them (provider.go, Configure: "Default to false").
ENABLE_SECRET_MUTABLE = False
ENABLE_CONFIGMAP_MUTABLE = False

_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<name>[A-Za-z_][A-Za-z0-9_.]*)|(?P<punct>\.\.\.|[{}(),:+\[\]*=]))')


class RuleSourceError(ValueError):
    """The Go source has a shape this reader does not evaluate."""


def _tokens(text: str) -> list[str]:
    text = re.sub(r"//[^\n]*", "", text)
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            out.append(text[pos])  # anything else (operators of function bodies) as one character
            pos += 1
            continue
        out.append(match.group().strip())
        pos = match.end()
    return out


class _Reader:
    """Evaluates the Go subset of diff.go's tables: composite literals, append, calls, variables."""

    def __init__(self, tokens: list[str]):
        self.t = tokens
        self.vars: dict[str, int] = {}
        self.funcs: dict[str, tuple[bool, list[str]]] = {}
        self.values: dict[str, object] = {}
        for i, tok in enumerate(tokens):
            if tok == "var" and tokens[i + 2] == "=":
                self.vars[tokens[i + 1]] = i + 3
            elif tok == "func" and tokens[i + 1] != "(":
                self.funcs[tokens[i + 1]] = self._function(i + 1)

    def _function(self, i: int) -> tuple[bool, list[str]]:
        """(variadic, suffixes): `func f(prefix string) properties {... properties{prefix + "x", ...}`."""
        end = self.t.index(")", i)
        variadic = "..." in self.t[i:end]
        for j in range(self.t.index("{", end) + 1, len(self.t) - 1):
            if self.t[j] == "func":
                break
            if self.t[j:j + 2] == ["properties", "{"]:
                suffixes, k = [], j + 2
                while self.t[k] != "}":
                    if self.t[k + 1] == "+" and self.t[k + 2].startswith('"'):
                        suffixes.append(self.t[k + 2][1:-1])
                        k += 3
                    else:
                        raise RuleSourceError(f"function {self.t[i]}: an item that is not prefix + \"...\": "
                                              f"{self.t[k:k + 3]}")
                    k += self.t[k] == ","
                return variadic, suffixes
        return variadic, []

    def value(self, name: str):
        if name not in self.values:
            if name not in self.vars:
                raise RuleSourceError(f"{DIFF_GO.name}: no var {name}")
            self.values[name], _ = self.expr(self.vars[name])
        return self.values[name]

    def expr(self, i: int):
        """The value of the expression at token i, and the index after it."""
        tok = self.t[i]
        if tok.startswith('"'):
            return tok[1:-1], i + 1
        if self.t[i + 1] == "(" and (tok == "append" or tok in self.funcs):
            args, i = self._items(i + 2, ")")
            return (self._call(tok, args) if tok != "append" else
                    [x for a in args for x in (a if isinstance(a, list) else [a])]), i
        if tok in ("_groups", "_versions", "_kinds") and self.t[i + 1] == "{":
            return self._map(tok, i + 2)
        if tok == "properties" and self.t[i + 1] == "{":
            return self._items(i + 2, "}")
        if re.fullmatch(r"[A-Za-z_]\w*", tok):
            return self.value(tok), i + 1
        raise RuleSourceError(f"{DIFF_GO.name}: cannot read {' '.join(self.t[i:i + 5])!r}")

    def _items(self, i: int, close: str) -> tuple[list, int]:
        """Comma-separated expressions up to `close` (a spread `x...` counts as x)."""
        items = []
        while self.t[i] != close:
            item, i = self.expr(i)
            items.append(item)
            i += self.t[i] == "..."
            i += self.t[i] == ","
        return items, i + 1

    def _map(self, kind: str, i: int) -> tuple[dict, int]:
        out = {}
        while self.t[i] != "}":
            key, i = self.expr(i)
            if self.t[i] != ":":
                raise RuleSourceError(f"{kind}: expected ':' after {key!r}, got {self.t[i]!r}")
            out[key], i = self.expr(i + 1)
            i += self.t[i] == ","
        return out, i + 1

    def _call(self, name: str, args: list) -> list[str]:
        variadic, suffixes = self.funcs[name]
        if not variadic and len(args) != 1:
            raise RuleSourceError(f"{name} takes one prefix, got {args}")
        return [a + s for a in args for s in suffixes]


def _path(go_path: str) -> str:
    """".spec.containers[*].image" -> "spec.containers.image" (update_diff's paths skip list indexes)."""
    return go_path.removeprefix(".").replace("[*]", "")


@cache
def table() -> dict[str, dict[str, dict[str, list[str]]]]:
    """group -> version -> kind -> the kind's own force-new paths (beside metadata's), as diff.go lists them."""
    return _Reader(_tokens(DIFF_GO.read_text())).value("forceNew")


def _function_body(name: str) -> str:
    text = DIFF_GO.read_text()
    start = text.index(f"func (k *kubeProvider) {name}(")
    return text[start:text.index("\n}\n", start)]


@cache
def _special() -> dict[str, list[str]]:
    """forceNewProperties' own lists for Secrets and ConfigMaps whose data is immutable."""
    body = _function_body("forceNewProperties")
    found = {}
    for kind, test in (("Secret", "clients.IsSecret(obj)"), ("ConfigMap", "clients.IsConfigMap(obj)")):
        match = re.search(re.escape(test) + r"[^\n]*\n\s*props = append\(props, properties\{([^}]*)\}", body)
        if not match:
            raise RuleSourceError(f"forceNewProperties: no list after {test}")
        found[kind] = re.findall(r'"([^"]*)"', match[1])
    return found


@cache
def metadata_fields() -> list[str]:
    """What every object's identity is: metadataForceNewProperties(".metadata")."""
    if 'metadataForceNewProperties(".metadata")' not in _function_body("forceNewProperties"):
        raise RuleSourceError("forceNewProperties no longer starts from metadataForceNewProperties(\".metadata\")")
    variadic, suffixes = _Reader(_tokens(DIFF_GO.read_text())).funcs["metadataForceNewProperties"]
    return [".metadata" + s for s in suffixes]


def _excerpt_list(marker: str) -> list[str]:
    for line in EXCERPTS_GO.read_text().splitlines():
        if line.strip().startswith("forceNewFields := []string{") and marker in line:
            return re.findall(r'"([^"]*)"', line)
    raise RuleSourceError(f"{EXCERPTS_GO.name}: no forceNewFields line with {marker}")


def _gvk(token: str) -> tuple[str, str, str]:
    """A Pulumi type token (kubernetes:apps/v1:Deployment) as group, version, kind."""
    try:
        _, module, kind = token.split(":")
        group, version = module.rsplit("/", 1)
    except ValueError:
        raise RuleSourceError(f"{token!r} is not a kubernetes:<group>/<version>:<Kind> type token") from None
    return group, version, kind


def force_new(token: str) -> list[str]:
    """The input paths (update_diff's dotted form) whose change makes pulumi-kubernetes replace the object."""
    group, version, kind = _gvk(token)
    if (group, version, kind) == ("helm.sh", "v3", "Release"):
        return [_path(p) for p in _excerpt_list('".name"')]
    if kind.endswith("Patch"):
        return [_path(p) for p in _excerpt_list('".metadata.name"')]
    props = list(metadata_fields())
    kinds = table().get(group, {}).get(version)
    if kinds is not None:
        if kind == "Secret" and not ENABLE_SECRET_MUTABLE:
            props += _special()["Secret"]
        elif kind in kinds:
            props += kinds[kind]
        elif kind == "ConfigMap" and not ENABLE_CONFIGMAP_MUTABLE:
            props += _special()["ConfigMap"]
    return list(dict.fromkeys(_path(p) for p in props))
