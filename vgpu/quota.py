"""Per-namespace limits on vGPU memory and SM cores that Kubernetes ResourceQuota cannot express.

ResourceQuota counts extended resources only by the quantity a pod requests (`requests.nvidia.com/gpu`,
`requests.nvidia.com/gpumem` as written): it caps slices and absolute MiB well, but `nvidia.com/gpumem-percentage`
(a share of a card it does not know) and cores left to default (proportional to memory) are never counted in
MiB or SMs. This policy counts every slice as it will be placed: memory in MiB (a percentage on the largest card a
pod could get, so it never under-counts) and cores in percent of one GPU's SMs (100 = a whole GPU).

Policy text (YAML or JSON), e.g. the data key `quotas.yaml` of ConfigMap `vgpu-quotas`:

    namespaces:
      team-a: {memoryMiB: 163840, cores: 200}
      batch:  {memoryMiB: 81920}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from vgpu.requests import PodRequest

RESOURCES = {"memoryMiB": "vGPU memory (MiB)", "cores": "vGPU cores (% of one GPU)"}


class QuotaPolicyError(ValueError):
    """The policy text is not valid; the message names the key and what is allowed."""


@dataclass(frozen=True, slots=True)
class Usage:
    memory_mib: int = 0
    cores: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.memory_mib + other.memory_mib, self.cores + other.cores)

    def of(self, resource: str) -> int:
        return self.memory_mib if resource == "memoryMiB" else self.cores


@dataclass(frozen=True, slots=True)
class QuotaPolicy:
    limits: Mapping[str, Mapping[str, int]]  # namespace -> resource ("memoryMiB", "cores") -> limit

    def for_namespace(self, namespace: str) -> Mapping[str, int]:
        return self.limits.get(namespace, {})


def parse_policy(text: str, source: str = "quota policy") -> QuotaPolicy:
    """Parse the policy; QuotaPolicyError names the offending key and the allowed form."""
    try:
        doc = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise QuotaPolicyError(f"{source}: not YAML/JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, Mapping):
        raise QuotaPolicyError(f"{source}: expected a mapping with key 'namespaces'")
    unknown = sorted(set(doc) - {"namespaces"})
    if unknown:
        raise QuotaPolicyError(f"{source}: unknown key(s) {unknown}; allowed: namespaces")
    namespaces = doc.get("namespaces") or {}
    if not isinstance(namespaces, Mapping):
        raise QuotaPolicyError(f"{source}: namespaces: expected a mapping of namespace -> limits")
    limits: dict[str, dict[str, int]] = {}
    for ns, entry in namespaces.items():
        if not isinstance(entry, Mapping):
            raise QuotaPolicyError(f"{source}: namespaces.{ns}: expected a mapping with {' and/or '.join(RESOURCES)}")
        out: dict[str, int] = {}
        for key, value in entry.items():
            if key not in RESOURCES:
                raise QuotaPolicyError(
                    f"{source}: namespaces.{ns}.{key}: unknown resource; allowed: {', '.join(RESOURCES)}"
                )
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise QuotaPolicyError(f"{source}: namespaces.{ns}.{key}: {value!r}; expected an integer >= 0")
            out[str(key)] = value
        limits[str(ns)] = out
    return QuotaPolicy(limits)


def pod_usage(request: PodRequest, card_mib: int) -> Usage:
    """What a pod's slices count against a quota, each placed on a card of `card_mib` (the largest one for a
    percentage request; absolute MiB do not depend on it)."""
    mem = cores = 0
    for c in request.containers:
        mem += c.count * c.memory_on(card_mib)
        cores += c.count * c.cores_on(card_mib)
    return Usage(mem, cores)


def namespace_usage(requests: Iterable[PodRequest], card_mib: int) -> Usage:
    total = Usage()
    for r in requests:
        total = total + pod_usage(r, card_mib)
    return total


def violation(namespace: str, limits: Mapping[str, int], used: Usage, asked: Usage, source: str) -> str | None:
    """The denial when `asked` on top of `used` passes a limit: namespace, resource, used, asked and limit."""
    for resource, limit in limits.items():
        u, a = used.of(resource), asked.of(resource)
        if u + a > limit:
            return (
                f"namespace {namespace}: {RESOURCES[resource]} quota exceeded: used {u} + asked {a} = {u + a} > "
                f"limit {limit} ({source}, namespaces.{namespace}.{resource})"
            )
    return None


def pod_is_counted(pod: Mapping[str, Any]) -> bool:
    """Pods that hold or will hold slices: not finished, not being deleted."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    return not (pod.get("metadata") or {}).get("deletionTimestamp")
