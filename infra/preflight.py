"""What only the account can tell, looked up before anything is declared (`pulumi preview` does it too).

The configuration's own rules are checked when it is loaded (deploy.config); these need the account:
which zone IDs its AZ names map to, what a capacity reservation holds, who is deploying and how many
vCPUs it may run. Lookups are invokes through a provider of their own, so they finish before the DLC
image is pinned and before any resource is registered; every problem is reported at once.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from facts.errors import Problems, ProblemsError
from infra import aws_rules
from infra.cost import VCPU_QUOTAS, vcpus_needed
from infra.node_pools import NodePool

KEY = "raytrain-eks:"


class PreflightError(ProblemsError, pulumi.RunError):
    """The account cannot host the stack as configured. A RunError: Pulumi prints it without a traceback."""

    title = "the stack cannot be deployed as configured"


class PlacementError(PreflightError):
    """The region cannot host a node pool where asked."""

    def __init__(self, problem: str):
        super().__init__([problem])


@dataclass(frozen=True)
class Zone:
    name: str
    zone_id: str

    @property
    def refused_for_control_plane(self) -> bool:
        return self.zone_id in aws_rules.REFUSED_CONTROL_PLANE_ZONE_IDS

    def __str__(self) -> str:
        return f"{self.name} ({self.zone_id})"


@dataclass(frozen=True)
class Reservation:
    id: str
    kind: str  # "capacity reservation" or "Capacity Block"
    zone: str
    instance_type: str
    instance_count: int
    state: str
    platform: str = "Linux/UNIX"
    start: str | None = None
    available: int | None = None  # what others leave free (an On-Demand Capacity Reservation reports it)


@dataclass(frozen=True)
class Site:
    """Where the stack goes: the GPU zone first, then the other zones the network spans; each pool's zone."""

    gpu_zone: Zone
    zones: tuple[Zone, ...]
    caller_arn: str
    pool_zones: dict[str, Zone] = field(default_factory=dict)  # pools in one zone (EFA, or pinned)

    @property
    def control_plane_zones(self) -> tuple[Zone, ...]:
        return tuple(z for z in self.zones if not z.refused_for_control_plane)


# --- pure checks -------------------------------------------------------------------------------------

def find_zone(zones: list[Zone], wanted: str) -> Zone | None:
    return next((z for z in zones if wanted in (z.name, z.zone_id)), None)


def choose_zone(pool: NodePool, zones: list[Zone], offered_ids: set[str], wanted: str | None, wanted_key: str,
                reservation: Reservation | None, region: str) -> Zone:
    """The configured zone, else the reservation's, else the first zone offering the pool's type.

    A zone EKS refuses for control-plane subnets is never picked automatically; asked for, it holds
    nodes only and the control plane gets two other zones.
    """
    offered = [z for z in zones if z.zone_id in offered_ids]
    if not offered:
        raise PlacementError(f"{pool.key('instanceType')}: {pool.instance_type} is not offered in any availability "
                             f"zone of {region}; pick another region (aws:region) or instance type")
    if wanted is not None:
        zone = find_zone(zones, wanted)
        if zone is None:
            raise PlacementError(f"{wanted_key}: {wanted} is not an available zone of {region} in this "
                                 f"account; use one of {', '.join(map(str, zones))} or unset it")
        if zone not in offered:
            raise PlacementError(f"{wanted_key}: {wanted} does not offer {pool.instance_type}; use one of "
                                 f"{', '.join(z.name for z in offered)} or unset it")
        if reservation and reservation.zone not in (zone.name, zone.zone_id):
            raise PlacementError(
                f"{wanted_key}: {zone} is not the zone of {reservation.kind} {reservation.id} "
                f"({reservation.zone}); set it to {reservation.zone} or unset it")
        return zone
    if reservation:
        zone = find_zone(zones, reservation.zone)
        if zone is None:
            raise PlacementError(f"{pool.key('capacityReservationId')}: {reservation.id} is in {reservation.zone}, "
                                 f"which is not an available zone of {region} (aws:region)")
        return zone
    preferred = [z for z in offered if not z.refused_for_control_plane] or offered
    return sorted(preferred, key=lambda z: z.name)[0]


def network_zones(zones: list[Zone], first: list[Zone], control_plane: int = 2) -> tuple[Zone, ...]:
    """The pools' zones first (the GPU zone leading), then enough others that `control_plane` zones EKS accepts are among them."""
    chosen = list(dict.fromkeys(first))
    for zone in sorted(zones, key=lambda z: z.name):
        if sum(not z.refused_for_control_plane for z in chosen) >= control_plane:
            break
        if zone not in chosen and not zone.refused_for_control_plane:
            chosen.append(zone)
    if sum(not z.refused_for_control_plane for z in chosen) < control_plane:
        raise PlacementError(f"aws:region: EKS needs control-plane subnets in {control_plane} zones it accepts; this "
                             f"account has {', '.join(map(str, zones))}, of which EKS refuses "
                             f"{', '.join(str(z) for z in zones if z.refused_for_control_plane) or 'none'}")
    return tuple(chosen)


def reservation_problems(pool: NodePool, reservation: Reservation, own: int = 0) -> list[str]:
    """A reservation must hold the pool's type, enough instances, for Linux, and be usable now.

    Enough is what is free (AvailableInstanceCount) plus the `own` instances this stack's nodes already use:
    instances of other workloads in a shared reservation leave the pool's node group short, not its total.
    """
    key, problems = pool.key("capacityReservationId"), []
    if reservation.available is not None and reservation.available + own < pool.max_size <= reservation.instance_count:
        problems.append(f"{key}: {reservation.kind} {reservation.id} has {reservation.available} of "
                        f"{reservation.instance_count} instance(s) free ({own} run this stack's nodes, others use the "
                        f"rest), fewer than {pool.key('maxSize')} {pool.max_size} needs; lower it or free the "
                        "reservation")
    if reservation.instance_type != pool.instance_type:
        problems.append(f"{key}: {reservation.kind} {reservation.id} holds {reservation.instance_type}, but "
                        f"{pool.key('instanceType')} is {pool.instance_type}; set it to {reservation.instance_type} "
                        "or use a reservation for it")
    if reservation.instance_count < pool.max_size:
        problems.append(f"{key}: {reservation.kind} {reservation.id} holds {reservation.instance_count} instance(s), "
                        f"fewer than {pool.key('maxSize')} {pool.max_size}; lower it or enlarge the reservation")
    if not reservation.platform.startswith("Linux/UNIX"):
        problems.append(f"{key}: {reservation.kind} {reservation.id} is for {reservation.platform}; the EKS AL2023 "
                        "nodes need a Linux/UNIX reservation")
    if reservation.state != "active":
        when = f" (it starts {reservation.start})" if reservation.start else ""
        problems.append(f"{key}: {reservation.kind} {reservation.id} is {reservation.state}{when}; the node "
                        "group can only launch into an active one: run `pulumi up` once it is active")
    return problems


def principal(arn: str) -> tuple[str, str, str] | None:
    """(account, kind, name) of an IAM principal or of the role behind an assumed-role session; paths dropped."""
    match = re.match(r"^arn:aws[a-z-]*:(?:iam|sts)::(\d{12}):(role|user|assumed-role)/(.+)$", arn)
    if not match:
        return None
    account, kind, rest = match.groups()
    if kind == "assumed-role":
        return account, "role", rest.split("/")[0]
    return account, kind, rest.split("/")[-1]


def admin_problems(admin_role_arns: tuple[str, ...], caller_arn: str) -> list[str]:
    """The deployer already gets an access entry as cluster creator; a second one fails CreateAccessEntry."""
    me = principal(caller_arn)
    return [f"{KEY}adminRoleArns: {arn} is the identity running Pulumi ({caller_arn}), which EKS already makes "
            "cluster admin as the cluster creator; a second access entry for it fails CreateAccessEntry after the "
            "cluster exists. Remove it from the list"
            for arn in admin_role_arns if me is not None and principal(arn) == me]


def quota_problems(needed: dict[tuple[str, str], tuple[int, NodePool]],
                   quotas: dict[tuple[str, str], float]) -> list[str]:
    """The quota must hold the stack and, beside it, a replacement of its largest pool: Pulumi creates a
    replaced node group (a new instance type, zone or template) before it deletes the old one."""
    problems = []
    for family, (vcpus, pool) in needed.items():
        code, name = VCPU_QUOTAS[family]
        surge = pool.max_size * pool.instance.vcpus
        if family in quotas and quotas[family] < vcpus + surge:
            problems.append(
                f"{pool.key('maxSize')}: the stack runs {vcpus} vCPUs of \"{name}\", and replacing pool {pool.name} "
                f"(its new node group starts before the old one goes) needs {surge} more, {vcpus + surge} in all; the "
                f"account's quota ({code}) is {quotas[family]:.0f}, so node groups would fail to launch after the "
                f"cluster exists. Request an increase: `aws service-quotas request-service-quota-increase "
                f"--service-code ec2 --quota-code {code} --desired-value {vcpus + surge}`, or lower it")
    return problems


def _minor(version: str | None) -> tuple[int, int] | None:
    match = re.fullmatch(r"(\d+)\.(\d+)", str(version or ""))
    return (int(match[1]), int(match[2])) if match else None


def upgrade_problems(current: str | None, wanted: str, node_groups: dict[str, str | None],
                     pools: tuple[NodePool, ...]) -> list[str]:
    """What EKS refuses of a Kubernetes version change, and how to get there instead.

    EKS moves the control plane one minor version per update, never down, and refuses the next bump while
    a node group lags behind the control plane; a Capacity Block node group upgrades only at desired size 0.
    """
    was, now = _minor(current), _minor(wanted)
    if was is None or now is None or was == now:
        return []
    key, problems = f"{KEY}kubernetesVersion", []
    if now < was:
        return [f"{key}: {wanted} is older than the cluster's {current}; EKS never downgrades. Set it back to {current}"]
    if now[0] != was[0] or now[1] - was[1] > 1:
        step = f"{was[0]}.{was[1] + 1}"
        problems.append(f"{key}: {current} -> {wanted} skips a minor version; EKS upgrades one at a time: set it to "
                        f"{step}, `pulumi up` (the control plane, then every node group), then the next one")
    lagging = sorted(name for name, version in node_groups.items() if _minor(version) and _minor(version) < was)
    if lagging:
        problems.append(f"{key}: node group(s) {', '.join(lagging)} still run an older version than the control "
                        f"plane's {current}; EKS refuses the next bump until they match. Run `pulumi up` with "
                        f"{key} {current} first (node groups follow it), then upgrade")
    for pool in (p for p in pools if p.capacity_type == "CAPACITY_BLOCK"):
        problems.append(f"{pool.key('capacityType')}: EKS upgrades a Capacity Block node group only while it has no "
                        f"nodes: scale pool {pool.name} to 0 ({pool.key('desiredSize')} 0, `pulumi up`), upgrade, then "
                        "restore it")
    return problems


# --- lookups -------------------------------------------------------------------------------------------

def lookup_zones(invoke: pulumi.InvokeOptions) -> list[Zone]:
    result = aws.get_availability_zones(
        state="available", filters=[aws.GetAvailabilityZonesFilterArgs(name="opt-in-status",
                                                                       values=["opt-in-not-required"])],
        opts=invoke)
    return [Zone(name, zone_id) for name, zone_id in zip(result.names, result.zone_ids, strict=True)]


def lookup_offered_zone_ids(instance_type: str, invoke: pulumi.InvokeOptions) -> set[str]:
    result = aws.ec2.get_instance_type_offerings(
        location_type="availability-zone-id",
        filters=[aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="instance-type", values=[instance_type])],
        opts=invoke)
    return set(result.locations)


def lookup_reservation(pool: NodePool, invoke: pulumi.InvokeOptions) -> Reservation | None:
    rid = pool.capacity_reservation_id
    if rid is None:
        return None
    if pool.capacity_type == "CAPACITY_BLOCK":
        block = aws.ec2.get_capacity_block_reservation(id=rid, opts=invoke)
        return Reservation(rid, "Capacity Block", block.availability_zone, block.instance_type,
                           int(block.instance_count), block.state, block.instance_platform or "Linux/UNIX",
                           block.start_date)
    # No pulumi_aws data source reads an On-Demand Capacity Reservation; Cloud Control does.
    found = json.loads(aws.cloudcontrol.get_resource(type_name="AWS::EC2::CapacityReservation", identifier=rid,
                                                     opts=invoke).properties)
    available = found.get("AvailableInstanceCount")
    return Reservation(rid, "capacity reservation", found["AvailabilityZone"], found["InstanceType"],
                       int(found.get("TotalInstanceCount", found.get("InstanceCount", 0))),
                       found.get("State", "active"), found.get("InstancePlatform", "Linux/UNIX"),
                       available=None if available is None else int(available))


def lookup_own_instances(reservation_id: str, cluster_name: str, invoke: pulumi.InvokeOptions) -> int:
    """How many of the reservation's instances this stack's nodes already run (they count as free for it)."""
    found = aws.ec2.get_instances(
        instance_state_names=["pending", "running"],
        filters=[aws.ec2.GetInstancesFilterArgs(name="capacity-reservation-id", values=[reservation_id]),
                 aws.ec2.GetInstancesFilterArgs(name="tag:eks:cluster-name", values=[cluster_name])], opts=invoke)
    return len(found.ids)


def offering_problems(pools: tuple[NodePool, ...], zones: tuple[Zone, ...], invoke: pulumi.InvokeOptions) -> list[str]:
    """A pool spread over every private subnet needs its type offered in each of their zones: EKS refuses a node
    group whose subnets lie in a zone without the type."""
    problems = []
    for pool in (p for p in pools if not p.single_zone):
        offered = lookup_offered_zone_ids(pool.instance_type, invoke)
        if missing := [z for z in zones if z.zone_id not in offered]:
            problems.append(f"{pool.key('instanceType')}: {pool.instance_type} is not offered in "
                            f"{', '.join(map(str, missing))}, where the pool's nodes go (every private subnet); pick a "
                            f"type offered there or pin the pool to a zone that offers it ({pool.key('availabilityZone')})")
    return problems


def is_deployed(cluster_name: str, invoke: pulumi.InvokeOptions) -> bool:
    return bool(cluster_name) and cluster_name in (aws.eks.get_clusters(opts=invoke).names or [])


def kept_zone_problems(pools: tuple[NodePool, ...], gpu_zone: str | None, chosen: Zone | None) -> list[str]:
    """A deployed stack keeps its GPU zone in config: unset, it is chosen anew from the offerings on every run,
    and a new offering in an earlier zone would move (replace) every EFA pool that follows it."""
    auto = [p for p in pools if p.efa and p.availability_zone is None]
    if gpu_zone is not None or chosen is None or not auto or any(p.capacity_reservation_id for p in auto):
        return []  # pinned by config, or by a reservation's zone
    return [f"{KEY}availabilityZone: not set on a deployed stack, so the GPU zone is chosen anew from the offerings "
            f"on every run; keep the deployed one: `pulumi config set {KEY}availabilityZone "
            f"$(pulumi stack output gpuAvailabilityZone)` (it is {chosen.name} if the offerings have not changed)"]


def lookup_running_versions(cluster_name: str, invoke: pulumi.InvokeOptions) -> tuple[str | None, dict[str, str | None]]:
    """The deployed control plane's version and each node group's, or (None, {}) before the cluster exists."""
    if not is_deployed(cluster_name, invoke):
        return None, {}
    current = aws.eks.get_cluster(name=cluster_name, opts=invoke).version
    names = aws.eks.get_node_groups(cluster_name=cluster_name, opts=invoke).names or []
    return current, {n: aws.eks.get_node_group(cluster_name=cluster_name, node_group_name=n, opts=invoke).version
                     for n in sorted(names)}


def lookup_quotas(families, invoke: pulumi.InvokeOptions) -> dict[tuple[str, str], float]:
    """The account's vCPU quotas; one that cannot be read (no servicequotas:GetServiceQuota) is skipped."""
    quotas = {}
    for family in families:
        code, name = VCPU_QUOTAS[family]
        try:
            quotas[family] = float(aws.servicequotas.get_service_quota(service_code="ec2", quota_code=code,
                                                                        opts=invoke).value)
        except Exception as err:  # noqa: BLE001 - any failure to read a quota only skips this check
            pulumi.log.warn(f"could not read the EC2 quota \"{name}\" ({code}): {err}; check it in Service Quotas")
    return quotas


def survey(pools: tuple[NodePool, ...], *, region: str, gpu_zone: str | None, admin_role_arns: tuple[str, ...],
           placeholders: tuple[str, ...], invoke: pulumi.InvokeOptions, cluster_name: str = "",
           kubernetes_version: str | None = None) -> Site:
    """Every lookup and check; raises PreflightError naming each problem and its fix.

    `gpu_zone` (availabilityZone) places the EFA pools that name no zone of their own; the first
    of them decides it when unset. `placeholders` are problems already known to the caller.
    """
    problems = Problems()
    problems.extend(placeholders)
    zones = lookup_zones(invoke)
    chosen: dict[str, Zone] = {}
    first_gpu_zone: Zone | None = None
    for pool in (p for p in pools if p.single_zone):
        reservation = lookup_reservation(pool, invoke)
        if reservation:
            own = lookup_own_instances(reservation.id, cluster_name, invoke) if reservation.available is not None else 0
            problems.extend(reservation_problems(pool, reservation, own))
        offered = lookup_offered_zone_ids(pool.instance_type, invoke)
        if pool.availability_zone is not None:
            zone = choose_zone(pool, zones, offered, pool.availability_zone, pool.key("availabilityZone"),
                               reservation, region)
        elif first_gpu_zone is None:
            zone = first_gpu_zone = choose_zone(pool, zones, offered, gpu_zone, f"{KEY}availabilityZone",
                                                reservation, region)
        else:  # the GPU zone the first EFA pool decided
            zone = first_gpu_zone
            if zone.zone_id not in offered or (reservation and reservation.zone not in (zone.name, zone.zone_id)):
                where = f"{reservation.kind} {reservation.id} is in {reservation.zone}" if reservation else (
                    f"{zone.name} does not offer {pool.instance_type}")
                problems.append(f"{pool.key('availabilityZone')}: not set, so the pool goes to the GPU zone {zone} "
                                f"with the other EFA pools, but {where}; set it to a zone that offers "
                                f"{pool.instance_type}")
        chosen[pool.name] = zone
    caller = aws.get_caller_identity(opts=invoke).arn
    problems.extend(admin_problems(admin_role_arns, caller))
    if kubernetes_version:
        current, node_groups = lookup_running_versions(cluster_name, invoke)
        problems.extend(upgrade_problems(current, kubernetes_version, node_groups, pools))
        if current is not None:
            problems.extend(kept_zone_problems(pools, gpu_zone, first_gpu_zone))
    needed = vcpus_needed(pools)
    problems.extend(quota_problems(needed, lookup_quotas(needed, invoke)))
    gpu = first_gpu_zone or next(iter(chosen.values()), None) or choose_default(zones)
    try:
        spanned = network_zones(zones, [gpu, *chosen.values()])
    except PlacementError as err:
        problems.extend(err.problems)
    else:
        problems.extend(offering_problems(pools, spanned, invoke))
    problems.raise_if_any(PreflightError)
    return Site(gpu, spanned, caller, chosen)


def choose_default(zones: list[Zone]) -> Zone:
    """A stack with no single-zone pool: the first zone EKS accepts for its control plane leads the network."""
    accepted = sorted((z for z in zones if not z.refused_for_control_plane), key=lambda z: z.name)
    return (accepted or sorted(zones, key=lambda z: z.name))[0]
