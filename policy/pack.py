"""The thin layer between rules.py and the Pulumi policy SDK.

pulumi_policy hands a validation its props wrapped in a proxy that raises on the first
unknown value it touches, which would hide every other finding of the rule; this
module unwraps the props into plain data with model.UNKNOWN in place of unknowns,
runs the rule, reports its violations and turns model.Unknown back into the SDK's
UnknownValueError (shown as an advisory "can't run policy during preview").
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
    proxy,
)

from policy import model, rules

PACK_NAME = "raytrain-eks-guardrails"

_SENTINELS = frozenset({
    proxy.UNKNOWN_BOOLEAN_VALUE, proxy.UNKNOWN_NUMBER_VALUE, proxy.UNKNOWN_STRING_VALUE, proxy.UNKNOWN_ARRAY_VALUE,
    proxy.UNKNOWN_ASSET_VALUE, proxy.UNKNOWN_ARCHIVE_VALUE, proxy.UNKNOWN_OBJECT_VALUE,
})


def plain(value: Any) -> Any:
    """Props as plain dicts and lists, unknown values replaced by model.UNKNOWN."""
    if isinstance(value, str):
        return model.UNKNOWN if value in _SENTINELS else value
    if isinstance(value, Mapping):
        target = _proxied(value)
        return {k: plain(target[k]) for k in target}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "_ListProxy":
        target = _proxied(value)
        return [plain(target[i]) for i in range(len(target))]
    return value


def _proxied(value: Any) -> Any:
    """The SDK's proxies give their raw target under the key "__target"."""
    try:
        return value["__target"]
    except (KeyError, TypeError, IndexError):
        return value


def _unknown(err: model.Unknown) -> proxy.UnknownValueError:
    return proxy.UnknownValueError(proxy.UNKNOWN_STRING_VALUE, err.path.split("."))


def stack_resources(args: StackValidationArgs) -> list[model.Resource]:
    resources = []
    for r in args.resources:
        props = plain(r.props)
        deps = {prop: tuple(d.urn for d in on) for prop, on in (r.property_dependencies or {}).items()}
        resources.append(model.Resource(r.resource_type, r.name, props, r.urn, props.get("id"), deps))
    return resources


def resource_validation(rule: rules.Rule) -> Callable[[ResourceValidationArgs, ReportViolation], None]:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        try:
            messages = rule.check((args.resource_type, plain(args.props)), args.get_config())
        except model.Unknown as err:
            raise _unknown(err) from None
        for message in messages:
            report_violation(message)
    return validate


def stack_validation(rule: rules.Rule) -> Callable[[StackValidationArgs, ReportViolation], None]:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        try:
            violations = rule.check(stack_resources(args), args.get_config())
        except model.Unknown as err:
            raise _unknown(err) from None
        for violation in violations:
            report_violation(violation.message, violation.urn or None)
    return validate


def config_schema(rule: rules.Rule) -> PolicyConfigSchema | None:
    if not rule.settings:
        return None
    return PolicyConfigSchema(properties={s.name: {**s.schema, "description": s.description} for s in rule.settings})


def policies() -> list:
    built = []
    for rule in rules.RULES:
        if rule.kind == "resource":
            built.append(ResourceValidationPolicy(
                name=rule.name, description=rule.description, validate=resource_validation(rule),
                config_schema=config_schema(rule), enforcement_level=EnforcementLevel.MANDATORY))
        else:
            built.append(StackValidationPolicy(
                name=rule.name, description=rule.description, validate=stack_validation(rule),
                config_schema=config_schema(rule), enforcement_level=EnforcementLevel.MANDATORY))
    return built
