"""The stack file itself: every mistake in Pulumi.<stack>.yaml is exit 2 from the offline plan, naming the
file, the line or the key and the fix; none is ignored, none ends in a traceback."""
from __future__ import annotations

import pytest

from deploy import plan

HEADER = "config:\n  aws:region: us-east-1\n  raytrain-eks:apiAccessCidrs:\n    - 203.0.113.10/32\n"

CASES = [
    # (stack file text, words the error must hold)
    (HEADER + "  raytrain-eks:gpuNodeCount: 2\n  raytrain-eks:gpuNodeCount: 4\n",
     ["Pulumi.s.yaml", "line 6: 'raytrain-eks:gpuNodeCount' is given twice (also on line 5)"]),
    (HEADER + "  raytrain-eks:gpuNodeType: [p5\n", ["Pulumi.s.yaml", "line 6", "not valid YAML"]),
    ("config:\n  - aws:region\n", ["line 1: config: is a list", "namespace:key: value"]),
    (HEADER + "  raytrain-eks:gpuNodeType: !Ref GpuType\n", ["line 5", "'!Ref'", "remove the tag"]),
    (HEADER + "  raytrain-eks:gpuNodeType:\n    secure: AAABAJ==\n",
     ["raytrain-eks:gpuNodeType (Pulumi.s.yaml line 5): a secure: value", "cannot decrypt it",
      "only its key was checked", "without --secret"]),
    (HEADER + "  aws:assumeRoles:\n    secure: AAABAJ==\n", ["aws:assumeRoles", "run `pulumi preview`"]),
    (HEADER + "  gpuNodeType: p5.48xlarge\n",
     ["gpuNodeType: has no namespace", "raytrain-eks:gpuNodeType", "Pulumi.s.yaml line 5"]),
    (HEADER + "  raytrain_eks:gpuNodeType: p5.48xlarge\n",
     ["raytrain_eks:gpuNodeType: namespace 'raytrain_eks'", "did you mean raytrain-eks:gpuNodeType?", "line 5"]),
    (HEADER + "  aws:regin: eu-west-1\n", ["aws:regin: not a setting of the AWS provider", "did you mean aws:region?"]),
    (HEADER.replace("us-east-1", "us-north-1"), ["aws:region: 'us-north-1' is not a region where AWS offers EKS",
                                                  "line 2"]),
    ("just a string\n", ["holds a str, not a mapping"]),
    # issue 29: YAML 1.1 surprises, bytes that are not UTF-8, nesting and alias bombs end in one error line
    (HEADER + "  raytrain-eks:gpuNodeCount: 010\n", ["Pulumi.s.yaml", "line 5: '010' is a number YAML 1.1 reads",
                                                    "write it in plain decimal, or quote it"]),
    (HEADER + "  raytrain-eks:enableEfaSupport: yes\n", ["line 5: 'yes' is a boolean only in YAML 1.1", "write true or false"]),
    (HEADER + "  raytrain-eks:gpuNodeType: p5\udce9\n", ["line 5: byte b'\\xe9' is not UTF-8",
                                                                           "save the file as UTF-8"]),
    (HEADER + "  raytrain-eks:nodePools: " + "[" * 5000 + "]" * 5000 + "\n",
     ["line 5: nested more than 64 levels deep"]),
    (HEADER + "  a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"  {chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)),
     ["holds more than 100,000 values with its aliases (*name) expanded"]),
    (HEADER + "  raytrain-eks:gpuNode\u200bType: p5.48xlarge\n",
     ["unknown configuration key; did you mean raytrain-eks:gpuNodeType?", "U+200B ZERO WIDTH SPACE at position 7"]),
]


@pytest.mark.parametrize("text,words", CASES, ids=[f"case-{i}" for i in range(len(CASES))])
def test_stack_file_mistakes_exit_2_naming_where_and_the_fix(tmp_path, monkeypatch, capsys, text, words):
    (tmp_path / "Pulumi.s.yaml").write_bytes(text.encode(errors="surrogateescape"))
    monkeypatch.setattr(plan, "REPO_ROOT", tmp_path)
    assert plan.main(["--stack", "s", "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.startswith("error: ")
    for word in words:
        assert word in captured.err, captured.err
    assert not (tmp_path / "out").exists()


def test_a_stack_file_that_is_a_folder_is_named_not_a_traceback(tmp_path, monkeypatch, capsys):
    (tmp_path / "Pulumi.s.yaml").mkdir()
    monkeypatch.setattr(plan, "REPO_ROOT", tmp_path)
    assert plan.main(["--stack", "s"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Pulumi.s.yaml") and "is a folder, not a stack file" in err and "Traceback" not in err


def test_the_shipped_stacks_plan_and_flag_their_placeholder(capsys):
    for stack in ("dev", "p5"):
        assert plan.main(["--stack", stack]) == 0
        out = capsys.readouterr().out
        assert "placeholder: raytrain-eks:apiAccessCidrs: 203.0.113.10/32 is a documentation range" in out
        assert "(`pulumi preview` refuses it)" in out
