"""vgpu.podshape: the JSON types of the Pod fields the core reads, with the path of the first wrong one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from vgpu.podshape import PodShapeError, check_pod_shape

CORPUS = sorted((Path(__file__).parents[1] / "data" / "pods").glob("*.yaml"))


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_every_corpus_pod_passes(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind", "Pod") == "Pod":
            check_pod_shape(doc)


def test_null_and_absent_fields_pass_as_go_omitempty_leaves_them() -> None:
    check_pod_shape({})
    check_pod_shape({"metadata": None, "spec": {"containers": None, "nodeName": None}, "status": None})
    check_pod_shape({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}, "requests": None}}]}})


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        ([], "<pod>: expected an object (a Pod), got an array"),
        ({"metadata": "x"}, "metadata: expected an object, got a string"),
        ({"metadata": {"uid": 7}}, "metadata.uid: expected a string, got a number"),
        ({"metadata": {"annotations": {"a": True}}}, "metadata.annotations['a']: expected a string, got a boolean"),
        ({"spec": {"initContainers": [3]}}, "spec.initContainers[0]: expected an object (a container), got a number"),
        ({"spec": {"containers": [{"command": "sh"}]}}, "spec.containers[0].command: expected an array, got a string"),
        (
            {"spec": {"containers": [{}, {"resources": {"limits": {"x": None}}}]}},
            "spec.containers[1].resources.limits['x']: expected a quantity string, got null",
        ),
        ({"status": {"phase": []}}, "status.phase: expected a string, got an array"),
    ],
)
def test_the_first_wrong_field_is_named_with_its_path(pod: Any, message: str) -> None:
    with pytest.raises(PodShapeError) as info:
        check_pod_shape(pod)
    assert str(info.value) == message


def test_a_prefix_names_where_the_pod_sits() -> None:
    with pytest.raises(PodShapeError, match=r"^Pod\.spec: expected an object"):
        check_pod_shape({"spec": 1}, "Pod")
