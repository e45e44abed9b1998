"""What `pulumi up` would do to a running stack: this plan against an earlier plan's resources.json.

Pure and offline: each resource is matched to its old self by URN or alias, the engine's rules are
replayed (ignoreChanges substitutes the old input; replaceOnChanges; create-before-delete unless
deleteBeforeReplace) and the providers' replace rules (deploy/data/replace_rules.json, read from
their source; Kubernetes types' from pulumi-kubernetes' diff.go, deploy.kubernetes_rules) decide
update or replace. A replaced resource gets a new ID, so every input that
carries its ID changes too; a launch template update makes a new version, which rolls its node group.
"""
from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from deploy import kubernetes_rules

RULES_PATH = Path(__file__).resolve().parent / "data" / "replace_rules.json"
RULES: dict = json.loads(RULES_PATH.read_text())
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
SUBNET = "aws:ec2/subnet:Subnet"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
CRD = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
CHARTS_WITH_CRDS = ("kuberay-operator",)  # its crds/ folder: installed once, never upgraded by Helm
VERDICTS = ("create", "replace", "update", "delete", "unchanged")

Path_ = tuple  # a path as segments: ("spec", "workerGroupSpecs", 0, "template")


def parse_path(text: str) -> Path_:
    """Pulumi's property paths: a.b[0].c and a["key.with.dots"]."""
    segments: list = []
    for match in re.finditer(r'\["((?:[^"\\]|\\.)*)"\]|\[(\d+)\]|([^.\[\]]+)', text):
        quoted, index, plain = match.groups()
        segments.append(quoted if quoted is not None else int(index) if index is not None else plain)
    return tuple(segments)


def show_path(path: Path_) -> str:
    out = ""
    for seg in path:
        if isinstance(seg, int):
            out += f"[{seg}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", seg):
            out += f".{seg}" if out else seg
        else:
            out += f'["{seg}"]'
    return out


def leaves(value: Any, prefix: Path_ = ()) -> dict[Path_, Any]:
    if isinstance(value, dict) and value:
        return {p: v for k, item in value.items() for p, v in leaves(item, (*prefix, k)).items()}
    if isinstance(value, list) and value:
        return {p: v for i, item in enumerate(value) for p, v in leaves(item, (*prefix, i)).items()}
    return {prefix: value}


def _get(value: Any, path: Path_) -> tuple[bool, Any]:
    for seg in path:
        if isinstance(value, dict) and seg in value:
            value = value[seg]
        elif isinstance(value, list) and isinstance(seg, int) and seg < len(value):
            value = value[seg]
        else:
            return False, None
    return True, value


def _set(value: Any, path: Path_, new: Any, *, delete: bool = False) -> None:
    for seg in path[:-1]:
        value = value.setdefault(seg, {}) if isinstance(value, dict) else value[seg]
    if delete:
        value.pop(path[-1], None) if isinstance(value, dict) else None
    else:
        value[path[-1]] = new


def substitute_ignored(old: dict, new: dict, ignore_changes: Iterable[str]) -> tuple[dict, list[Path_]]:
    """The engine's ignoreChanges: the old input replaces the new one at each path (removed when old has none).

    Returns the inputs the engine acts on, and the paths where they differ from what the program declared.
    """
    goal = json.loads(json.dumps(new))
    masked = []
    for text in ignore_changes:
        path = parse_path(text)
        had_old, old_value = _get(old, path)
        has_new, new_value = _get(goal, path)
        if had_old:
            _set(goal, path, json.loads(json.dumps(old_value)))
        elif has_new:
            _set(goal, path, None, delete=True)
        if (had_old, old_value) != (has_new, new_value):
            masked.append(path)
    return goal, masked


def unordered(value: Any, path: Path_) -> Any:
    """`value` with the list at `path` (through any lists on the way) sorted: a TypeSet has no order."""
    if isinstance(value, list) and (not path or not isinstance(path[0], int)):
        items = [unordered(v, path) for v in value] if path else value
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True)) if not path else items
    if isinstance(value, dict) and path and path[0] in value:
        return {**value, path[0]: unordered(value[path[0]], path[1:])}
    return value


def changed_paths(old: dict, new: dict, sets: Iterable[str] = ()) -> list[Path_]:
    for text in sets:
        old, new = unordered(old, parse_path(text)), unordered(new, parse_path(text))
    a, b = leaves(old), leaves(new)
    return sorted((p for p in a.keys() | b.keys() if a.get(p) != b.get(p)), key=lambda p: tuple(map(str, p)))


def _named(path: Path_) -> Path_:
    return tuple(s for s in path if not isinstance(s, int))


def covered(path: Path_, rules: Iterable[str]) -> list[str]:
    """The rules (dotted paths) that cover `path`: the rule or anything under it."""
    named = _named(path)
    return [r for r in rules if named[:len(parse_path(r))] == parse_path(r)]


def type_rules(typ: str) -> dict:
    """The type's recorded rules; a Kubernetes type's force_new is pulumi-kubernetes' own (deploy.kubernetes_rules)."""
    if typ.startswith("kubernetes:"):
        return {**RULES["kubernetes_objects"], **RULES["types"].get(typ, {}), "force_new": kubernetes_rules.force_new(typ)}
    return RULES["types"].get(typ, {})


@dataclass
class Change:
    urn: str
    type: str
    name: str
    verdict: str
    changed: list[str] = field(default_factory=list)
    forcing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Diff:
    changes: list[Change]
    review: list[str]

    def of(self, typ: str, name: str | None = None) -> Change:
        found = [c for c in self.changes if c.type == typ and (name is None or c.name == name)]
        if len(found) != 1:
            raise KeyError(f"{typ} {name}: {len(found)} changes")
        return found[0]

    def by_verdict(self, verdict: str) -> list[Change]:
        return [c for c in self.changes if c.verdict == verdict]


def _index(resources: list[dict]) -> dict[str, dict]:
    """By URN, and by type and name (a resources.json written before URNs were recorded has none)."""
    index = {f"{r['type']}::{r['name']}": r for r in resources}
    index.update({r["urn"]: r for r in resources if r.get("urn")})
    return index


def _match(new: dict, old_by_urn: dict[str, dict]) -> dict | None:
    for urn in [new.get("urn"), *new.get("options", {}).get("aliases", ()), f"{new['type']}::{new['name']}"]:
        if urn in old_by_urn:
            return old_by_urn[urn]
    return None


def _references(inputs: dict, ids: set[str]) -> list[Path_]:
    return [p for p, v in leaves(inputs).items() if isinstance(v, str) and any(i and i in v for i in ids)]


def _classify(new: dict, old: dict, extra: list[Path_], *, new_ids: set[str], lt_updated: set[str]) -> Change:
    opts = new.get("options", {})
    goal, masked = substitute_ignored(old["inputs"], new["inputs"], opts.get("ignoreChanges", ()))
    paths = changed_paths(old["inputs"], goal, type_rules(new["type"]).get("sets", ()))
    paths += [p for p in extra if p not in paths]
    if new["type"] == NODE_GROUP and _references(new["inputs"], lt_updated):
        paths.append(("launchTemplate", "version"))  # a new template version: EKS rolls the group's nodes
    change = Change(new.get("urn", ""), new["type"], new["name"], "unchanged")
    rules = type_rules(new["type"])
    first = [p for p in paths if covered(p, rules.get("computed", ())) and not _get(old["inputs"], p)[0]]
    if first:  # Optional+Computed: the state already holds a value, which the new input may simply restate
        paths = [p for p in paths if p not in first]
        change.notes.append("newly declared " + ", ".join(map(show_path, first)) + " (computed until now): a change "
                            "only where the live value differs")
    if not paths:
        return change
    forcing = sorted({r for p in paths for r in covered(p, rules.get("force_new", ()))})
    forcing += sorted({r for p in paths for r in covered(p, opts.get("replaceOnChanges", ())) if r not in forcing})
    change.verdict = "replace" if forcing else "update"
    change.changed = [show_path(p) for p in paths]
    change.forcing = forcing
    if masked:
        change.notes.append("ignoreChanges keeps the OLD stored value of " + ", ".join(map(show_path, masked)) +
                            (" in the replacement" if forcing else ""))
    if not rules and not new["type"].startswith(("raytrain:", "pulumi:")):
        change.notes.append("no replace rules recorded for this type: check `pulumi preview`")
    _ = new_ids
    return change


def compare(old_resources: list[dict], new_resources: list[dict]) -> Diff:
    """Every resource's verdict (by type and name) and what a reviewer must see.

    Judged in the new plan's order, where what a resource depends on comes first: a replaced resource's
    new ID reaches every later input that carries the old one.
    """
    old_by_urn = _index(old_resources)
    matched: set[int] = set()
    replaced_ids: set[str] = set()
    lt_updated: set[str] = set()
    changes: list[Change] = []
    pairs: list[tuple[dict, dict | None]] = []
    for new in new_resources:
        old = _match(new, old_by_urn)
        if old is not None:
            matched.add(id(old))
        pairs.append((new, old))
    for new, old in pairs:
        if new["type"].startswith("pulumi:providers:") or new["type"] == "pulumi:pulumi:Stack":
            continue
        if old is None:
            changes.append(Change(new.get("urn", ""), new["type"], new["name"], "create"))
            continue
        extra = _references(new["inputs"], replaced_ids)
        change = _classify(new, old, extra, new_ids=replaced_ids, lt_updated=lt_updated)
        old_id = old.get("id") or f"{old['name']}-id"  # the mocks' id (a resources.json without ids)
        if change.verdict == "replace":
            replaced_ids.add(old_id)
        if new["type"] == LAUNCH_TEMPLATE and (change.verdict == "replace" or any(
                covered(parse_path(p), type_rules(LAUNCH_TEMPLATE)["new_version_on"]) for p in change.changed)):
            lt_updated.add(old_id)  # a new template version (terraform-provider-aws: CreateLaunchTemplateVersion)
        changes.append(change)
    for old in old_resources:
        if id(old) not in matched and not old["type"].startswith("pulumi:providers:"):
            changes.append(Change(old.get("urn", ""), old["type"], old["name"], "delete"))
    changes.sort(key=lambda c: (c.type, c.name, c.verdict))  # registration order varies run to run; this does not
    return Diff(changes, review(changes, old_resources, new_resources, pairs))


def _minor(version: Any) -> tuple[int, int] | None:
    match = re.fullmatch(r"(\d+)\.(\d+)", str(version or ""))
    return (int(match[1]), int(match[2])) if match else None


def review(changes: list[Change], old_resources: list[dict], new_resources: list[dict],
           pairs: list[tuple[dict, dict | None]]) -> list[str]:
    """What a reviewer must see: data replaced or deleted, nodes rolled, create-before-delete collisions, version skips."""
    notes: list[str] = []
    new_by_key = {(n["type"], n["name"]): (n, o) for n, o in pairs}
    old_by_key = {(o["type"], o["name"]): o for o in old_resources}
    for c in changes:
        new, old = new_by_key.get((c.type, c.name), (None, None))
        notes += _data_notes(c, new or old_by_key.get((c.type, c.name))) + _node_notes(c, new)
        if new is not None and old is not None:
            notes += _pair_notes(c, new, old)
        if any("OLD stored value" in n and "replacement" in n for n in c.notes):
            notes.append(f"STALE: {c.name} is replaced from old inputs: {c.notes[0]}")
    notes += subnet_collisions(changes, old_resources, new_by_key)
    return notes + _crd_notes(changes, pairs)


def _data_notes(c: Change, new: dict | None) -> list[str]:
    if not (type_rules(c.type).get("data") and c.verdict in ("replace", "delete")):
        return []
    opts = (new or {}).get("options", {})
    kept = (" (protected: `pulumi up` stops there)" if opts.get("protect") else
            " (retainOnDelete: the object stays in the cluster, out of the stack)" if opts.get("retainOnDelete") else "")
    return [f"DATA: {c.verdict} of {c.name} ({c.type}){kept}"]


def _node_notes(c: Change, new: dict | None) -> list[str]:
    if c.type != NODE_GROUP or c.verdict not in ("replace", "update"):
        return []
    if c.verdict == "replace":
        return [f"NODES: node group {c.name} is replaced by new nodes, its pods evicted ({', '.join(c.forcing)})"]
    rolling = [p for p in c.changed if covered(parse_path(p), type_rules(NODE_GROUP).get("rolls_nodes", ()))]
    if not rolling:
        return []
    notes = [f"NODES: node group {c.name} rolls its nodes ({', '.join(rolling)})"]
    if new is not None and new["inputs"].get("capacityType") == "CAPACITY_BLOCK":
        notes.append(f"NODES: {c.name} is a Capacity Block node group, which EKS updates only at zero nodes: "
                     "scale its pool to 0 first (desiredSize 0), then restore it")
    return notes


def _pair_notes(c: Change, new: dict, old: dict) -> list[str]:
    """What needs the old and the new inputs: same-name collisions, version skips, charts whose CRDs stay old."""
    notes, rules = [], type_rules(c.type)
    if c.verdict == "replace" and not new.get("options", {}).get("deleteBeforeReplace"):
        same = [u for u in rules.get("unique_name", ()) if _get(new["inputs"], parse_path(u)) ==
                _get(old["inputs"], parse_path(u)) and _get(new["inputs"], parse_path(u))[0]]
        if same:
            notes.append(f"COLLISION: {c.name} is replaced create-before-delete with the same {', '.join(same)}: "
                         "the new one is refused while the old exists")
    if c.type == EKS_CLUSTER and c.verdict in ("update", "replace"):
        was, now = _minor(old["inputs"].get("version")), _minor(new["inputs"].get("version"))
        if was and now and (now[0] != was[0] or now[1] - was[1] > 1):
            notes.append(f"VERSION: Kubernetes {'.'.join(map(str, was))} -> {'.'.join(map(str, now))} skips a "
                         "minor version; EKS upgrades one minor per update")
    return notes


def _crd_notes(changes: list[Change], pairs: list[tuple[dict, dict | None]]) -> list[str]:
    """CRDs updated in place; a chart with CRDs that moves to another version while none changes: Helm leaves them old."""
    updated = [n["inputs"].get("metadata", {}).get("name", n["name"]) for n, o in pairs
               if n["type"] == CRD and o is not None and any(c.urn == n.get("urn") and c.verdict == "update"
                                                                for c in changes)]
    crds_moved = any(c.type == CRD and c.verdict in ("update", "create") for c in changes)
    notes = [f"CRDS: {', '.join(sorted(updated))} applied in place from the new chart version's crds/ (server-side "
             "apply; their custom resources keep running)"] if updated else []
    for new, old in pairs:
        if (new["type"] == HELM_RELEASE and old is not None and new["inputs"].get("chart") in CHARTS_WITH_CRDS
                and new["inputs"].get("version") != old["inputs"].get("version") and not crds_moved):
            notes.append(f"CRDS: {new['name']} moves to chart {new['inputs']['chart']} {new['inputs'].get('version')} "
                         "and no CRD is declared by the plan; Helm never upgrades CRDs: apply that version's CRDs "
                         "first (docs/operations.md)")
    return notes
    return notes


def subnet_collisions(changes: list[Change], old_resources: list[dict], new_by_key: dict) -> list[str]:
    """A subnet created (or replaced, create-before-delete) whose CIDR overlaps one that still exists then."""
    old_cidrs = [(o["name"], ipaddress.ip_network(o["inputs"]["cidrBlock"])) for o in old_resources
                 if o["type"] == SUBNET and o["inputs"].get("cidrBlock")]
    notes = []
    for c in changes:
        if c.type != SUBNET or c.verdict not in ("create", "replace"):
            continue
        new, _ = new_by_key[(c.type, c.name)]
        cidr = new["inputs"].get("cidrBlock")
        if not cidr:
            continue
        clash = [name for name, net in old_cidrs if net.overlaps(ipaddress.ip_network(cidr))
                 and not (name == c.name and new.get("options", {}).get("deleteBeforeReplace"))]
        if clash:
            notes.append(f"COLLISION: subnet {c.name} ({cidr}) overlaps existing {', '.join(clash)}: EC2 refuses it "
                         "(InvalidSubnet.Conflict)")
    return notes


def render(diff: Diff) -> str:
    lines = ["Update against the earlier plan (offline; the providers' replace rules, deploy/data/replace_rules.json):"]
    counts = {v: len(diff.by_verdict(v)) for v in VERDICTS}
    lines.append("  " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    for c in diff.changes:
        if c.verdict == "unchanged" or c.type.startswith("raytrain:"):
            continue
        why = f" [forced by {', '.join(c.forcing)}]" if c.forcing else ""
        what = f": {', '.join(c.changed[:6])}{' ...' if len(c.changed) > 6 else ''}" if c.changed else ""
        lines.append(f"  {c.verdict:<8} {c.type.split(':')[-1]:<22} {c.name}{why}{what}")
        lines += [f"           note: {n}" for n in c.notes]
    lines.append("Review:" if diff.review else "Review: nothing replaced that holds data, no node rolled, no collision.")
    lines += [f"  - {n}" for n in diff.review]
    return "\n".join(lines)


def load(plan_dir: Path) -> list[dict]:
    data = json.loads((plan_dir / "resources.json").read_text())
    return data["resources"]
