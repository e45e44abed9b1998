"""The stack's `aws:` settings, checked and handed to the program's explicit AWS provider.

An explicit provider (`aws.Provider(...)`) is configured only by its arguments: the stack's
`aws:profile`, `aws:allowedAccountIds`, `aws:assumeRoles`, ... configure Pulumi's default provider,
which this program never uses. So every `aws:` key is read here, checked against the settings
pulumi_aws's Provider takes (its own ProviderArgs, not a list kept here), and passed on as is.
"""
from __future__ import annotations

import difflib
import json
import typing
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Mapping

from facts.errors import Problems

# Static credentials in a stack file end up in version control and in every copy of the state.
REFUSED = {
    "accessKey": "static credentials",
    "secretKey": "static credentials",
    "token": "static credentials",
}
# Keys the program sets itself from other settings.
OWN = ("region",)


@lru_cache(maxsize=1)
def settings() -> Mapping[str, str]:
    """camelCase setting -> its kind (str, bool, int, list, object, list-of-objects), from pulumi_aws."""
    import inspect

    import pulumi_aws
    from pulumi import _types

    names = _types.input_type_py_to_pulumi_names(pulumi_aws.ProviderArgs)
    kinds = {}
    for python_name, parameter in inspect.signature(pulumi_aws.ProviderArgs.__init__).parameters.items():
        if python_name in names:
            kinds[names[python_name]] = _kind(parameter.annotation)
    return MappingProxyType(kinds)


def _kind(annotation: Any) -> str:
    first = typing.get_args(annotation)[0]
    origin = typing.get_origin(first)
    if origin is not None and "Sequence" in str(origin):
        inner = typing.get_args(typing.get_args(first)[0])[0]
        return "list" if inner is str else "list-of-objects"
    if isinstance(first, typing.ForwardRef):
        return "object"
    return {str: "str", bool: "bool", int: "int"}.get(first, "str")


def python_name(setting: str) -> str:
    import pulumi_aws
    from pulumi import _types

    return {v: k for k, v in _types.input_type_py_to_pulumi_names(pulumi_aws.ProviderArgs).items()}[setting]


def parse(raw: Mapping[str, Any], problems: Problems) -> Mapping[str, Any]:
    """The `aws:` settings of a stack as the provider takes them (camelCase -> value), region excluded."""
    known = settings()
    parsed: dict[str, Any] = {}
    for key in sorted(k for k in raw if k.startswith("aws:")):
        name, value = key[len("aws:"):], raw[key]
        if name in OWN:
            continue
        if name in REFUSED:
            problems.append(
                f"{key}: {REFUSED[name]} in the stack configuration end up in version control and in the state; "
                "remove it and use aws:profile (e.g. an IAM Identity Center profile after `aws sso login`), "
                "aws:assumeRoles, or the standard AWS environment variables")
            continue
        if name not in known:
            close = difflib.get_close_matches(name, list(known) + list(OWN), n=1, cutoff=0.6)
            hint = f"did you mean aws:{close[0]}?" if close else "see the pulumi-aws provider's configuration reference"
            problems.append(f"{key}: not a setting of the AWS provider, so it would be ignored; {hint}")
            continue
        value = _value(key, known[name], value, problems)
        if value is not None:
            parsed[name] = value
    if "defaultTags" in parsed:
        tags = parsed["defaultTags"].get("tags") if isinstance(parsed["defaultTags"], dict) else None
        if not isinstance(tags, dict):
            problems.append('aws:defaultTags: expected {"tags": {"key": "value", ...}}')
            parsed.pop("defaultTags")
    return MappingProxyType(parsed)


def _value(key: str, kind: str, value: Any, problems: Problems) -> Any:
    if isinstance(value, str) and kind != "str":
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            if kind == "list":
                value = [v.strip() for v in value.split(",") if v.strip()]
    expected = {"str": str, "bool": bool, "int": int, "list": list, "object": dict, "list-of-objects": list}[kind]
    if kind == "str" and isinstance(value, (int, float, bool)):
        value = str(value)
    if not isinstance(value, expected) or (kind == "int" and isinstance(value, bool)):
        problems.append(f"{key}: {value!r} is not {'an' if kind in ('int', 'object') else 'a'} "
                        f"{'integer' if kind == 'int' else kind}; see the pulumi-aws provider's configuration reference")
        return None
    if kind == "list":
        value = [str(v) for v in value]
    if kind == "list-of-objects" and not all(isinstance(v, dict) for v in value):
        problems.append(f"{key}: expected a list of objects, got {value!r}")
        return None
    if key in ("aws:allowedAccountIds", "aws:forbiddenAccountIds"):
        for account in value:
            if not (account.isdigit() and len(account) == 12):
                problems.append(f"{key}: {account!r} is not a 12-digit AWS account ID")
    return value


def provider_args(aws_settings: Mapping[str, Any], *, region: str, tags: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments for aws.Provider: every stack setting, the region, and the merged default tags."""
    args = {python_name(name): value for name, value in aws_settings.items() if name != "defaultTags"}
    user_default_tags = dict((aws_settings.get("defaultTags") or {}).get("tags") or {})
    args["region"] = region
    args["default_tags"] = {"tags": {**user_default_tags, **tags}}
    return args
