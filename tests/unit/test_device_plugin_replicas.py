from __future__ import annotations

import pytest

from device_plugin.replicas import MAX_ID_LEN, gpu_of, replica_id, replica_ids, replica_number

REAL_UUID = "GPU-9b3d1c9e-4f1a-7c2b-8e5d-0a1b2c3d4e5f"


def test_replicas_round_trip_and_fit_the_kubelet_limit() -> None:
    ids = replica_ids(REAL_UUID, 100)
    assert len(set(ids)) == 100 and all(len(i) <= MAX_ID_LEN for i in ids)
    assert {gpu_of(i) for i in ids} == {REAL_UUID}
    assert [replica_number(i) for i in ids] == list(range(100))


@pytest.mark.parametrize("bad", ["GPU-x", "GPU-x::", "::3", "GPU-x::a"])
def test_foreign_ids_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        gpu_of(bad)


def test_too_long_id_is_rejected() -> None:
    with pytest.raises(ValueError, match="63"):
        replica_id("G" * 62, 1)
