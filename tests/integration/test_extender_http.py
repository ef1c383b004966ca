"""The extender as a real HTTP(S) server, driven with kube-scheduler-shaped JSON."""

from __future__ import annotations

import concurrent.futures
import ssl
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.extender_server import HTTP_TIMEOUT_S, free_port, running_extender
from vgpu.clusterfile import parse_cluster
from webhook.certs import write_dev_certs

CLUSTER: dict[str, Any] = {
    "version": "v1",
    "nodes": [
        {"name": "h100-a", "gpuTemplate": {"count": 2, "model": "H100-80GB", "memoryMiB": 81920}},
        {"name": "h100-b", "gpuTemplate": {"count": 2, "model": "H100-80GB", "memoryMiB": 81920}},
        {"name": "l4", "gpuTemplate": {"count": 1, "model": "L4", "memoryMiB": 23034}},
    ],
    "allocations": [
        {
            "pod": "llm/existing",
            "assignment": {
                "node": "h100-b",
                "role": "decode",
                "containers": [
                    {"name": "vllm", "devices": [{"uuid": "GPU-h100-b-0", "index": 0, "memoryMiB": 40960, "cores": 50}]}
                ],
            },
        }
    ],
}
NODES = ["h100-a", "h100-b", "l4"]


def pod(name: str, limits: dict[str, str], *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "llm", "uid": str(uuid.uuid4()), "labels": labels or {}},
        "spec": {"schedulerName": "vgpu-scheduler", "containers": [{"name": "vllm", "resources": {"limits": limits}}]},
    }


def node_obj(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "status": {"capacity": {}}}


@pytest.fixture
def cluster_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    return path


@pytest.fixture
def extender(cluster_file: Path) -> Any:
    with running_extender("--source", "file", "--cluster-file", str(cluster_file), "--persist") as url:
        yield url


def test_filter_node_cache_capable_returns_names_and_reasons(extender: str) -> None:
    p = pod("big", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000", "nvidia.com/gpucores": "30"})
    r = httpx.post(f"{extender}/filter", json={"Pod": p, "Nodes": None, "NodeNames": NODES}, timeout=HTTP_TIMEOUT_S)
    assert r.status_code == 200
    body = r.json()
    assert body["Nodes"] is None
    assert body["NodeNames"] == ["h100-a", "h100-b"]
    assert body["Error"] == ""
    reason = body["FailedAndUnresolvableNodes"]["l4"]
    assert "card too small" in reason and "vllm" in reason


def test_filter_full_node_list_returns_the_node_objects(extender: str) -> None:
    p = pod("small", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"})
    items = [node_obj(n) for n in NODES] + [node_obj("cpu-only")]
    r = httpx.post(f"{extender}/filter", json={"Pod": p, "Nodes": {"items": items}}, timeout=HTTP_TIMEOUT_S)
    body = r.json()
    assert body["NodeNames"] is None
    kept = [n["metadata"]["name"] for n in body["Nodes"]["items"]]
    assert kept == ["h100-a", "h100-b", "l4"]
    assert body["Nodes"]["items"][0] == items[0]  # whole objects come back unchanged
    assert "no vGPU inventory" in body["FailedNodes"]["cpu-only"]


def test_prioritize_prefers_fuller_node_with_binpack(extender: str) -> None:
    p = pod("s", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "20"})
    p["metadata"]["annotations"] = {"vgpu.io/node-policy": "binpack"}
    r = httpx.post(
        f"{extender}/prioritize",
        json={"Pod": p, "Nodes": None, "NodeNames": ["h100-a", "h100-b"]},
        timeout=HTTP_TIMEOUT_S,
    )
    assert r.status_code == 200
    scores = {h["Host"]: h["Score"] for h in r.json()}
    assert set(scores) == {"h100-a", "h100-b"}
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores.values())
    assert scores["h100-b"] > scores["h100-a"]


def test_spread_annotation_inverts_the_preference(extender: str) -> None:
    p = pod("s", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "20"})
    p["metadata"]["annotations"] = {"vgpu.io/node-policy": "spread"}
    r = httpx.post(
        f"{extender}/prioritize",
        json={"Pod": p, "Nodes": None, "NodeNames": ["h100-a", "h100-b"]},
        timeout=HTTP_TIMEOUT_S,
    )
    scores = {h["Host"]: h["Score"] for h in r.json()}
    assert scores["h100-a"] > scores["h100-b"]


def test_bind_records_assignment_persists_and_survives_restart(cluster_file: Path) -> None:
    p = pod("dec", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960", "nvidia.com/gpucores": "50"})
    with running_extender("--source", "file", "--cluster-file", str(cluster_file), "--persist") as url:
        httpx.post(f"{url}/filter", json={"Pod": p, "NodeNames": NODES}, timeout=HTTP_TIMEOUT_S)
        meta = p["metadata"]
        r = httpx.post(
            f"{url}/bind",
            json={"PodName": meta["name"], "PodNamespace": "llm", "PodUID": meta["uid"], "Node": "h100-b"},
            timeout=HTTP_TIMEOUT_S,
        )
        assert r.status_code == 200 and r.json() == {"Error": ""}
        # binpack puts it on GPU 0 next to the existing slice, which is now full.
        full = pod("full", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "50000"})
        body = httpx.post(f"{url}/filter", json={"Pod": full, "NodeNames": ["h100-b"]}, timeout=HTTP_TIMEOUT_S).json()
        assert body["NodeNames"] == []
        assert "GPU memory full on 1" in body["FailedNodes"]["h100-b"]
    _, allocations = parse_cluster(yaml.safe_load(cluster_file.read_text()))
    held = dict(allocations)
    assert set(held) == {"llm/existing", "llm/dec"}
    assert [(d.uuid, d.memory_mib, d.cores) for d in held["llm/dec"].slices()] == [("GPU-h100-b-0", 40960, 50)]
    with running_extender("--source", "file", "--cluster-file", str(cluster_file)) as url:
        body = httpx.post(f"{url}/filter", json={"Pod": full, "NodeNames": ["h100-b"]}, timeout=HTTP_TIMEOUT_S).json()
        assert body["NodeNames"] == []  # the restarted extender sees both allocations


def test_bind_to_a_node_that_no_longer_fits_is_an_error(extender: str) -> None:
    p = pod("huge", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000"})
    httpx.post(f"{extender}/filter", json={"Pod": p, "NodeNames": NODES}, timeout=HTTP_TIMEOUT_S)
    m = p["metadata"]
    r = httpx.post(
        f"{extender}/bind",
        json={"PodName": m["name"], "PodNamespace": "llm", "PodUID": m["uid"], "Node": "l4"},
        timeout=HTTP_TIMEOUT_S,
    )
    assert r.status_code == 200
    assert "no longer fits" in r.json()["Error"] and "llm/huge" in r.json()["Error"]


def test_concurrent_binds_never_overcommit(extender: str, cluster_file: Path) -> None:
    pods = [
        pod(f"c{i}", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "30", "nvidia.com/gpucores": "30"})
        for i in range(24)
    ]
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as c:
        for p in pods:
            c.post(f"{extender}/filter", json={"Pod": p, "NodeNames": NODES})

    def bind(p: dict[str, Any]) -> str:
        m = p["metadata"]
        r = httpx.post(
            f"{extender}/bind",
            json={"PodName": m["name"], "PodNamespace": "llm", "PodUID": m["uid"], "Node": "h100-a"},
            timeout=HTTP_TIMEOUT_S,
        )
        err: str = r.json()["Error"]
        return err

    with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
        errors = list(pool.map(bind, pods))
    ok = [e for e in errors if e == ""]
    assert len(ok) == 6  # 2 GPUs x 3 slices of 30 %
    assert all("no longer fits" in e for e in errors if e)
    _, allocations = parse_cluster(yaml.safe_load(cluster_file.read_text()))
    per_gpu: dict[str, int] = {}
    for _, a in allocations:
        for d in a.slices():
            per_gpu[d.uuid] = per_gpu.get(d.uuid, 0) + d.cores
    assert per_gpu and max(per_gpu.values()) <= 100


@pytest.mark.parametrize(
    ("verb", "body", "expect"),
    [
        ("filter", b"{not json", "Invalid JSON"),
        ("filter", b"", "empty body"),
        ("filter", b'{"NodeNames": ["a"]}', "Pod: Field required"),
        ("filter", b'{"Pod": {}, "NodeNames": "a"}', "NodeNames"),
        ("filter", b'{"Pod": {}}', "neither Nodes nor NodeNames"),
        ("prioritize", b"[1, 2]", "ExtenderArgs"),
        ("bind", b'{"PodNamespace": "x", "Node": "n"}', "PodName: Field required"),
        ("bind", b'{"PodName": "", "PodNamespace": "x", "Node": "n"}', "PodName"),
    ],
)
def test_malformed_bodies_get_clear_400_and_service_keeps_serving(
    extender: str, verb: str, body: bytes, expect: str
) -> None:
    r = httpx.post(
        f"{extender}/{verb}", content=body, headers={"content-type": "application/json"}, timeout=HTTP_TIMEOUT_S
    )
    assert r.status_code == 400
    assert expect in r.json()["Error"]
    ok = httpx.post(
        f"{extender}/filter",
        json={"Pod": pod("after", {"nvidia.com/gpu": "1"}), "NodeNames": NODES},
        timeout=HTTP_TIMEOUT_S,
    )
    assert ok.status_code == 200 and ok.json()["NodeNames"] == NODES  # a whole GPU is free on each


def test_invalid_pod_request_fails_every_node_with_a_clear_reason(extender: str) -> None:
    p = pod("bad", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"})
    body = httpx.post(f"{extender}/filter", json={"Pod": p, "NodeNames": NODES}, timeout=HTTP_TIMEOUT_S).json()
    assert body["NodeNames"] == []
    reasons = body["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(NODES)
    assert (
        "container 'vllm'" in reasons["l4"]
        and "nvidia.com/gpumem-percentage" in reasons["l4"]
        and "1..100" in reasons["l4"]
    )


def test_metrics_expose_allocation_in_prometheus_text(extender: str) -> None:
    text = httpx.get(f"{extender}/metrics", timeout=HTTP_TIMEOUT_S).text
    line = next(
        x for x in text.splitlines() if x.startswith("vgpu_gpu_memory_allocated_bytes{") and 'UUID="GPU-h100-b-0"' in x
    )
    assert float(line.rsplit(" ", 1)[1]) == 40960 * 1024 * 1024
    assert "vgpu_extender_request_duration_seconds_bucket" in text
    assert httpx.get(f"{extender}/readyz", timeout=HTTP_TIMEOUT_S).status_code == 200


def test_tls_serving_with_a_verified_certificate(tmp_path: Path, cluster_file: Path) -> None:
    paths = write_dev_certs(tmp_path, ("127.0.0.1", "localhost"))  # one dev-cert helper for every service
    ca, cert, key = paths.ca_cert, paths.cert, paths.key
    with running_extender("--source", "file", "--cluster-file", str(cluster_file), cert=(cert, key), ca=ca) as url:
        assert url.startswith("https://")
        p = pod("tls", {"nvidia.com/gpu": "1"})
        r = httpx.post(
            f"{url}/filter",
            json={"Pod": p, "NodeNames": NODES},
            verify=ssl.create_default_context(cafile=str(ca)),
            timeout=HTTP_TIMEOUT_S,
        )
        assert r.status_code == 200 and r.json()["NodeNames"] == NODES
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/healthz", verify=True, timeout=HTTP_TIMEOUT_S)  # not trusted without our CA


def _tls(ca: Path, client: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(*client)
    return ctx


@pytest.fixture
def mtls(tmp_path: Path, cluster_file: Path) -> Any:
    """An extender that requires client certificates signed by its own CA (as kube-scheduler's), with /state on and
    probes on a separate plain port; yields (url, health url, CA, the scheduler's cert, a foreign CA's cert)."""
    from tests.e2e.controlplane import CertificateAuthority

    ca = CertificateAuthority("vgpu-extender-ca")
    ca_file, _ = ca.keypair.write(tmp_path, "ca")
    server = ca.issue_server_cert("vgpu-extender").write(tmp_path, "server")
    scheduler = ca.issue_client_cert("vgpu-scheduler").write(tmp_path, "scheduler")
    foreign = CertificateAuthority("someone-else").issue_client_cert("vgpu-scheduler").write(tmp_path, "foreign")
    health = free_port()
    args = ["--source", "file", "--cluster-file", str(cluster_file), "--client-ca-file", str(ca_file)]
    args += ["--enable-state", "--health-port", str(health)]
    with running_extender(*args, cert=server, ca=ca_file, client=scheduler) as url:
        yield url, f"http://127.0.0.1:{health}", ca_file, scheduler, foreign


REFUSED = (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError)
VERBS = [
    ("POST", "/filter", {"Pod": {}, "NodeNames": NODES}),
    ("POST", "/prioritize", {"Pod": {}, "NodeNames": NODES}),
    ("POST", "/bind", {"PodName": "existing", "PodNamespace": "llm", "PodUID": "u", "Node": "h100-a"}),
    ("GET", "/state", None),
    ("GET", "/healthz", None),
    ("GET", "/metrics", None),
]


def test_mtls_refuses_every_verb_without_a_certificate_and_with_a_foreign_one(mtls: Any) -> None:
    url, _health, ca, scheduler, foreign = mtls
    for client in (None, foreign):
        for method, path, body in VERBS:
            with pytest.raises(REFUSED):  # the TLS handshake fails: no request reaches a handler
                httpx.request(method, f"{url}{path}", json=body, verify=_tls(ca, client), timeout=30)
    ok = httpx.post(
        f"{url}/filter",
        json={"Pod": pod("p", {"nvidia.com/gpu": "1"}), "NodeNames": NODES},
        verify=_tls(ca, scheduler),
        timeout=HTTP_TIMEOUT_S,
    )
    assert ok.status_code == 200 and ok.json()["NodeNames"] == NODES
    state = httpx.get(f"{url}/state", verify=_tls(ca, scheduler), timeout=HTTP_TIMEOUT_S).json()
    assert [a["pod"] for a in state["allocations"]] == ["llm/existing"]  # the refused /bind changed nothing


def test_probes_and_metrics_answer_on_the_plain_health_port_and_nothing_else_does(mtls: Any) -> None:
    url, health, ca, scheduler, _foreign = mtls
    assert (
        httpx.get(f"{health}/healthz", timeout=HTTP_TIMEOUT_S).text == "ok"
        and httpx.get(f"{health}/readyz", timeout=HTTP_TIMEOUT_S).status_code == 200
    )
    assert "vgpu_gpu_memory_allocated_bytes" in httpx.get(f"{health}/metrics", timeout=HTTP_TIMEOUT_S).text
    for path in ("/filter", "/prioritize", "/bind"):
        assert httpx.post(f"{health}{path}", json={}, timeout=HTTP_TIMEOUT_S).status_code in (404, 405)
    assert httpx.get(f"{health}/state", timeout=HTTP_TIMEOUT_S).status_code == 404
    # and the mTLS port no longer serves the probes (they live on the health port)
    assert httpx.get(f"{url}/healthz", verify=_tls(ca, scheduler), timeout=HTTP_TIMEOUT_S).status_code == 404


def test_state_is_off_unless_enabled(extender: str) -> None:
    r = httpx.get(f"{extender}/state", timeout=HTTP_TIMEOUT_S)
    assert r.status_code == 404 and "--enable-state" in r.text


def test_bind_of_a_pod_holding_an_assignment_changes_nothing(mtls: Any) -> None:
    """llm/existing holds half of GPU 0 on h100-b (the cluster file): binding it anywhere is refused and the books
    stay as they were, even after a /filter that carries its name with a bigger request."""
    url, _health, ca, scheduler, _foreign = mtls
    tls = _tls(ca, scheduler)
    before = httpx.get(f"{url}/state", verify=tls, timeout=HTTP_TIMEOUT_S).json()
    squat = pod("existing", {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "100"})
    httpx.post(f"{url}/filter", json={"Pod": squat, "NodeNames": NODES}, verify=tls, timeout=HTTP_TIMEOUT_S)
    for node in ("h100-a", "h100-b"):
        r = httpx.post(
            f"{url}/bind",
            json={"PodName": "existing", "PodNamespace": "llm", "PodUID": squat["metadata"]["uid"], "Node": node},
            verify=tls,
            timeout=HTTP_TIMEOUT_S,
        )
        assert "live assignment on h100-b" in r.json()["Error"]
    assert httpx.get(f"{url}/state", verify=tls, timeout=HTTP_TIMEOUT_S).json() == before
