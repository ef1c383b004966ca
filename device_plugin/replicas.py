"""Replica device IDs: each physical GPU is advertised to the kubelet as `split` replicas `<uuid>::<n>`."""

from __future__ import annotations

SEPARATOR = "::"
MAX_ID_LEN = 63  # the kubelet rejects longer device IDs


def replica_id(uuid: str, n: int) -> str:
    rid = f"{uuid}{SEPARATOR}{n}"
    if len(rid) > MAX_ID_LEN:
        raise ValueError(f"device ID {rid!r} is {len(rid)} chars; the kubelet allows {MAX_ID_LEN}")
    return rid


def replica_ids(uuid: str, split: int) -> list[str]:
    return [replica_id(uuid, n) for n in range(split)]


def gpu_of(device_id: str) -> str:
    """The physical GPU uuid of a replica ID; raises ValueError for an ID we never advertised."""
    uuid, sep, n = device_id.rpartition(SEPARATOR)
    if not sep or not uuid or not (n.isascii() and n.isdigit()):  # ASCII: isdigit() passes "\u00b2"
        raise ValueError(f"{device_id!r} is not a vGPU replica ID (<uuid>{SEPARATOR}<n>)")
    return uuid


def replica_number(device_id: str) -> int:
    gpu_of(device_id)
    return int(device_id.rpartition(SEPARATOR)[2])
