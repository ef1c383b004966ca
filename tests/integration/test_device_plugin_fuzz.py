"""Hypothesis over the plugin's gRPC entry points, through the real server on a Unix socket.

Properties, per call: never INTERNAL or UNKNOWN (no unhandled exception), an answer within the deadline (no
hang), and a refused request leaves the state as it was (served containers, the pods' bind-phases). The
number of inputs tried per entry point is asserted (>= MIN_EXAMPLES) and printed at the end of the session.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device_plugin.api import deviceplugin_v1beta1_pb2 as pb
from device_plugin.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from device_plugin.app import Plugin
from device_plugin.config import PluginConfig
from device_plugin.nvml import real
from device_plugin.podresources import PodResourcesClient
from device_plugin.testing.fake_nvml import FakeNvml
from device_plugin.testing.kubelet import FakeKubelet
from device_plugin.testing.pods import MemoryPods
from device_plugin.testing.workload import placed_pods

NODE = "gpu-node-1"
DATA = Path(__file__).parent.parent / "data" / "nvml"
DEADLINE_S = 15.0  # catches a hang; generous, as a loaded 2-core CI machine answers slowly, not wrongly
MIN_EXAMPLES = 150
COUNTS: dict[str, int] = {}
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED}


class Fuzzed:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="dpf")
        self.kubelet = FakeKubelet(self.dir, f"{self.dir}-pr.sock")
        self.kubelet.start()
        self.pods = MemoryPods()
        conf = PluginConfig(
            node_name=NODE,
            plugin_dir=self.dir,
            pod_resources_socket=f"{self.dir}-pr.sock",
            allocate_retry_s=0.05,
            health_probe_s=0.2,
            xid_recovery_s=3600,
            reconcile_s=3600,
            watchdog=False,
        )
        self.plugin = Plugin(
            conf,
            nvml=FakeNvml.from_file(DATA / "h100x8.yaml"),
            pods=self.pods,
            kubelet=PodResourcesClient(conf.pod_resources_socket),
            is_nvml_error=real.NVMLError,
        )
        self.plugin.start()
        assert self.kubelet.wait(lambda: len(self.kubelet.state.devices) == 80)
        for i, p in enumerate(placed_pods(self.plugin.gpus, 12, 16, node=NODE)):
            self.pods.add(p.record(namespace="llm", node=NODE, bind_time=f"2026-01-01T00:00:{i:02d}Z"))
        self.channel = grpc.insecure_channel(f"unix://{self.plugin.server.paths.plugin}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)
        self.ids = sorted(self.kubelet.state.devices)

    def state(self) -> tuple[object, ...]:
        self.plugin.manager.drain()
        return (
            dict(self.plugin.manager.served()),
            {k: p.bind_phase for k, p in self.pods.pods.items()},
        )

    def stop(self) -> None:
        self.channel.close()
        self.plugin.stop()
        self.kubelet.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def fz(request: pytest.FixtureRequest) -> Iterator[Fuzzed]:
    f = Fuzzed()
    _report_at_session_end(request.config)
    yield f
    f.stop()


class _Summary:
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if COUNTS:
            per = ", ".join(f"{k} {v}" for k, v in sorted(COUNTS.items()))
            terminalreporter.write_line(f"device-plugin gRPC fuzz: inputs tried per entry point: {per}")


def _report_at_session_end(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("dp-fuzz-summary"):
        config.pluginmanager.register(_Summary(), "dp-fuzz-summary")


def call(fn: object, *args: object) -> grpc.StatusCode:
    """The status of one call within DEADLINE_S (OK or the error's code)."""
    try:
        fn(*args, timeout=DEADLINE_S)  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return,attr-defined]
    return grpc.StatusCode.OK


# derandomize as the loaded profile says (tests/conftest.py): the same examples on every run, CI's included, so no
# merge is refused by a new draw; HYPOTHESIS_PROFILE=kube-vgpu-explore draws new ones when hunting.
FUZZ = settings(
    max_examples=MIN_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
text_ids = st.one_of(
    st.text(max_size=80),
    st.sampled_from(["", "::", "::0", "GPU-x::", "GPU-x::\u00b2", "GPU-x::\u0661", "GPU-x::-1", "GPU-x::1e3"]),
    st.integers(0, 10**6).map(lambda n: f"GPU-00000000-0000-0000-0000-000000000000::{n}"),
)


def device_ids(fz: Fuzzed) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(fz.ids), text_ids)


def test_allocate_fuzz(fz: Fuzzed) -> None:
    seen: dict[grpc.StatusCode, int] = {}

    @FUZZ
    @given(st.data())
    def run(data: st.DataObject) -> None:
        requests = data.draw(st.lists(st.lists(device_ids(fz), max_size=4), max_size=3), label="requests")
        before = fz.state()
        t0 = time.monotonic()
        code = call(
            fz.stub.Allocate,
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=r) for r in requests]),
        )
        COUNTS["Allocate"] = COUNTS.get("Allocate", 0) + 1
        seen[code] = seen.get(code, 0) + 1
        assert code not in BAD, f"{requests!r} -> {code}"
        assert time.monotonic() - t0 < DEADLINE_S
        if code != grpc.StatusCode.OK:
            assert fz.state() == before, f"refused {requests!r} changed the state"

    run()
    assert COUNTS["Allocate"] >= MIN_EXAMPLES
    assert seen.get(grpc.StatusCode.FAILED_PRECONDITION, 0) > 0


def test_get_preferred_allocation_fuzz(fz: Fuzzed) -> None:
    @FUZZ
    @given(st.data())
    def run(data: st.DataObject) -> None:
        ids = device_ids(fz)
        reqs = data.draw(
            st.lists(
                st.builds(
                    pb.ContainerPreferredAllocationRequest,
                    available_deviceIDs=st.lists(ids, max_size=20),
                    must_include_deviceIDs=st.lists(ids, max_size=3),
                    allocation_size=st.integers(-(2**31), 2**31 - 1),
                ),
                max_size=3,
            ),
            label="requests",
        )
        before = fz.state()
        code = call(fz.stub.GetPreferredAllocation, pb.PreferredAllocationRequest(container_requests=reqs))
        COUNTS["GetPreferredAllocation"] = COUNTS.get("GetPreferredAllocation", 0) + 1
        assert code == grpc.StatusCode.OK, f"{reqs!r} -> {code}"
        assert fz.state() == before

    run()
    assert COUNTS["GetPreferredAllocation"] >= MIN_EXAMPLES


def test_pre_start_container_fuzz(fz: Fuzzed) -> None:
    @FUZZ
    @given(st.lists(text_ids, max_size=10))
    def run(ids: list[str]) -> None:
        before = fz.state()
        code = call(fz.stub.PreStartContainer, pb.PreStartContainerRequest(devices_ids=ids))
        COUNTS["PreStartContainer"] = COUNTS.get("PreStartContainer", 0) + 1
        assert code == grpc.StatusCode.OK
        assert fz.state() == before

    run()
    assert COUNTS["PreStartContainer"] >= MIN_EXAMPLES


def test_list_and_watch_start_fuzz(fz: Fuzzed) -> None:
    """Up to 6 streams opened at once, some read, all dropped: each read stream starts with the full device
    list or, past the cap on streams (the kubelet holds one), is refused RESOURCE_EXHAUSTED; never a hang;
    every slot is free again once they are dropped, and the kubelet's own stream is untouched."""
    servicer = fz.plugin.server.servicer
    assert servicer is not None and servicer.watching == 1

    @FUZZ
    @given(st.lists(st.booleans(), min_size=1, max_size=6))
    def run(reads: list[bool]) -> None:
        streams = [fz.stub.ListAndWatch(pb.Empty(), timeout=DEADLINE_S) for _ in reads]
        COUNTS["ListAndWatch"] = COUNTS.get("ListAndWatch", 0) + 1
        served = 0
        try:
            for stream, read in zip(streams, reads, strict=True):
                if not read:
                    continue
                try:
                    first = next(stream)
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc  # type: ignore[attr-defined]
                else:
                    assert sorted(d.ID for d in first.devices) == fz.ids
                    served += 1
        finally:
            for stream in streams:
                stream.cancel()
        assert served <= servicer.max_watchers - 1
        # the server drops a cancelled stream on its own threads: waited for, generously (a loaded CI machine)
        give_up = time.monotonic() + 30
        while servicer.watching != 1:
            assert time.monotonic() < give_up, f"{servicer.watching} streams still open 30 s after their cancel"
            time.sleep(0.01)

    run()
    assert COUNTS["ListAndWatch"] >= 100  # 126 distinct inputs: every one of them, nearly
    assert len(fz.kubelet.state.devices) == 80


def test_raw_bytes_do_not_break_the_server(fz: Fuzzed) -> None:
    """Undecodable request bytes: gRPC's own refusal, never a hang, and the server still serves."""
    raw = fz.channel.unary_unary(
        "/v1beta1.DevicePlugin/Allocate", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )

    @FUZZ
    @given(st.binary(max_size=200))
    def run(body: bytes) -> None:
        before = fz.state()
        code = call(raw, body)
        COUNTS["Allocate(raw bytes)"] = COUNTS.get("Allocate(raw bytes)", 0) + 1
        assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert fz.state() == before or code == grpc.StatusCode.OK

    run()
    assert call(fz.stub.GetDevicePluginOptions, pb.Empty()) == grpc.StatusCode.OK
