from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu import annotations as ann
from vgpu.requests import ContainerRequest, PodRequest
from vgpu.roles import Role, RoleDecision
from webhook import labels as L


def _req(*containers: ContainerRequest) -> PodRequest:
    return PodRequest(containers=containers)


def _c(count: int = 1, mem: int | None = None, pct: int | None = None, cores: int | None = None) -> ContainerRequest:
    return ContainerRequest("c", count, mem, pct, cores, 1)


@pytest.mark.parametrize(
    ("value", "ok"),
    [("prefill", True), ("", True), ("a" * 63, True), ("a" * 64, False), ("-x", False), ("x-", False), ("a/b", False)],
)
def test_label_value_syntax(value: str, ok: bool) -> None:
    assert L.is_valid_value(value) is ok


@pytest.mark.parametrize(
    ("request_", "expect"),
    [
        (_req(_c(mem=40000, cores=60)), {ann.LABEL_GPUMEM: "40000", ann.LABEL_GPUCORES: "60", ann.LABEL_VGPUS: "1"}),
        (_req(_c(pct=50)), {ann.LABEL_GPUMEM_PERCENTAGE: "50", ann.LABEL_GPUCORES: "50"}),
        (_req(_c(mem=1000)), {ann.LABEL_GPUMEM: "1000", ann.LABEL_GPUCORES: "proportional"}),
        (_req(_c(count=2, pct=100), _c(count=3, mem=10)), {ann.LABEL_VGPUS: "5", ann.LABEL_GPUMEM_PERCENTAGE: "100"}),
    ],
)
def test_slice_labels(request_: PodRequest, expect: dict[str, str]) -> None:
    got = L.slice_labels(request_, RoleDecision(Role.DECODE, "label"))
    assert expect.items() <= got.items()
    assert got[ann.LABEL_ROLE] == "decode" and got[ann.LABEL_MANAGED] == "true"
    assert not ({ann.LABEL_GPUMEM, ann.LABEL_GPUMEM_PERCENTAGE} <= got.keys())
    assert set(L.stale(got)) == set(ann.WEBHOOK_LABELS) - got.keys()


@given(
    count=st.integers(1, 64),
    mem=st.one_of(st.none(), st.integers(1, 10**9)),
    cores=st.one_of(st.none(), st.integers(0, 100)),
    pct=st.integers(1, 100),
    role=st.sampled_from(list(Role)),
)
def test_slice_labels_are_always_valid(count: int, mem: int | None, cores: int | None, pct: int, role: Role) -> None:
    c = _c(count=count, mem=mem, pct=None if mem is not None else pct, cores=cores)
    got = L.slice_labels(_req(c), RoleDecision(role, "default"))
    assert all(L.is_valid_value(v) for v in got.values())
    assert got[ann.LABEL_ROLE] == role.value
