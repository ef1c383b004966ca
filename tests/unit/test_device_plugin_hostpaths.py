"""Every host path the device plugin can emit, for hostile pods: none carries user input or leaves its folder.

A pod author controls the pod's name and namespace (within apiserver validation, which we do not rely on
here), its container names, and — without the admission policy — every annotation, including
`vgpu.io/assignment`. The pod UID is set by the apiserver, but it is fuzzed too. Each pod goes the real way:
pod JSON -> device_plugin.pods.pod_record -> DeviceManager.allocate -> the gRPC ContainerAllocateResponse.
The paths a response can carry are: mounts (host_path, container_path), device specs (host_path,
container_path), CDI device names, and env values that are paths.
"""

from __future__ import annotations

import json
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from device_plugin.envs import EnvSettings
from device_plugin.health import HealthBoard
from device_plugin.manager import AllocationError, DeviceManager
from device_plugin.pods import pod_record
from device_plugin.server import response_pb
from device_plugin.testing.pods import MemoryPods
from vgpu import annotations as ann
from vgpu.assignment_check import is_pod_uid
from vgpu.devices import GpuDevice

NODE = "gpu-1"
GPUS = tuple(GpuDevice(f"GPU-{i:08x}-1111-2222-3333-444444444444", i, "H100", 81920) for i in range(4))
HOSTILE = [
    "x/../../../../../../../../../etc",
    "..",
    "../..",
    "/etc",
    "a/b",
    "./x",
    "x\x00y",
    "all",
    "none",
    "$(reboot)",
    "%2e%2e%2f",
    "c:\\windows",
    "x" * 300,
]
SETTINGS = [
    EnvSettings(),
    EnvSettings(mps=True),
    EnvSettings(
        cache_dir_on_host="/srv/vgpu/cache/",
        mps=True,
        mps_pipe_dir="/run/mps",
        mps_log_dir="/var/log/m",
        mps_shm_dir="/run/mps-shm",
        hami_core_library="/opt/hami/libvgpu.so",
    ),
]

labels = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,12}[a-z0-9])?\Z")
hostile = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=40))
# Pod names and namespaces are never checked by the plugin (they reach no path): fully hostile. Container
# names, UIDs and GPU references are refused when wrong, so they are valid most of the time and the served
# responses, whose paths are what is checked, are a good share of the examples (see --hypothesis-show-statistics).
names = st.one_of(labels, hostile)


def mostly(valid: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """`valid` nine times in ten, else hostile."""
    return st.integers(0, 9).flatmap(lambda n: hostile if n == 0 else valid)


container_names = mostly(labels)
uids = mostly(st.uuids().map(str))


@dataclass(frozen=True)
class Hostile:
    namespace: str
    name: str
    uid: str
    containers: list[tuple[str, int, list[str], int, int]]  # name, count asked, assigned uuids, MiB, cores
    raw_annotation: str | None  # replaces the JSON assignment when set

    def pod(self) -> dict[str, Any]:
        assignment = self.raw_annotation or json.dumps(
            {
                "version": "v1",
                "node": NODE,
                "containers": [
                    {
                        "name": c,
                        "devices": [
                            {"uuid": u, "index": _index(u), "memoryMiB": mem, "cores": cores} for u in assigned
                        ],
                    }
                    for c, _, assigned, mem, cores in self.containers
                ],
            }
        )
        limits = [
            {"nvidia.com/gpu": str(n), "nvidia.com/gpumem": str(mem), "nvidia.com/gpucores": str(cores)}
            for _, n, _, mem, cores in self.containers
        ]
        return {
            "metadata": {
                "namespace": self.namespace,
                "name": self.name,
                "uid": self.uid,
                "annotations": {ann.POD_ASSIGNMENT: assignment, ann.POD_BIND_PHASE: "allocating"},
            },
            "spec": {
                "nodeName": NODE,
                "containers": [
                    {"name": c[0], "resources": {"limits": lim}} for c, lim in zip(self.containers, limits, strict=True)
                ],
            },
        }


def _index(u: str) -> int:
    return next((g.index for g in GPUS if g.uuid == u), 0)


gpu_refs = mostly(st.sampled_from([g.uuid for g in GPUS]))


@st.composite
def hostile_pods(draw: st.DrawFn) -> Hostile:
    containers = []
    for _ in range(draw(st.integers(1, 2))):
        assigned = draw(st.lists(gpu_refs, min_size=1, max_size=2, unique=True))
        count = draw(st.sampled_from([len(assigned)] * 9 + [len(assigned) + 1]))
        containers.append(
            (draw(container_names), count, assigned, draw(st.integers(1, 40000)), draw(st.integers(0, 30)))
        )
    return Hostile(
        namespace=draw(names),
        name=draw(names),
        uid=draw(uids),
        containers=containers,
        raw_annotation=draw(
            st.sampled_from([None] * 9 + ["raw"]).flatmap(lambda r: st.none() if r is None else hostile)
        ),
    )


def manager(pods: MemoryPods, s: EnvSettings) -> DeviceManager:
    return DeviceManager(
        node=NODE,
        resource="nvidia.com/gpu",
        gpus=GPUS,
        board=HealthBoard(g.uuid for g in GPUS),
        pods=pods,
        kubelet=None,
        settings=s,
        retry_s=0.0,
        sleep=lambda _: None,
    )


def emitted_paths(s: EnvSettings, resp: Any) -> list[tuple[str, str]]:
    """(kind, path) for every path-bearing field of a ContainerAllocateResponse."""
    out = [("mount.host", m.host_path) for m in resp.mounts] + [
        ("mount.container", m.container_path) for m in resp.mounts
    ]
    out += [("device.host", d.host_path) for d in resp.devices] + [
        ("device.container", d.container_path) for d in resp.devices
    ]
    out += [("cdi", d.name) for d in resp.cdi_devices]
    out += [(f"env.{k}", v) for k, v in resp.envs.items() if "/" in v or k.endswith(("_DIRECTORY", "_CACHE"))]
    return out


FIXED_CONTAINER_PATHS = {"/dev/shm", "/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload", "/tmp/vgpulock"}


def assert_safe(s: EnvSettings, h: Hostile, index: int, resp: Any) -> None:
    base = posixpath.normpath(s.cache_dir_on_host)
    assert is_pod_uid(h.uid), "a slice was served for a pod whose UID is not a UUID"
    trusted_host = {posixpath.join(base, f"{h.uid}_{index}"), s.mps_pipe_dir, s.mps_log_dir, s.mps_shm_dir}
    trusted_container = {s.cache_dir_in_container, s.mps_pipe_dir, s.mps_log_dir, "/dev/shm"}
    if s.hami_core_library:
        trusted_host |= {s.hami_core_library, s.hami_core_preload_file, s.hami_core_lock_dir}
        trusted_container |= {"/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload", "/tmp/vgpulock"}
    trusted_env = {f"{s.cache_dir_in_container}/vgpu.cache", s.mps_pipe_dir, s.mps_log_dir}
    for kind, path in emitted_paths(s, resp):
        if kind == "mount.host":
            assert path in trusted_host, (kind, path)
            assert posixpath.normpath(path) == path and ".." not in path.split("/")
        elif kind == "mount.container":
            assert path in trusted_container, (kind, path)
        elif kind.startswith("env."):
            assert path in trusted_env, (kind, path)
        else:
            raise AssertionError(f"the plugin emitted {kind} {path!r}; it emits no device specs or CDI devices")
    # No user-written string reaches a path: paths are exactly the trusted forms above, so any container name,
    # pod name or namespace could only appear by coinciding with a UUID, a digit or the operator's folders.
    # A name that is part of a trusted path by construction (a namespace "/", a name "var") proves nothing either way.
    trusted = trusted_host | trusted_container | trusted_env | set(FIXED_CONTAINER_PATHS)
    for user in (h.namespace, h.name, *(c[0] for c in h.containers)):
        if ("/" in user or ".." in user) and not any(user in t for t in trusted):
            # the fixed container paths (HAMi-core's, /dev/shm) are constants: a name like "/etc" is in them
            assert all(user not in p for _, p in emitted_paths(s, resp) if p not in FIXED_CONTAINER_PATHS)
    assert resp.annotations["vgpu.io/container"] == h.containers[index][0]


@pytest.mark.parametrize("s", SETTINGS, ids=["default", "mps", "custom-folders"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(h=hostile_pods())
def test_no_emitted_host_path_carries_user_input(s: EnvSettings, h: Hostile) -> None:
    pods = MemoryPods()
    pods.add(pod_record(h.pod()))
    m = manager(pods, s)
    for i, (_, count, assigned, _, _) in enumerate(h.containers):
        ids = [f"{u}::0" for u in assigned][:count]
        try:
            [served] = m.allocate([ids])
        except AllocationError as exc:
            event(f"refused: {_why(str(exc))}")
            return  # refused: nothing emitted
        event("served")
        assert_safe(s, h, i, response_pb(served))


def _why(msg: str) -> str:
    for key in ("DNS-1123", "UUID", "not a GPU of node", "requests resolve", "requests", "over-committed", "no pod"):
        if key in msg:
            return key
    return "other"


def test_a_valid_pod_gets_exactly_the_trusted_paths() -> None:
    uid = str(uuid.uuid4())
    h = Hostile(
        "team", "p", uid, [("a", 1, [GPUS[0].uuid], 1024, 10), ("b", 2, [GPUS[1].uuid, GPUS[2].uuid], 512, 0)], None
    )
    pods = MemoryPods()
    pods.add(pod_record(h.pod()))
    s = EnvSettings(mps=True)
    m = manager(pods, s)
    a = m.allocate([[f"{GPUS[0].uuid}::0"]])[0]
    b = m.allocate([[f"{GPUS[1].uuid}::0", f"{GPUS[2].uuid}::0"]])[0]
    assert [x.host_path for x in a.mounts] == [
        f"/var/run/vgpu/containers/{uid}_0",
        "/var/run/vgpu/mps/pipe",
        "/var/run/vgpu/mps/log",
        "/var/run/vgpu/mps/shm",
    ]
    assert b.mounts[0].host_path == f"/var/run/vgpu/containers/{uid}_1"
    assert_safe(s, h, 0, response_pb(a))
    assert_safe(s, h, 1, response_pb(b))


@pytest.mark.parametrize("where", ["container", "uid"])
def test_the_traversal_pod_of_the_issue_is_refused_before_any_path(where: str) -> None:
    evil = "x/../../../../../../../../../etc"
    h = Hostile(
        "team",
        "p",
        evil if where == "uid" else str(uuid.uuid4()),
        [(evil if where == "container" else "main", 1, [GPUS[0].uuid], 1024, 10)],
        None,
    )
    pods = MemoryPods()
    pods.add(pod_record(h.pod()))
    with pytest.raises(AllocationError, match="not a DNS-1123 label" if where == "container" else "not a UUID"):
        manager(pods, EnvSettings()).allocate([[f"{GPUS[0].uuid}::0"]])
