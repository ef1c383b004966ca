"""PID -> pod/container attribution on real-shaped /proc/<pid>/cgroup files (tests/data/cgroup/proc)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from device_plugin.watchdog.cgroup import CgroupResolver, host_cgroup_dir, parse_cgroup_file, parse_cgroup_path

DATA = Path(__file__).resolve().parents[1] / "data" / "cgroup"
INDEX: dict[int, dict[str, Any]] = yaml.safe_load((DATA / "index.yaml").read_text())


@pytest.mark.parametrize("pid", sorted(INDEX), ids=lambda p: INDEX[p]["layout"])
def test_resolver_on_each_layout(pid: int) -> None:
    want = INDEX[pid]
    ref = CgroupResolver(str(DATA / "proc")).resolve(pid)
    if want["uid"] is None:
        assert ref is None
        return
    assert ref is not None
    assert (ref.pod_uid, ref.container_id, ref.runtime, ref.version) == (
        want["uid"],
        want["container"],
        want["runtime"],
        want["version"],
    )


def test_every_layout_is_covered() -> None:
    layouts = " ".join(v["layout"] for v in INDEX.values())
    for word in ("v1", "v2", "systemd", "cgroupfs", "containerd", "crio", "conmon", "namespace"):
        assert word in layouts


def test_missing_process_is_unattributed(tmp_path: Path) -> None:
    assert CgroupResolver(str(tmp_path)).resolve(424242) is None


@pytest.mark.parametrize(
    ("path", "root", "want"),
    [
        (
            "/kubepods.slice/kubepods-podaaaaaaaa_bbbb_cccc_dddd_eeeeeeeeeeee.slice/cri-containerd-"
            + "a" * 64
            + ".scope",
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/kubepods.slice/kubepods-podaaaaaaaa_bbbb_cccc_dddd_eeeeeeeeeeee.slice/cri-containerd-"
            + "a" * 64
            + ".scope",
        ),
        (
            "/../../kubepods/burstable/podaaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee/" + "b" * 64,
            "/host/sys/fs/cgroup",
            "/host/sys/fs/cgroup/kubepods/burstable/podaaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee/" + "b" * 64,
        ),
    ],
)
def test_host_cgroup_dir(path: str, root: str, want: str) -> None:
    ref = parse_cgroup_path(path)
    assert ref is not None
    assert host_cgroup_dir(ref, root) == want


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "0::/kubepods/burstable/podnot-a-uid/" + "c" * 64 + "\n",
        "0::/kubepods/burstable/podaaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee/" + "c" * 63 + "\n",  # short id
    ],
)
def test_not_a_container(text: str) -> None:
    assert parse_cgroup_file(text) is None
