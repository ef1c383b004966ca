"""What the HTTP fuzz and limits tests send: valid kube-scheduler and apiserver bodies, and ways to break them."""

from __future__ import annotations

import copy
import socket
import ssl
import time
import uuid
from typing import Any

from hypothesis import strategies as st

GPU_LIMITS = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "30"}


def gpu_pod(name: str = "p", limits: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "llm", "uid": str(uuid.uuid4()), "labels": {"app": "x"}},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [{"name": "vllm", "args": ["serve"], "resources": {"limits": limits or dict(GPU_LIMITS)}}],
        },
    }


# Where in a pod a fuzzed value lands: every field the core reads, and the containers around them.
POD_PATHS: list[tuple[str | int, ...]] = [
    (),
    ("metadata",),
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("metadata", "uid"),
    ("metadata", "labels"),
    ("metadata", "labels", "llm-d.ai/role"),
    ("metadata", "annotations"),
    ("metadata", "annotations", "vgpu.io/node-policy"),
    ("spec",),
    ("spec", "nodeName"),
    ("spec", "containers"),
    ("spec", "containers", 0),
    ("spec", "containers", 0, "name"),
    ("spec", "containers", 0, "args"),
    ("spec", "containers", 0, "resources"),
    ("spec", "containers", 0, "resources", "limits"),
    ("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"),
    ("spec", "containers", 0, "resources", "limits", "nvidia.com/gpumem"),
    ("spec", "containers", 0, "resources", "requests"),
    ("spec", "initContainers"),
    ("status",),
    ("status", "phase"),
]

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=24),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
quantities = st.one_of(
    st.text(alphabet="0123456789.+-eEkKMGTPinu m_\u0661\uff11\u00b2", max_size=80),
    st.sampled_from(["1" * 12_001, "\u0661", "\uff11", "1_000", "1e999", "-1", "0.5", "20Gi", "", " 1 "]),
)


def put(body: Any, path: tuple[str | int, ...], value: Any) -> Any:
    """A copy of `body` with `value` at `path` (the whole body when the path is empty); missing parents are made."""
    if not path:
        return value
    out = copy.deepcopy(body)
    node = out
    for key in path[:-1]:
        if isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        elif isinstance(node, dict) and isinstance(key, str):
            node = node.setdefault(key, {})
        else:
            return out
    if (isinstance(node, dict) and isinstance(path[-1], str)) or (
        isinstance(node, list) and isinstance(path[-1], int) and path[-1] < len(node)
    ):
        node[path[-1]] = value
    return out


@st.composite
def broken_pods(draw: st.DrawFn) -> Any:
    """A valid GPU pod with one field replaced by any JSON value, or a GPU quantity by any string."""
    pod = gpu_pod(draw(st.sampled_from(["a", "b", "c"])))
    if draw(st.booleans()):
        return put(pod, ("spec", "containers", 0, "resources", "limits", "nvidia.com/gpumem"), draw(quantities))
    return put(pod, draw(st.sampled_from(POD_PATHS)), draw(json_values))


SLOW_HEADERS = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 10_000
# Complete headers, then a body that never ends.
SLOW_BODY = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b" " * 10_000


def slow_client_closed_after(
    host: str, port: int, *, tls: bool, give_up_s: float, request: bytes = SLOW_HEADERS
) -> float | None:
    """Send `request` one byte every 0.2 s; the seconds until the server closed the connection, or None if it was
    still open after `give_up_s`. Timed from before the connect: the server's read deadline starts when it
    accepts, so the time returned is never shorter than the deadline, however long this thread is preempted."""
    started = time.monotonic()
    raw = socket.create_connection((host, port), timeout=give_up_s)
    conn: socket.socket = raw
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        conn = ctx.wrap_socket(raw)
    try:
        for byte in request:
            if time.monotonic() - started > give_up_s:
                return None
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return time.monotonic() - started
            conn.settimeout(0.2)
            try:
                if conn.recv(1) == b"":
                    return time.monotonic() - started
            except (TimeoutError, ssl.SSLWantReadError):
                continue
            except OSError:
                return time.monotonic() - started
        return None
    finally:
        conn.close()
