"""GovCloud and China: every ARN and service principal the program writes is the region's partition's."""
from __future__ import annotations

import json
import re

import pytest

from deploy import offline
from infra import aws_rules
from tests.guards import nonempty

from .conftest import BASE

ARN = re.compile(r"arn:([a-z-]+):")


@pytest.fixture(scope="module", params=["cn-north-1", "us-gov-west-1"])
def stack(request):
    return request.param, offline.run({**BASE, "aws:region": request.param}, stack="dev")


def test_every_arn_is_in_the_regions_partition(stack):
    region, result = stack
    text = json.dumps([offline.plain(r.inputs) for r in result.resources])
    partitions = set(ARN.findall(text))
    assert set(nonempty(partitions, "ARNs")) == {aws_rules.partition(region)}
    assert aws_rules.partition(region) != "aws"


def test_service_principals_and_endpoints_are_the_partitions(stack):
    region, result = stack
    node_role = json.loads(result.one("aws:iam/role:Role", "cluster-node-role").inputs["assumeRolePolicy"])
    service = node_role["Statement"][0]["Principal"]["Service"]
    endpoint = result.one("aws:ec2/vpcEndpoint:VpcEndpoint").inputs["serviceName"]
    if region.startswith("cn-"):
        assert service == "ec2.amazonaws.com.cn" and endpoint == f"cn.com.amazonaws.{region}.s3"
    else:
        assert service == "ec2.amazonaws.com" and endpoint == f"com.amazonaws.{region}.s3"
