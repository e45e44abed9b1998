"""The botocore request checker at `pulumi preview`: a resource transform the program registers (deploy.aws_requests).

The mock monitor records stack transforms but never runs them; these mocks run each one on every
resource as the engine does before registering it, so the whole program is checked as at preview.
"""
from __future__ import annotations

import pulumi
import pytest

from deploy import aws_requests, change_table, offline, program
from deploy import config as stack_config
from tests.guards import nonempty

# A stack as a user deploys it: the dev file's documentation-range CIDR is refused before any request.
STACK = {**change_table.stack("dev"), "raytrain-eks:apiAccessCidrs": ["198.51.1.10/32"]}


class TransformingMocks(offline.RecordingMocks):
    def __init__(self, region: str):
        super().__init__(region)
        self.transforms: list = []
        self.transformed: list[str] = []

    def register_transform(self, transform) -> None:
        self.transforms.append(transform)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        for transform in self.transforms:
            self.transformed.append(args.typ)
            transform(pulumi.ResourceTransformArgs(custom=args.custom, type_=args.typ, name=args.name,
                                                   props=args.inputs, opts=pulumi.ResourceOptions()))
        return super().new_resource(args)


def preview(raw: dict, *, offline_plan: bool = False) -> TransformingMocks:
    mocks = TransformingMocks("us-east-1")
    mocks.assume_reservations_from(stack_config.load(raw, stack="dev", project="raytrain-eks"))
    offline.run(raw, stack="dev", mocks=mocks, program=lambda: program.main(offline=offline_plan))
    return mocks


def test_the_program_checks_every_aws_request_at_preview():
    mocks = preview(STACK)
    assert len(mocks.transforms) == 1
    aws_types = {r.type for r in mocks.resources if not r.type.startswith(aws_requests.NOT_AWS)}
    assert set(nonempty(aws_types, "AWS resource types")) <= set(mocks.transformed)


def test_a_request_aws_would_refuse_stops_the_preview_naming_the_resource_and_member(monkeypatch):
    original = aws_requests.MAPPINGS["aws:eks/cluster:Cluster"]

    def too_long_name(i, n, t):
        return [(s, o, {**p, "name": "x" * 101}) for s, o, p in original(i, n, t)]
    monkeypatch.setitem(aws_requests.MAPPINGS, "aws:eks/cluster:Cluster", too_long_name)
    with pytest.raises(Exception, match=r"AWS would refuse these requests") as err:
        preview(STACK)
    assert "aws:eks/cluster:Cluster cluster-eks: eks CreateCluster: eks.CreateCluster.name: length 101" in str(err.value)


def test_the_offline_plan_checks_the_requests_itself():
    """deploy.plan runs aws_requests.problems on the whole plan; the program registers no transform there."""
    assert preview(STACK, offline_plan=True).transforms == []


def test_a_value_known_only_during_apply_is_not_refused():
    """The engine sends another resource's computed output as None at preview."""
    found = aws_requests.resource_problems("aws:iam/role:Role", "r", {"name": "bad name", "assumeRolePolicy": None}, {})
    (problem,) = found
    assert problem.startswith("aws:iam/role:Role r: iam CreateRole: iam.CreateRole.RoleName: 'bad name' does not match")
    assert aws_requests.resource_problems("aws:iam/role:Role", "r", {"name": "ok", "assumeRolePolicy": None}, {}) == []
    # a request whose shape needs an unknown structure is left to the offline plan
    assert aws_requests.resource_problems(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration", "e",
        {"bucket": None, "rules": None}, {}) == []


def test_the_wires_numbers_are_read_as_integers():
    logs = {"name": "/aws/eks/c/cluster", "retentionInDays": 30.0, "tags": {"owner": "ml"}}
    assert aws_requests.resource_problems("aws:cloudwatch/logGroup:LogGroup", "l", logs, {}) == []
    assert "retentionInDays: expected an integer" in " ".join(aws_requests.resource_problems(
        "aws:cloudwatch/logGroup:LogGroup", "l", {**logs, "retentionInDays": 30.5}, {}))
