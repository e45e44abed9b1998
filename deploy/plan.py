"""Offline plan: what `pulumi up` would create for a stack, without AWS or the Pulumi CLI.

    python -m deploy.plan --stack dev [--out DIR] [--compare-to EARLIER_DIR]

Reads Pulumi.<stack>.yaml, runs the whole program under mocks, prints what would be
created and the estimated hourly cost. IDs and cloud-assigned values are
placeholders; `pulumi preview` against your account shows the real diff.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

from deploy import aws_requests, offline, stack_file, update_diff
from deploy import config as stack_config
from deploy.config import ConfigError
from deploy.stack_file import StackFileError
from facts import errors
from facts import outputs as names
from infra.cost import MONITORING_USAGE, USAGE_BASED, cost_warnings, parts
from infra.node_pools import NodePool
from workloads.charts import SCALE_DOWN_UNNEEDED_MINUTES
from workloads.image import is_placeholder

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTICE = ("Offline plan: resources are declared under mocks; IDs, ARNs and cloud-assigned values are "
          "placeholders. Run `pulumi preview` against your AWS account for the real diff.")

# The inputs worth a glance in the table, per resource type.
KEY_SETTINGS = {
    "aws:ec2/vpc:Vpc": ("cidrBlock",),
    "aws:ec2/subnet:Subnet": ("availabilityZone", "cidrBlock"),
    "aws:eks/cluster:Cluster": ("name", "version", "vpcConfig.publicAccessCidrs", "accessConfig.authenticationMode"),
    "aws:eks/nodeGroup:NodeGroup": ("instanceTypes", "amiType", "capacityType", "scalingConfig.desiredSize",
                                    "scalingConfig.minSize", "scalingConfig.maxSize", "labels", "taints"),
    "aws:autoscaling/tag:Tag": ("tag.key", "tag.value"),
    "aws:ec2/launchTemplate:LaunchTemplate": ("networkInterfaces", "metadataOptions.httpTokens", "placement.groupName"),
    "aws:ec2/placementGroup:PlacementGroup": ("strategy",),
    "aws:eks/addon:Addon": ("addonName",),
    "aws:s3/bucket:Bucket": ("bucket", "bucketPrefix"),
    "aws:ec2/vpcEndpoint:VpcEndpoint": ("serviceName", "vpcEndpointType"),
    "aws:cloudwatch/logGroup:LogGroup": ("name", "retentionInDays"),
    "kubernetes:helm.sh/v3:Release": ("chart", "version", "namespace"),
    "kubernetes:ray.io/v1:RayCluster": ("metadata.name",),
    "pulumi-python:dynamic/raytrain:PinnedImage": ("image",),
}
K8S_OBJECT_FIELDS = ("apiVersion", "kind", "metadata", "spec", "data", "stringData", "type", "rules", "subjects",
                     "roleRef", "automountServiceAccountToken", "value", "globalDefault", "preemptionPolicy",
                     "description")


def stack_path(stack: str, root: Path | None = None) -> Path:
    root = root or REPO_ROOT
    path = root / f"Pulumi.{stack}.yaml"
    if not path.exists():
        known = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in root.glob("Pulumi.*.yaml"))
        raise errors.UserError(f"--stack {stack}: {path.name} not found; known stacks: {', '.join(known) or 'none'}")
    return path


def _get(inputs: dict, dotted: str):
    value: Any = inputs
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _summary(resource: offline.Recorded) -> str:
    parts = []
    for key in KEY_SETTINGS.get(resource.type, ()):
        value = offline.plain(_get(resource.inputs, key))
        if value is None:
            continue
        if key == "networkInterfaces":
            value = f"{len(value)} ({', '.join(sorted({i.get('interfaceType', 'interface') for i in value}))})"
        parts.append(f"{key.split('.')[-1]}={value if isinstance(value, str) else json.dumps(value)}")
    return " ".join(parts)


def short_type(typ: str) -> str:
    """aws:ec2/subnet:Subnet -> aws:ec2.Subnet"""
    package, module, kind = (typ.split(":") + ["", ""])[:3]
    return f"{package}:{module.split('/')[0]}.{kind}" if kind else typ


def render_table(result: offline.PlanResult) -> str:
    rows = [(short_type(r.type), r.name, _summary(r)) for r in result.resources if not r.type.startswith("pulumi:providers")]
    width_type = max(len(r[0]) for r in rows)
    width_name = max(len(r[1]) for r in rows)
    lines = [f"{'TYPE':<{width_type}}  {'NAME':<{width_name}}  KEY SETTINGS"]
    lines += [f"{t:<{width_type}}  {n:<{width_name}}  {s}" for t, n, s in rows]
    return "\n".join(lines)


def idle_gpu_hint(pools: Sequence[NodePool]) -> str | None:
    """How to stop the idle bill of the GPU pools that keep their nodes, in the keys this stack file uses.

    The shorthand's `gpu` pool scales with raytrain-eks:scaleToZero (gpuNodeCount becomes its maximum); a
    pool of nodePools with its own scaleToZero and maxSize instead of desiredSize (the shorthand keys are
    refused there). A pool with a capacity reservation bills anyway, and scaleToZero is refused with one.
    """
    gpu_pools = [p for p in pools if p.gpus]
    fixed = [p for p in gpu_pools if not p.scale_to_zero]
    if not fixed:
        return None
    fixes = []
    for pool in (p for p in fixed if not p.capacity_reservation_id):
        if pool.key("maxSize") == pool.key("desiredSize"):  # one key sizes the pool: the shorthand's gpuNodeCount
            fixes.append(f"set {pool.key('scaleToZero')} to true ({pool.key('maxSize')} becomes the maximum)")
        else:
            fixes.append(f"set {pool.key('scaleToZero')} to true and {pool.key('maxSize')} to {pool.max_size} in "
                         f"place of {pool.key('desiredSize')}")
    whose = ("The GPU nodes" if len(fixed) == len(gpu_pools) else
             f"The GPU nodes of pool{'s' if len(fixed) > 1 else ''} {', '.join(p.name for p in fixed)}")
    reserved = [p.name for p in fixed if p.capacity_reservation_id]
    why = (f" (the capacity reservation of {', '.join(reserved)} bills whether its instances run or not)"
           if reserved else "")
    fix = f"{'; '.join(fixes)}, or `pulumi destroy`" if fixes else "`pulumi destroy` stops that"
    return f"  {whose} bill while idle too{why}: {fix}."


def render_cost(cost: dict[str, Any], *, idle_minutes: int | None = None, pools: Sequence[NodePool] = (),
                monitoring: str = "none") -> str:
    """The parts and the total; with scale-to-zero also the idle price and how soon idle GPUs stop billing;
    for the GPU pools that keep their nodes, how to stop that (idle_gpu_hint)."""
    lines = [f"Estimated cost per hour (us-east-1 list prices; GPU nodes: {cost.get('pricing', 'On-Demand list price')}):"]
    lines += [f"  {name:<17} ${cost[name]:>8.2f}" for name in parts(cost)]
    billed = [*USAGE_BASED, *([MONITORING_USAGE[monitoring]] if monitoring in MONITORING_USAGE else [])]
    usage = "  Not included, billed by use: " + "; ".join(billed) + "."
    hint = idle_gpu_hint(pools)
    if cost.get("mode") != "scale-to-zero":
        lines.append(f"  {'total':<17} ${cost['total']:>8.2f}  (~${cost['total'] * 24:,.0f}/day while up)")
        lines.append(usage)
        lines += [hint] if hint else []
        return "\n".join(lines)
    lines.append(f"  {'total':<17} ${cost['total']:>8.2f}  while training, every GPU node up")
    lines.append(f"  {'idle total':<17} ${cost['idleTotal']:>8.2f}  between jobs, GPU nodes scaled to zero "
                 f"(~${cost['idleTotal'] * 24:,.0f}/day)")
    lines.append(usage)
    lines += [hint] if hint else []
    if idle_minutes is not None:
        lines.append(f"  Idle GPU nodes stop billing about {idle_minutes + SCALE_DOWN_UNNEEDED_MINUTES} min after the "
                     f"last Ray task ({idle_minutes} min Ray idle timeout + {SCALE_DOWN_UNNEEDED_MINUTES} min "
                     "Cluster Autoscaler scale-down), plus instance shutdown.")
    return "\n".join(lines)


def ray_idle_minutes(result: offline.PlanResult) -> int | None:
    """The KubeRay autoscaler's idle timeout, from the declared RayCluster; None without autoscaling."""
    for cluster in result.of_type("kubernetes:ray.io/v1:RayCluster"):
        seconds = _get(cluster.inputs, "spec.autoscalerOptions.idleTimeoutSeconds")
        if seconds is not None:
            return round(seconds / 60)
    return None


def kubernetes_objects(result: offline.PlanResult) -> list[dict]:
    """Every Kubernetes object the program declares, as the API server would receive it.

    Not the CRDs: they are the chart archive's own crds/ files (workloads.crds), which the offline plan
    declares by digest."""
    return [{k: offline.plain(v) for k, v in r.inputs.items() if k in K8S_OBJECT_FIELDS}
            for r in result.resources
            if r.type.startswith("kubernetes:") and "apiVersion" in r.inputs and "kind" in r.inputs
            and r.type != update_diff.CRD]


def helm_releases(result: offline.PlanResult) -> list[dict]:
    return [{"name": r.inputs.get("name", r.name), "chart": r.inputs.get("chart"), "version": r.inputs.get("version"),
             "repository": _get(r.inputs, "repositoryOpts.repo"), "namespace": r.inputs.get("namespace"),
             "values": offline.plain(r.inputs.get("values", {}))}
            for r in result.of_type("kubernetes:helm.sh/v3:Release")]


def options(result: offline.PlanResult, resource: offline.Recorded) -> tuple[str, dict]:
    """The engine URN and the resource options the engine acts on at the next `pulumi up`."""
    found = [r for r in result.registrations.values() if r.type == resource.type and r.name == resource.name]
    if len(found) != 1:
        return "", {}
    reg = found[0]
    urn = offline.engine_urn(reg.urn)
    return urn, {"protect": reg.protect, "retainOnDelete": reg.retain_on_delete,
                 "deleteBeforeReplace": reg.delete_before_replace, "ignoreChanges": list(reg.ignore_changes),
                 "replaceOnChanges": list(reg.replace_on_changes),
                 "aliases": sorted(result.old_urns(reg.urn) - {urn})}


def records(result: offline.PlanResult) -> list[dict]:
    """Each resource as resources.json keeps it: what the diff tool (deploy.update_diff) compares."""
    out = []
    for r in result.resources:
        urn, opts = options(result, r)
        out.append({"type": r.type, "name": r.name, "urn": urn, "id": r.id, "inputs": offline.plain(r.inputs),
                    "options": opts})
    return out


def write_out(result: offline.PlanResult, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "resources.json"]
    written[0].write_text(json.dumps({
        "notice": NOTICE,
        "resources": records(result),
        "outputs": {k: ("[secret]" if k in names.SECRET else v) for k, v in result.outputs.items()},
    }, indent=2, sort_keys=True, default=str))
    for subdir, docs, name_of in (
        ("kubernetes", kubernetes_objects(result), lambda d: f"{d['kind'].lower()}-{d['metadata']['name']}"),
        ("helm", helm_releases(result), lambda d: f"release-{d['name']}"),
    ):
        (out / subdir).mkdir(exist_ok=True)
        for doc in docs:
            path = out / subdir / f"{name_of(doc)}.yaml"
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            written.append(path)
    return written


def read_earlier(plan_dir: Path) -> list[dict]:
    """The resources of an earlier `--out`; a clear error when the folder holds none."""
    try:
        return update_diff.load(plan_dir)
    except (OSError, ValueError, KeyError) as err:
        raise errors.UserError(f"--compare-to {plan_dir}: no readable resources.json there ({err}); name the folder an "
                               "earlier `python -m deploy.plan --out DIR` wrote") from None


def main(argv: list[str] | None = None) -> int:
    """`python -m deploy.plan`: 0, or 2 with `error: ...` (every problem, each with its fix) on bad input."""
    return errors.run(plan, argv)


def plan(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", default="dev", help="reads Pulumi.<stack>.yaml (default: dev)")
    parser.add_argument("--out", type=Path, help="write resources.json and one YAML per Kubernetes object here")
    parser.add_argument("--compare-to", type=Path, metavar="PLAN_DIR",
                        help="an earlier plan's --out folder: show what `pulumi up` would do to a stack deployed from it")
    args = parser.parse_args(argv)
    if args.out and args.out.exists() and not args.out.is_dir():
        raise errors.UserError(f"--out {args.out}: a file, not a folder; name a folder (it is created if missing)")
    earlier = read_earlier(args.compare_to) if args.compare_to else None
    stack = stack_file.read(stack_path(args.stack))
    if problems := stack_file.secret_problems(stack, stack_config.PROJECT):
        raise StackFileError(stack.path, problems)
    try:
        cfg = stack_config.load(stack.config, stack=args.stack)
    except ConfigError as err:
        raise ConfigError([stack_file.locate(p, stack) for p in err.problems]) from None
    result = offline.run(stack.config, stack=args.stack)
    if refused := aws_requests.problems(result):
        raise errors.UserError(f"{stack.path.name}: AWS would refuse these requests of the stack (checked against "
                               "botocore's service models):\n" + "\n".join(f"  - {p}" for p in refused))
    print(NOTICE)
    print()
    print(render_table(result))
    print()
    print(render_cost(result.outputs[names.ESTIMATED_COST_PER_HOUR], idle_minutes=ray_idle_minutes(result),
                      pools=cfg.node_pools, monitoring=cfg.monitoring))
    warnings = [*(f"placeholder: {p} (`pulumi preview` refuses it)" for p in cfg.placeholders),
                *cost_warnings(cfg.node_pools, cfg.cost_warning_per_day)]
    for pool in (p for p in cfg.node_pools if p.capacity_reservation_id):
        zone = result.outputs[names.GPU_AVAILABILITY_ZONE] if pool.efa and not pool.availability_zone else (
            pool.availability_zone)
        warnings.append(f"offline: capacity reservation {pool.capacity_reservation_id} is assumed to hold "
                        f"{pool.max_size} x {pool.instance_type} in {zone}; `pulumi preview` reads the real one")
    if warnings:
        print("\nWarnings:")
        print("\n".join(f"  - {w}" for w in warnings))
    if is_placeholder(result.outputs.get(names.DLC_IMAGE, "")):
        print(f"\nDLC image: {result.outputs[names.DLC_IMAGE]}\n  (placeholder digest: `pulumi preview` resolves the "
              "configured tag through the registry and keeps the digest in the stack state)")
    if earlier is not None:
        print()
        print(update_diff.render(update_diff.compare(earlier, records(result))))
    if args.out:
        try:
            written = write_out(result, args.out)
        except OSError as err:
            raise errors.UserError(f"--out {args.out}: cannot write there ({err.strerror}); name a folder you can "
                                   "write to") from None
        print(f"\nWrote {len(written)} files to {args.out}/ (resources.json, kubernetes/, helm/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
