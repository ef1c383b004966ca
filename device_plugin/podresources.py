"""Client of the kubelet PodResources v1 API: which pods the kubelet knows and which device IDs they hold."""

from __future__ import annotations

import logging

import grpc

from device_plugin.api import podresources_v1_pb2 as pr
from device_plugin.api import podresources_v1_pb2_grpc as pr_grpc
from device_plugin.pods import KubeletView

log = logging.getLogger(__name__)


def view_from_response(resp: pr.ListPodResourcesResponse, *, resource: str) -> KubeletView:
    pods: set[str] = set()
    devices: dict[tuple[str, str], tuple[str, ...]] = {}
    for p in resp.pod_resources:
        key = f"{p.namespace}/{p.name}"
        pods.add(key)
        for c in p.containers:
            ids = tuple(i for d in c.devices if d.resource_name == resource for i in d.device_ids)
            if ids:
                devices[(key, c.name)] = ids
    return KubeletView(pods=frozenset(pods), devices=devices)


class PodResourcesClient:
    """KubeletPods over the Unix socket; errors are logged and reported as None (view unavailable)."""

    def __init__(self, socket_path: str, *, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    def view(self, *, resource: str) -> KubeletView | None:
        try:
            with grpc.insecure_channel(f"unix://{self.socket_path}") as channel:
                resp = pr_grpc.PodResourcesListerStub(channel).List(
                    pr.ListPodResourcesRequest(), timeout=self.timeout_s
                )
        except grpc.RpcError as exc:
            log.warning("PodResources List at %s failed: %s", self.socket_path, exc)
            return None
        return view_from_response(resp, resource=resource)
