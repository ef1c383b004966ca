"""Cordoned GPUs: an admin takes a GPU out of service for new slices while the slices on it run to completion.

The admin writes the node annotation `vgpu.io/cordoned-gpus` (comma-separated UUIDs; HAMi's `hami.io/device-cordon`
is read too, so a HAMi cluster's cordons carry over: HAMi pkg/device/nvidia/device.go, `DeviceCordonAnnotation`,
comma-separated UUIDs, trimmed, empty entries skipped). Nothing is silently dropped: an entry that is not a GPU
UUID is `malformed`, a UUID that is not on the node is `unknown`; both are reported (extender log and metrics,
`vgpu show`). An unknown UUID stays cordoned, so a GPU that appears later under it gets no slice either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from vgpu import annotations as ann
from vgpu.devices import Cordon
from vgpu.hami import GPU_UUID

HAMI_DEVICE_CORDON = "hami.io/device-cordon"
CORDON_KEYS = (ann.NODE_CORDONED_GPUS, HAMI_DEVICE_CORDON)


def problems(node: str, cordon: Cordon) -> list[str]:
    """One message per kind of bad entry, naming the annotation's keys and what is allowed."""
    keys = " / ".join(CORDON_KEYS)
    out: list[str] = []
    if cordon.malformed:
        shown = ", ".join(map(repr, cordon.malformed))
        out.append(f"node {node}: {keys}: not GPU UUIDs, ignored: {shown}; allowed: GPU-... or MIG-... UUIDs")
    if cordon.unknown:
        out.append(f"node {node}: {keys}: cordoned but not in the node's inventory: {', '.join(cordon.unknown)}")
    return out


def parse_cordon(annotations: Mapping[str, object], known: Iterable[str]) -> Cordon:
    """The cordon the node's annotations ask for; `known` are the UUIDs of its inventory."""
    entries: list[str] = []
    for key in CORDON_KEYS:
        value = annotations.get(key)
        if isinstance(value, str):
            entries += [e.strip() for e in value.split(",") if e.strip()]
    if not entries:
        return Cordon()
    good = [e for e in entries if GPU_UUID.match(e)]
    malformed = tuple(dict.fromkeys(e for e in entries if not GPU_UUID.match(e)))
    have = set(known)
    unknown = tuple(dict.fromkeys(u for u in good if u not in have))
    return Cordon(uuids=frozenset(good), malformed=malformed, unknown=unknown)
