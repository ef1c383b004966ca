"""benchmarks/scale.py's apiserver figures: each write's time from the audit log, per user and request, and the
apiserver's own means from its /metrics (APF wait by flow schema, handler, etcd)."""

from __future__ import annotations

from pathlib import Path

import orjson

from benchmarks.scale import EXTENDER_USER, SCHEDULER_USER, Audit, parse_timings


def _event(audit_id: str, user: str, verb: str, resource: str, sub: str, received: str, done: str, stage: str) -> bytes:
    ref = {"resource": resource, **({"subresource": sub} if sub else {})}
    return orjson.dumps(
        {
            "auditID": audit_id,
            "stage": stage,
            "verb": verb,
            "user": {"username": user},
            "objectRef": ref,
            "requestReceivedTimestamp": received,
            "stageTimestamp": done,
        }
    )


def test_audit_take_times_each_write_from_received_to_response_complete(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    lines = [
        _event(
            "a",
            EXTENDER_USER,
            "create",
            "pods",
            "binding",
            "2026-12-02T07:47:21.000000Z",
            "2026-12-02T07:47:21.313000Z",
            "ResponseComplete",
        ),
        _event(
            "b",
            EXTENDER_USER,
            "create",
            "pods",
            "binding",
            "2026-12-02T07:47:22.000000Z",
            "2026-12-02T07:47:22.007500Z",
            "ResponseComplete",
        ),
        _event(
            "c",
            SCHEDULER_USER,
            "create",
            "events",
            "",
            "2026-12-02T07:47:22.000000Z",
            "2026-12-02T07:47:23.250000Z",
            "ResponseComplete",
        ),
        # a read is counted as a request but not timed as a write; another user's write is neither
        _event(
            "d",
            EXTENDER_USER,
            "get",
            "pods",
            "",
            "2026-12-02T07:47:22.000000Z",
            "2026-12-02T07:47:22.100000Z",
            "ResponseComplete",
        ),
        _event(
            "e",
            "admin",
            "create",
            "pods",
            "",
            "2026-12-02T07:47:22.000000Z",
            "2026-12-02T07:47:22.100000Z",
            "ResponseComplete",
        ),
    ]
    log.write_bytes(b"\n".join(lines) + b"\n")
    taken = Audit(log).take()
    assert taken.requests[EXTENDER_USER] == {"create pods/binding": 2, "get pods": 1}
    assert set(taken.write_ms) == {f"{EXTENDER_USER} create pods/binding", f"{SCHEDULER_USER} create events"}
    assert [round(x, 3) for x in taken.write_ms[f"{EXTENDER_USER} create pods/binding"]] == [313.0, 7.5]
    assert [round(x, 3) for x in taken.write_ms[f"{SCHEDULER_USER} create events"]] == [1250.0]


def test_audit_take_reads_on_from_where_it_stopped(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    first = _event(
        "a",
        EXTENDER_USER,
        "create",
        "pods",
        "binding",
        "2026-12-02T07:47:21Z",
        "2026-12-02T07:47:21.1Z",
        "ResponseComplete",
    )
    log.write_bytes(first + b"\n")
    audit = Audit(log)
    assert len(audit.take().write_ms[f"{EXTENDER_USER} create pods/binding"]) == 1
    with log.open("ab") as f:
        f.write(
            _event(
                "b",
                SCHEDULER_USER,
                "create",
                "events",
                "",
                "2026-12-02T07:47:21Z",
                "2026-12-02T07:47:21.2Z",
                "ResponseComplete",
            )
            + b"\n"
        )
    assert set(audit.take().write_ms) == {f"{SCHEDULER_USER} create events"}


METRICS = """\
# HELP apiserver_flowcontrol_request_wait_duration_seconds [BETA] Length of time a request spent waiting in its queue
apiserver_flowcontrol_request_wait_duration_seconds_sum{execute="true",flow_schema="global-default",priority_level="global-default"} 4.2
apiserver_flowcontrol_request_wait_duration_seconds_count{execute="true",flow_schema="global-default",priority_level="global-default"} 2000
apiserver_flowcontrol_request_wait_duration_seconds_sum{execute="false",flow_schema="global-default",priority_level="global-default"} 9
apiserver_flowcontrol_request_wait_duration_seconds_count{execute="false",flow_schema="global-default",priority_level="global-default"} 3
apiserver_flowcontrol_request_wait_duration_seconds_bucket{execute="true",flow_schema="global-default",priority_level="global-default",le="0.005"} 1990
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 348
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 2000
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 10
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 100
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 99
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 99
etcd_request_duration_seconds_sum{group="",operation="update",resource="pods"} 3
etcd_request_duration_seconds_count{group="",operation="update",resource="pods"} 1000
"""


def test_parse_timings_reads_apf_wait_by_flow_schema_handler_and_etcd() -> None:
    t = parse_timings(METRICS)
    assert t["sum apf wait global-default"] == 4.2 and t["count apf wait global-default"] == 2000  # executed only
    assert t["count handler POST pods/binding"] == 2000 and t["sum handler POST pods/binding"] == 348
    assert t["count handler POST pods"] == 100 and t["sum handler POST pods"] == 10  # not the binding, not GETs
    assert t["count etcd update pods"] == 1000
    assert not any("bucket" in k or "false" in k for k in t)
