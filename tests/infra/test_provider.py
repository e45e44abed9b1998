"""Every `aws:` setting of the stack reaches the explicit providers that create and look up resources.

An explicit provider takes nothing from the stack's configuration by itself; the settings it can take
are read from pulumi_aws's own ProviderArgs, so a setting pulumi_aws adds is covered without an edit here.
"""
from __future__ import annotations

import json

import pytest

from deploy import offline
from infra import aws_provider

from .conftest import BASE

OBJECTS = {
    "assumeRoleWithWebIdentity": {"roleArn": "arn:aws:iam::123456789012:role/ci", "sessionName": "ci"},
    "defaultTags": {"tags": {"owner": "platform"}},
    "ignoreTags": {"keyPrefixes": ["kubernetes.io/"]},
    "assumeRoles": [{"roleArn": "arn:aws:iam::123456789012:role/deployer", "sessionName": "pulumi"}],
    "endpoints": [{"s3": "https://s3.us-east-1.amazonaws.com"}],
    "allowedAccountIds": ["123456789012"],
    "forbiddenAccountIds": ["210987654321"],
}
PASSED = sorted(set(aws_provider.settings()) - set(aws_provider.REFUSED) - set(aws_provider.OWN))


def sample(name: str, kind: str):
    if name in OBJECTS:
        return OBJECTS[name]
    return {"str": f"{name}-value", "bool": True, "int": 7, "list": [f"{name}-1", f"{name}-2"]}[kind]


SETTINGS = {name: sample(name, aws_provider.settings()[name]) for name in PASSED}


@pytest.fixture(scope="module")
def providers() -> dict[str, dict]:
    result = offline.run({**BASE, **{f"aws:{k}": v for k, v in SETTINGS.items()}})
    return {p.name: p.inputs for p in result.of_type("pulumi:providers:aws")}


def test_the_settings_come_from_pulumi_aws_itself():
    kinds = aws_provider.settings()
    assert {"profile", "allowedAccountIds", "assumeRoles", "sharedConfigFiles", "stsRegion"} <= set(kinds)
    assert (kinds["profile"], kinds["allowedAccountIds"], kinds["assumeRoles"], kinds["maxRetries"],
            kinds["skipMetadataApiCheck"], kinds["defaultTags"]) == ("str", "list", "list-of-objects", "int",
                                                                    "bool", "object")
    assert len(PASSED) >= 30


@pytest.mark.parametrize("name", PASSED)
def test_each_aws_setting_arrives_at_both_providers(providers, name):
    assert set(providers) == {"aws", "aws-preflight"}
    for inputs in providers.values():
        arrived = inputs[name]
        value = arrived if isinstance(SETTINGS[name], str) else json.loads(arrived)  # provider inputs are JSON
        if name == "defaultTags":
            assert value["tags"]["owner"] == "platform" and value["tags"]["stack"] == "dev"
        else:
            assert value == SETTINGS[name], name


def test_region_is_the_stacks():
    result = offline.run({**BASE, "aws:region": "eu-west-1"})
    assert {p.inputs["region"] for p in result.of_type("pulumi:providers:aws")} == {"eu-west-1"}


def test_static_credentials_are_refused_and_unknown_settings_named():
    from deploy.config import ConfigError

    with pytest.raises(ConfigError) as info:
        offline.run({**BASE, "aws:secretKey": "x", "aws:profil": "dev", "aws:assumeRole": {"roleArn": "r"}})
    problems = info.value.problems
    assert any(p.startswith("aws:secretKey: static credentials") and "aws:profile" in p for p in problems)
    assert any(p.startswith("aws:profil: not a setting of the AWS provider") and "did you mean aws:profile?" in p
               for p in problems)
    assert any(p.startswith("aws:assumeRole: not a setting") and "aws:assumeRoles" in p for p in problems)
