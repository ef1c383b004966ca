"""benchmarks/scale.py's `--scheduler-qps`: kube-scheduler's client QPS and burst set in the shipped profile, nothing
else of it changed, and the CPU ratio of the four measured processes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from benchmarks.scale import cpu_ratio, with_client_qps

SHIPPED = (Path(__file__).resolve().parents[2] / "deploy/scheduler/kube-scheduler-config.yaml").read_text()


def test_qps_and_twice_its_burst_are_set_and_the_profile_is_kept() -> None:
    before = yaml.safe_load(SHIPPED)
    after = yaml.safe_load(with_client_qps(SHIPPED, 400))
    assert after["clientConnection"] == {"qps": 400, "burst": 800}
    del after["clientConnection"]
    assert after == before


def test_an_existing_client_connection_keeps_its_other_fields() -> None:
    text = yaml.safe_dump({"clientConnection": {"kubeconfig": "/k", "qps": 5}, "profiles": []})
    assert yaml.safe_load(with_client_qps(text, 0.4))["clientConnection"] == {
        "kubeconfig": "/k",
        "qps": 0.4,
        "burst": 1,
    }


def test_none_leaves_the_text_as_it_is() -> None:
    assert with_client_qps(SHIPPED, None) is SHIPPED


def test_cpu_ratio_sums_the_four_processes() -> None:
    base = {"cpu_ms_per_pod": {"etcd": 4.0, "extender": 1.0, "kube-apiserver": 12.0, "kube-scheduler": 3.0}}
    arm = {"cpu_ms_per_pod": {"etcd": 4.0, "extender": 8.0, "kube-apiserver": 13.0, "kube-scheduler": 5.0}}
    assert cpu_ratio(arm, base) == pytest.approx(1.5)
    assert cpu_ratio(arm, {"cpu_ms_per_pod": {}}) is None
