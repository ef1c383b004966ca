"""Wire models of k8s.io/kube-scheduler/extender/v1, field for field.

The Go types carry no json tags, so the keys are the capitalised Go field names. Pods and Nodes
stay plain JSON mappings: the core reads what it needs from them.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

# The error type of a body field whose message names its whole path itself (scheduler_extender.app prints it alone).
WHOLE_PATH = "wire_field"

# The longest names kube holds: a namespace is a DNS label (63), a pod or node name a DNS subdomain (253)
# (k8s.io/apimachinery v0.34 pkg/util/validation/validation.go: DNS1123LabelMaxLength, DNS1123SubdomainMaxLength);
# UIDs are UUIDs (36), and 128 leaves room for any apiserver's. A longer one in a body is made up.
MAX_NAMESPACE, MAX_NAME, MAX_UID = 63, 253, 128


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


class NodeList(_Wire):
    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(_Wire):
    """Body of filter and prioritize calls."""

    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderBindingArgs(_Wire):
    """Each name bounded by what kube holds: a refused bind names its node and pod in the answer, the log and the
    event, so an unbounded one would repeat a 16 MiB body in each."""

    PodName: str = Field(min_length=1, max_length=MAX_NAME)
    PodNamespace: str = Field(min_length=1, max_length=MAX_NAMESPACE)
    PodUID: str = Field(default="", max_length=MAX_UID)
    Node: str = Field(min_length=1, max_length=MAX_NAME)


class ExtenderPreemptionArgs(_Wire):
    """The victims stay plain JSON (their Go field names match case-insensitively, as Go's encoding/json matches
    them: scheduler_extender.preempt.given_victims), but their types are checked here, so a body Go would not
    decode either (`Pods: 5`, a victim's `metadata` a string) is a 400 naming the field, not an error deep in the
    verb."""

    Pod: dict[str, Any]
    NodeNameToVictims: dict[str, Any] | None = None
    NodeNameToMetaVictims: dict[str, Any] | None = None

    @field_validator("NodeNameToVictims")
    @classmethod
    def _full(cls, victims: dict[str, Any] | None) -> dict[str, Any] | None:
        _check_victims(victims, meta=False, field="NodeNameToVictims")
        return victims

    @field_validator("NodeNameToMetaVictims")
    @classmethod
    def _meta(cls, victims: dict[str, Any] | None) -> dict[str, Any] | None:
        _check_victims(victims, meta=True, field="NodeNameToMetaVictims")
        return victims


def _json_type(value: object) -> str:
    kinds = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }
    return kinds.get(type(value), type(value).__name__)


def _field(obj: dict[str, Any], name: str) -> object:
    """`obj`'s field `name`, its key matched case-insensitively (Go's encoding/json); None when absent."""
    return next((v for k, v in obj.items() if k.lower() == name.lower()), None)


def _check_victims(victims: dict[str, Any] | None, *, meta: bool, field: str) -> None:
    """extender/v1 Victims {Pods []*v1.Pod, NumPDBViolations int64} or MetaVictims {Pods []*MetaPod{UID string},
    NumPDBViolations int64} per node; null anywhere Go allows a nil. Raises a WHOLE_PATH error naming the first wrong
    field by its path (`field["node"].Pods[0].UID`: node names hold dots), what it is and what is allowed."""

    def wrong(where: str, expected: str, value: object) -> PydanticCustomError:
        text = f"{where}: expected {expected} (or null), got {_json_type(value)}"
        return PydanticCustomError(WHOLE_PATH, "{problem}", {"problem": text})

    for node, v in (victims or {}).items():
        at = f"{field}[{json.dumps(node)}]"
        if v is None:
            continue
        if not isinstance(v, dict):
            raise wrong(at, "an object (Pods, NumPDBViolations)", v)
        pods = _field(v, "Pods")
        if pods is not None and not isinstance(pods, list):
            raise wrong(f"{at}.Pods", "an array of pods", pods)
        violations = _field(v, "NumPDBViolations")
        if violations is not None and (isinstance(violations, bool) or not isinstance(violations, int)):
            raise wrong(f"{at}.NumPDBViolations", "an integer", violations)
        for i, pod in enumerate(pods or []):
            if pod is None:
                continue
            if not isinstance(pod, dict):
                raise wrong(f"{at}.Pods[{i}]", "an object", pod)
            where, holder = (f"{at}.Pods[{i}]", pod) if meta else (f"{at}.Pods[{i}].metadata", _field(pod, "metadata"))
            if holder is None:
                continue
            if not isinstance(holder, dict):
                raise wrong(where, "an object", holder)
            uid = _field(holder, "UID")
            if uid is not None and not isinstance(uid, str):
                raise wrong(f"{where}.UID", "a string", uid)


def event_safe(text: str) -> str:
    """A message kube-scheduler may put in a FailedScheduling event, without `%`: kubernetes v1.34
    pkg/scheduler/schedule_one.go `handleSchedulingFailure` passes the failure text as the *format* of
    `EventRecorder.Eventf`, so "50% memory" would read "50%!m(MISSING)emory" (seen in benchmarks/scale.py)."""
    return text.replace("%", " percent") if "%" in text else text


def filter_result(
    *,
    node_names: list[str] | None,
    nodes: list[dict[str, Any]] | None,
    failed: dict[str, str],
    unresolvable: dict[str, str],
    error: str = "",
) -> dict[str, Any]:
    """ExtenderFilterResult. Exactly one of Nodes / NodeNames is set, matching the request mode."""
    return {
        "Nodes": None if nodes is None else {"metadata": {}, "items": nodes},
        "NodeNames": node_names,
        "FailedNodes": _events_safe(failed),
        "FailedAndUnresolvableNodes": _events_safe(unresolvable),
        "Error": event_safe(error),
    }


def _events_safe(reasons: dict[str, str]) -> dict[str, str]:
    """`event_safe` of every reason. A few distinct reasons cover thousands of nodes, so each distinct one is
    converted once and the answer built in C (`zip`/`map`): a call per node took 2.7 of a full cluster's 4.8 ms
    /filter, as nearly every failure reason names an SM share ("50% cores"). A copy when no reason has a `%`; one
    call per node when most reasons differ."""
    distinct = set(reasons.values())
    if not any("%" in why for why in distinct):
        return dict(reasons)
    if 2 * len(distinct) > len(reasons):  # mostly distinct: the table would only add its lookups
        return {node: event_safe(why) for node, why in reasons.items()}
    safe = {why: event_safe(why) for why in distinct}
    return dict(zip(reasons, map(safe.__getitem__, reasons.values()), strict=True))


def host_priorities(scores: dict[str, int]) -> list[dict[str, Any]]:
    """HostPriorityList of the scored hosts, leaving out those that score 0.

    kube-scheduler adds each entry's score to its host's total, so an absent host and a 0 are the same;
    with the rank mapping only the best ten nodes score, which keeps a 5,000-node answer small."""
    return [{"Host": host, "Score": score} for host, score in scores.items() if score]


def binding_result(error: str = "") -> dict[str, str]:
    return {"Error": event_safe(error)}
