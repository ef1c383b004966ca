"""The standalone node's endpoints file: which model servers run on this host, on which GPUs, and how their GPU
processes are recognised. Pure: parsing, validation, and the pod records / slice ownership the watchdog reads.

    endpoints:
    - name: llama-decode-0        # the router's endpoint name AND the feed's `pod` label (they must match)
      namespace: default          # optional
      address: 10.1.2.3           # the host address the router reaches: the model server and the feed (9402)
      port: 8000                  # the model server's port
      role: decode                # llm-d.ai/role: prefill, decode, prefill-decode (default), encode, ...
      model: meta-llama/Llama-3.1-8B   # llm-d.ai/model (optional)
      gpus: [0, 1]                # GPU indexes or UUIDs
      memoryMiB: 20000            # per GPU (optional; default: the whole GPU)
      cores: 30                   # SM share per GPU in percent (optional; 0 = best effort)
      pids: [4242]                # attribution by PID, or
      cgroup: /system.slice/vllm-decode.service   # by cgroup (the process's cgroup is this one or below), or
                                  # neither: by GPU (every process on its GPUs that no other endpoint claims)
      labels: {team: search}      # extra labels for the discovery file (optional)

By GPU needs the endpoint to be the only by-GPU endpoint on each of its GPUs; endpoints that share a GPU tell
their processes apart by PID or cgroup (Slurm: the job's cgroup, systemd: the unit's).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from device_plugin.pods import PodRecord
from device_plugin.watchdog.cgroup import ContainerRef
from vgpu import annotations as ann
from vgpu.devices import GpuDevice
from vgpu.roles import Role

BY_GPU_UID = "standalone-by-gpu"  # the pod UID shared by every by-GPU endpoint (see EndpointTable.owner)
CONTAINER = "main"
_FIELDS = frozenset(
    {"name", "namespace", "address", "port", "role", "model", "gpus", "memoryMiB", "cores", "pids", "cgroup", "labels"}
)

Attribution = Literal["gpu", "pid", "cgroup"]


class EndpointsError(ValueError):
    """The endpoints file is wrong; the message names the endpoint and the field."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    namespace: str
    address: str
    port: str
    role: Role
    model: str
    gpus: tuple[GpuDevice, ...]
    memory_mib: int | None
    cores: int
    pids: frozenset[int]
    cgroup: str
    labels: tuple[tuple[str, str], ...]

    @property
    def attribution(self) -> Attribution:
        return "pid" if self.pids else "cgroup" if self.cgroup else "gpu"

    @property
    def uid(self) -> str:
        return BY_GPU_UID if self.attribution == "gpu" else f"standalone-{self.namespace}-{self.name}"


def _int(where: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise EndpointsError(f"{where}: must be an integer {lo}..{hi}, got {value!r}")
    return value


def _gpus(where: str, raw: Any, by_index: Mapping[int, GpuDevice], by_uuid: Mapping[str, GpuDevice]) -> list[GpuDevice]:
    if not isinstance(raw, list) or not raw:
        raise EndpointsError(f"{where}: a non-empty list of GPU indexes or UUIDs")
    out: list[GpuDevice] = []
    for g in raw:
        dev = by_index.get(g) if isinstance(g, int) and not isinstance(g, bool) else by_uuid.get(str(g))
        if dev is None:
            known = ", ".join(f"{d.index} ({d.uuid})" for d in by_index.values()) or "none"
            raise EndpointsError(f"{where}: no GPU {g!r} on this host; it has {known}")
        if dev in out:
            raise EndpointsError(f"{where}: GPU {g!r} listed twice")
        out.append(dev)
    return out


def _endpoint(i: int, raw: Any, gpus: Sequence[GpuDevice]) -> Endpoint:
    where = f"endpoints[{i}]"
    if not isinstance(raw, Mapping):
        raise EndpointsError(f"{where}: must be a mapping (name, address, port, gpus, ...)")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise EndpointsError(f"{where}: unknown field {unknown[0]!r}; allowed: {', '.join(sorted(_FIELDS))}")
    name = raw.get("name")
    if not isinstance(name, str) or not name or "/" in name:
        raise EndpointsError(f"{where}.name: required, a non-empty string without '/'")
    where = f"endpoint {name!r}"
    namespace = raw.get("namespace", "default")
    if not isinstance(namespace, str) or not namespace:
        raise EndpointsError(f"{where}.namespace: a non-empty string")
    address = raw.get("address")
    try:
        ipaddress.ip_address(str(address))
    except ValueError:
        raise EndpointsError(
            f"{where}.address: {address!r} is not an IP address (the router scrapes <address>:<feed port>)"
        ) from None
    port = raw.get("port")
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    port = _int(f"{where}.port", port, 1, 65535)
    try:
        role = Role(str(raw.get("role", Role.PREFILL_DECODE.value)))
    except ValueError:
        raise EndpointsError(
            f"{where}.role: {raw.get('role')!r} is not a role; one of {', '.join(r.value for r in Role)}"
        ) from None
    model = raw.get("model", "")
    if not isinstance(model, str):
        raise EndpointsError(f"{where}.model: a string")
    devices = _gpus(f"{where}.gpus", raw.get("gpus"), {g.index: g for g in gpus}, {g.uuid: g for g in gpus})
    memory = raw.get("memoryMiB")
    if memory is not None:
        memory = _int(f"{where}.memoryMiB", memory, 1, min(d.memory_mib for d in devices))
    cores = _int(f"{where}.cores", raw.get("cores", 0), 0, 100)
    pids_raw = raw.get("pids", [])
    if not isinstance(pids_raw, list):
        raise EndpointsError(f"{where}.pids: a list of process IDs")
    pids = frozenset(_int(f"{where}.pids", p, 1, 2**22) for p in pids_raw)
    cgroup = raw.get("cgroup", "")
    if not isinstance(cgroup, str) or (cgroup and not cgroup.startswith("/")):
        raise EndpointsError(f"{where}.cgroup: an absolute cgroup path such as /system.slice/vllm.service")
    if pids and cgroup:
        raise EndpointsError(f"{where}: give pids or cgroup, not both")
    labels = raw.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise EndpointsError(f"{where}.labels: must map strings to strings (quote numbers)")
    return Endpoint(
        name=name,
        namespace=namespace,
        address=str(address),
        port=str(port),
        role=role,
        model=model,
        gpus=tuple(devices),
        memory_mib=memory,
        cores=cores,
        pids=pids,
        cgroup=cgroup.rstrip("/") or ("/" if cgroup else ""),
        labels=tuple(sorted(labels.items())),
    )


def parse(doc: Any, gpus: Sequence[GpuDevice]) -> tuple[Endpoint, ...]:
    """Every endpoint of the file, checked against this host's GPUs and against each other."""
    if not isinstance(doc, Mapping) or set(doc) - {"endpoints"} or not isinstance(doc.get("endpoints"), list):
        raise EndpointsError("the endpoints file must be a mapping with one key, 'endpoints' (a list)")
    eps = tuple(_endpoint(i, raw, gpus) for i, raw in enumerate(doc["endpoints"]))
    seen: dict[tuple[str, str], int] = {}
    by_gpu: dict[str, str] = {}
    pid_owner: dict[int, str] = {}
    for i, e in enumerate(eps):
        if (e.namespace, e.name) in seen:
            raise EndpointsError(
                f"endpoint {e.namespace}/{e.name} is listed twice (entries {seen[e.namespace, e.name]} and {i})"
            )
        seen[e.namespace, e.name] = i
        for p in e.pids:
            if p in pid_owner:
                raise EndpointsError(f"endpoint {e.name!r}.pids: PID {p} is also {pid_owner[p]!r}'s")
            pid_owner[p] = e.name
        if e.attribution != "gpu":
            continue
        for g in e.gpus:
            if g.uuid in by_gpu:
                raise EndpointsError(
                    f"endpoints {by_gpu[g.uuid]!r} and {e.name!r} both take GPU {g.index} by GPU; "
                    "give them pids or cgroup so their processes can be told apart"
                )
            by_gpu[g.uuid] = e.name
    return eps


def pod_records(eps: Sequence[Endpoint], node: str) -> list[PodRecord]:
    """What the watchdog and the discovery writer read, as if each endpoint were a pod with one container."""
    out: list[PodRecord] = []
    for e in eps:
        devices = tuple(ann.DeviceSlice(g.uuid, g.index, e.memory_mib or g.memory_mib, e.cores) for g in e.gpus)
        out.append(
            PodRecord(
                namespace=e.namespace,
                name=e.name,
                uid=e.uid,
                node=node,
                phase="Running",
                bind_phase=ann.BindPhase.ALLOCATED,
                assignment=ann.Assignment(
                    node=node,
                    containers=(ann.ContainerAssignment(name=CONTAINER, devices=devices),),
                    role=e.role,
                    model=e.model or None,
                ),
                pod_ip=e.address,
                labels=e.labels,
            )
        )
    return out


def cgroup_of(text: str) -> str:
    """The process's cgroup path from /proc/<pid>/cgroup: the unified (v2) line, else the first v1 line."""
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    for hid, ctl, path in lines:
        if hid == "0" and ctl == "":
            return path
    return lines[0][2] if lines else ""


def owner(eps: Sequence[Endpoint], pid: int, cgroup: str) -> ContainerRef:
    """Whose process `pid` is: an endpoint naming the PID, else one whose cgroup holds it, else the by-GPU
    owner (resolved per GPU by the slice index: the by-GPU endpoint on that GPU, if any)."""
    for e in eps:
        if pid in e.pids or (e.cgroup and (cgroup == e.cgroup or cgroup.startswith(e.cgroup.rstrip("/") + "/"))):
            return ContainerRef(pod_uid=e.uid, container_id="", runtime="", path=cgroup, version=2)
    return ContainerRef(pod_uid=BY_GPU_UID, container_id="", runtime="", path=cgroup, version=2)
