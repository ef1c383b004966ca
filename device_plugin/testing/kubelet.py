"""A test kubelet: the Registration service on kubelet.sock, a PodResources server, and an admit() that
drives GetPreferredAllocation/Allocate over the plugin's socket the way the kubelet's device manager does
(one pod at a time, containers in spec order, pod known to PodResources before its devices are)."""

from __future__ import annotations

import os
import stat
import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from device_plugin.api import deviceplugin_v1beta1_pb2 as pb
from device_plugin.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from device_plugin.api import podresources_v1_pb2 as pr
from device_plugin.api import podresources_v1_pb2_grpc as pr_grpc


@dataclass
class KubeletState:
    registrations: list[pb.RegisterRequest] = field(default_factory=list)
    devices: dict[str, pb.Device] = field(default_factory=dict)
    device_updates: int = 0
    known: list[str] = field(default_factory=list)  # pod keys in admission order
    allocated: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        # Dial the plugin first: whoever waits for the registration then finds the new stub, not the closed one.
        self.kubelet.connect(request)
        with self.kubelet.state.cond:
            self.kubelet.state.registrations.append(request)
            self.kubelet.state.cond.notify_all()
        return pb.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def List(self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        s = self.kubelet.state
        with s.cond:
            out = []
            for key in s.known:
                ns, name = key.split("/", 1)
                containers = [
                    pr.ContainerResources(
                        name=c, devices=[pr.ContainerDevices(resource_name=self.kubelet.resource, device_ids=ids)]
                    )
                    for (k, c), ids in s.allocated.items()
                    if k == key
                ]
                out.append(pr.PodResources(name=name, namespace=ns, containers=containers))
        return pr.ListPodResourcesResponse(pod_resources=out)


class FakeKubelet:
    def __init__(self, plugin_dir: str, pod_resources_socket: str, resource: str = "nvidia.com/gpu") -> None:
        self.plugin_dir = plugin_dir
        self.pod_resources_socket = pod_resources_socket
        self.resource = resource
        self.state = KubeletState()
        self._server: grpc.Server | None = None
        self._pr_server: grpc.Server | None = None
        self._channel: grpc.Channel | None = None
        self.stub: pb_grpc.DevicePluginStub | None = None
        self.admit_lock = threading.Lock()

    @property
    def socket(self) -> str:
        return os.path.join(self.plugin_dir, "kubelet.sock")

    def start(self) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        self._server.start()
        if self._pr_server is None:
            self._pr_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), self._pr_server)
            self._pr_server.add_insecure_port(f"unix://{self.pod_resources_socket}")
            self._pr_server.start()

    def restart(self) -> None:
        """What a kubelet restart does to the folder: every socket deleted (other files, such as its checkpoint,
        kept), kubelet.sock recreated. The allocations it holds survive, as its checkpoint makes them.

        k8s.io/kubernetes v1.34.4 pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go (server.Start calls
        CleanupPluginDirectory, then listens on kubelet.sock) and ../manager.go (CleanupPluginDirectory removes
        every socket in the folder except the checkpoint file; directories and other files stay)."""
        if self._server is not None:
            self._server.stop(0).wait()
        if self._channel is not None:
            self._channel.close()
        for name in os.listdir(self.plugin_dir):
            path = os.path.join(self.plugin_dir, name)
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        self.start()

    def stop(self) -> None:
        for s in (self._server, self._pr_server):
            if s is not None:
                s.stop(0).wait()
        if self._channel is not None:
            self._channel.close()

    def connect(self, request: pb.RegisterRequest) -> None:
        """Dial the plugin back and follow ListAndWatch in a thread, as the kubelet does after Register."""
        if self._channel is not None:
            self._channel.close()
        self._channel = grpc.insecure_channel(f"unix://{os.path.join(self.plugin_dir, request.endpoint)}")
        stub = pb_grpc.DevicePluginStub(self._channel)
        self.stub = stub

        def follow() -> None:
            try:
                for resp in stub.ListAndWatch(pb.Empty()):
                    with self.state.cond:
                        self.state.devices = {d.ID: d for d in resp.devices}
                        self.state.device_updates += 1
                        self.state.cond.notify_all()
            except grpc.RpcError:
                pass

        threading.Thread(target=follow, daemon=True).start()

    def wait(self, predicate: object, timeout: float = 30.0) -> bool:
        """Until `predicate` holds (True) or `timeout` passes (False); generous, as it returns once it holds."""
        with self.state.cond:
            return bool(self.state.cond.wait_for(predicate, timeout=timeout))  # type: ignore[arg-type]

    def available(self) -> list[str]:
        used = {i for ids in self.state.allocated.values() for i in ids}
        return sorted(i for i, d in self.state.devices.items() if d.health == "Healthy" and i not in used)

    def admit(self, pod_key: str, containers: list[tuple[str, int]]) -> list[pb.ContainerAllocateResponse]:
        """Admit one pod: known to PodResources first, then per container GetPreferredAllocation + Allocate."""
        assert self.stub is not None, "plugin not registered"
        with self.admit_lock:
            with self.state.cond:
                if pod_key not in self.state.known:  # admitted again (a retry): known once
                    self.state.known.append(pod_key)
            out = []
            for name, count in containers:
                with self.state.cond:
                    available = self.available()
                pref = self.stub.GetPreferredAllocation(
                    pb.PreferredAllocationRequest(
                        container_requests=[
                            pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=count)
                        ]
                    )
                )
                chosen = [i for i in pref.container_responses[0].deviceIDs if i in available][:count]
                chosen += [i for i in available if i not in chosen][: count - len(chosen)]
                resp = self.stub.Allocate(
                    pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)])
                )
                with self.state.cond:
                    self.state.allocated[(pod_key, name)] = chosen
                out.append(resp.container_responses[0])
            return out
