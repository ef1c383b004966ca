"""Hypothesis over every HTTP entry point of the extender and the webhook, through real servers on loopback.

Properties, per request: never a 5xx (no unhandled exception), an answer within DEADLINE_S (no hang), and a
refused request leaves the extender's allocations (/state) as they were. The number of inputs tried per entry
point is asserted (>= MIN_EXAMPLES) and printed at the end of the session.
"""

from __future__ import annotations

import json
import os
import ssl
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from tests.integration.extender_server import running_extender
from tests.integration.http_fuzz import broken_pods, gpu_pod, json_values, put
from tests.integration.test_extender_http import CLUSTER, NODES
from webhook import certs
from webhook.config import WebhookConfig
from webhook.inventory import StaticInventory
from webhook.main import build_server
from webhook.testing import make_review

DEADLINE_S = 15.0  # catches a hang; generous, as a loaded 2-core CI machine answers slowly, not wrongly
MIN_EXAMPLES = int(os.environ.get("VGPU_HTTP_FUZZ_EXAMPLES", "150"))
COUNTS: dict[str, int] = {}
FUZZ = settings(
    max_examples=MIN_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _dumps(value: Any) -> bytes:
    """JSON as bytes; integers of any size (orjson stops at 64 bits, a hostile client does not)."""
    return json.dumps(value).encode()


node_names = st.lists(st.one_of(st.sampled_from(NODES), st.text(max_size=30)), max_size=8)
junk_bytes = st.one_of(st.binary(max_size=200), json_values.map(_dumps))


class _Summary:
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if COUNTS:
            per = ", ".join(f"{k} {v}" for k, v in sorted(COUNTS.items()))
            terminalreporter.write_line(f"HTTP fuzz: inputs tried per entry point (0 x 5xx, 0 hangs): {per}")


@pytest.fixture(scope="module")
def extender(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    if not request.config.pluginmanager.has_plugin("http-fuzz-summary"):
        request.config.pluginmanager.register(_Summary(), "http-fuzz-summary")
    path = tmp_path_factory.mktemp("fuzz") / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    with (
        running_extender("--source", "file", "--cluster-file", str(path), "--enable-state") as url,
        httpx.Client(base_url=url, timeout=DEADLINE_S) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    pki = certs.write_dev_certs(tmp_path_factory.mktemp("pki"), ("localhost", "127.0.0.1"))
    cfg = WebhookConfig(
        host="127.0.0.1",
        port=0,
        cert_file=str(pki.cert),
        key_file=str(pki.key),
        inventory_source="static",
        max_gpu_memory_mib=81920,
        max_gpus_per_node=8,
    )
    srv = build_server(
        cfg, StaticInventory(max_gpu_memory_mib=81920, max_gpus_per_node=8), CollectorRegistry(), pods=_one_pod
    )
    srv.start(timeout=60)  # the in-process server on a loaded 2-core machine: 10 s by default
    with httpx.Client(
        base_url=f"https://127.0.0.1:{srv.port}",
        verify=ssl.create_default_context(cafile=str(pki.ca_cert)),
        timeout=DEADLINE_S,
    ) as c:
        yield c
    srv.tls.stop()
    srv.stop()


EVICTED_UID = "uid-of-vllm-0"


def _one_pod(namespace: str, name: str) -> dict[str, Any] | None:
    """The eviction guard's pod reads: one pod, `team-a/vllm-0` on node gpu-a."""
    if (namespace, name) != ("team-a", "vllm-0"):
        return None
    return {"metadata": {"name": name, "namespace": namespace, "uid": EVICTED_UID}, "spec": {"nodeName": "gpu-a"}}


def _send(client: httpx.Client, entry: str, body: bytes, method: str = "POST") -> httpx.Response:
    started = time.monotonic()
    r = client.request(method, entry, content=body, headers={"Content-Type": "application/json"})
    COUNTS[entry] = COUNTS.get(entry, 0) + 1
    assert r.status_code < 500, f"{entry} {body[:300]!r} -> {r.status_code} {r.text[:500]}"
    assert time.monotonic() - started < DEADLINE_S
    return r


def _state(client: httpx.Client) -> Any:
    return _send(client, "/state", b"", "GET").json()


@st.composite
def extender_args(draw: st.DrawFn) -> bytes:
    """ExtenderArgs with a broken pod, a broken envelope, or not JSON at all."""
    kind = draw(st.sampled_from(["pod", "envelope", "junk"]))
    if kind == "junk":
        return draw(junk_bytes)
    body: dict[str, Any] = {"Pod": draw(broken_pods()), "NodeNames": draw(node_names)}
    if kind == "envelope":
        body = put(
            {"Pod": gpu_pod(), "NodeNames": NODES},
            draw(st.sampled_from([("NodeNames",), ("Nodes",), ("Pod",)])),
            draw(json_values),
        )
    return _dumps(body)


@pytest.mark.parametrize("verb", ["/filter", "/prioritize"])
def test_filter_and_prioritize_fuzz(extender: httpx.Client, verb: str) -> None:
    statuses: dict[int, int] = {}
    before = _state(extender)

    @FUZZ
    @given(extender_args())
    def run(body: bytes) -> None:
        r = _send(extender, verb, body)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

    run()
    assert _state(extender) == before  # neither verb changes allocations, valid or not
    assert COUNTS[verb] >= MIN_EXAMPLES and statuses.get(400, 0) > 0 and statuses.get(200, 0) > 0


def test_bind_fuzz(extender: httpx.Client) -> None:
    fields = {"PodName": st.text(max_size=20), "PodNamespace": st.text(max_size=10), "PodUID": st.text(max_size=40)}
    fields["Node"] = st.one_of(st.sampled_from(NODES), st.text(max_size=20))
    args = st.one_of(
        st.fixed_dictionaries({}, optional={**fields, "extra": json_values}).map(_dumps),
        st.dictionaries(st.sampled_from(["PodName", "PodNamespace", "PodUID", "Node"]), json_values).map(_dumps),
        junk_bytes,
    )

    @FUZZ
    @given(args)
    def run(body: bytes) -> None:
        before = _state(extender)
        r = _send(extender, "/bind", body)
        if r.status_code != 200 or r.json().get("Error"):
            assert _state(extender) == before, f"refused {body[:200]!r} changed the allocations"

    run()
    assert COUNTS["/bind"] >= MIN_EXAMPLES


@st.composite
def reviews(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["pod", "envelope", "junk"]))
    if kind == "junk":
        return draw(junk_bytes)
    review = make_review(gpu_pod())
    if kind == "pod":
        review["request"]["object"] = draw(broken_pods())
    else:
        where = draw(
            st.sampled_from(
                [
                    ("request",),
                    ("request", "uid"),
                    ("request", "kind"),
                    ("request", "operation"),
                    ("apiVersion",),
                    ("request", "object"),
                    ("request", "userInfo"),
                ]
            )
        )
        review = put(review, where, draw(json_values))
    return _dumps(review)


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
def test_webhook_fuzz(webhook: httpx.Client, endpoint: str) -> None:
    denials: dict[int, int] = {}

    @FUZZ
    @given(reviews())
    def run(body: bytes) -> None:
        r = _send(webhook, endpoint, body)
        if r.status_code == 200:
            status = (r.json()["response"].get("status") or {}).get("code", 200)
            assert status != 500, f"{body[:300]!r} -> internal error {r.text[:500]}"
            denials[status] = denials.get(status, 0) + 1

    run()
    assert COUNTS[endpoint] >= MIN_EXAMPLES and denials.get(400, 0) > 0


@st.composite
def eviction_reviews(draw: st.DrawFn) -> bytes:
    """Reviews of a device plugin's eviction as the apiserver sends them, one field replaced by any JSON value (or
    junk): the guard answers each with a verdict, never an internal error."""
    if draw(st.integers(0, 9)) == 0:
        return draw(junk_bytes)
    review = make_review({}, uid="e")
    review["request"] |= {
        "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": "eviction",
        "name": "vllm-0",
        "namespace": "team-a",
        "userInfo": {
            "username": "system:serviceaccount:kube-system:vgpu-device-plugin",
            "extra": {"authentication.kubernetes.io/node-name": [draw(st.sampled_from(["gpu-a", "gpu-b"]))]},
        },
        "object": {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "vllm-0"},
            "deleteOptions": {"preconditions": {"uid": EVICTED_UID}},
        },
    }
    where = draw(
        st.sampled_from(
            [
                (),
                ("request", "name"),
                ("request", "namespace"),
                ("request", "subResource"),
                ("request", "userInfo", "extra"),
                ("request", "userInfo", "extra", "authentication.kubernetes.io/node-name"),
                ("request", "object"),
                ("request", "object", "deleteOptions"),
                ("request", "object", "deleteOptions", "preconditions", "uid"),
            ]
        )
    )
    if where:
        review = put(review, where, draw(json_values))
    return _dumps(review)


def test_eviction_guard_fuzz(webhook: httpx.Client) -> None:
    verdicts: dict[str, int] = {}

    @FUZZ
    @given(eviction_reviews())
    def run(body: bytes) -> None:
        r = _send(webhook, "/validate-eviction", body)
        if r.status_code == 200:
            response = r.json()["response"]
            status = (response.get("status") or {}).get("code", 200)
            assert status != 500, f"{body[:300]!r} -> internal error {r.text[:500]}"
            verdict = "allowed" if response["allowed"] else str(status)
            verdicts[verdict] = verdicts.get(verdict, 0) + 1

    run()
    assert COUNTS["/validate-eviction"] >= MIN_EXAMPLES
    assert verdicts.get("allowed", 0) > 0 and verdicts.get("403", 0) > 0, verdicts
