"""The performance formulas: the sources' numbers come back out, and each knob moves what it should."""

from __future__ import annotations

import pytest

from vgpu.perf import model as pm
from vgpu.perf.params import H200, MODELS, PerfParams

P = PerfParams()
M70 = MODELS["llama-70b-fp8"]


@pytest.mark.parametrize(
    ("share", "s_sat", "expected"),
    [(0.1, 0.2, 0.5), (0.2, 0.2, 1.0), (0.3, 0.2, 1.0), (0.35, 0.35, 1.0), (0.25, 0.5, 0.5), (0.0, 0.35, 0.0)],
)
def test_beta_saturates_at_s_sat(share: float, s_sat: float, expected: float) -> None:
    assert pm.beta(share, s_sat) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("link", "issue_ms"),
    [("nvlink", 4.5), ("rack", 30.0), ("cross-rack", 61.0)],
)
def test_kv_transfer_of_a_4k_prompt_of_70b_matches_the_issue(link: str, issue_ms: float) -> None:
    ms = 1000 * pm.kv_transfer_seconds(M70, H200, link, P)  # type: ignore[arg-type]
    assert ms == pytest.approx(issue_ms, rel=0.15)


def test_layerwise_transfer_leaves_a_constant_visible() -> None:
    layer = P.with_(layerwise_kv=True)
    assert pm.kv_transfer_seconds(M70, H200, "cross-rack", layer) == pytest.approx(P.layerwise_visible_s)
    # A transfer shorter than the constant stays as it is.
    assert pm.kv_transfer_seconds(M70, H200, "same-gpu", layer) < P.layerwise_visible_s


def test_prefill_time_is_inverse_in_sm_share_and_tp() -> None:
    m = MODELS["llama-8b"]
    full = pm.prefill_seconds(m, H200, 1.0, P)
    assert pm.prefill_seconds(m, H200, 0.5, P) == pytest.approx(2 * full)
    assert pm.prefill_seconds(m, H200, 0.5, P, tp=2) == pytest.approx(full)
    # fp8 uses the fp8 peak: a 70B fp8 prefill is not 8.8x slower than an 8B bf16 one.
    ratio = pm.prefill_seconds(M70, H200, 1.0, P) / full
    assert ratio == pytest.approx(70.6 / 8.0 / 2, rel=0.01)


def test_two_decodes_at_the_measured_mbu_reproduce_the_mps_slowdown() -> None:
    """Two full decodes under MPS: +19.5 % TPOT measured; demand 2 x 0.6 = 1.2 gives +20 %."""
    assert 2 * pm.decode_demand(1.0, P) - 1 == pytest.approx(0.195, abs=0.01)


def test_decode_rate_falls_with_bandwidth_and_stops_when_the_slo_is_missed() -> None:
    m = MODELS["llama-8b"]
    batch = pm.kv_batch_limit(m, 42.9, 1, P)
    assert batch > 16
    fast = pm.decode_rate_within(m, 2800.0, batch, 0.05, P)
    slow = pm.decode_rate_within(m, 1400.0, batch, 0.05, P)
    assert fast > slow > 0
    # A TPOT SLO below reading the weights once cannot be met at any batch.
    assert pm.decode_rate_within(m, 1400.0, batch, 0.005, P) == 0.0


@pytest.mark.parametrize(("service", "kv", "slo"), [(0.3, 0.0, 0.6), (0.3, 0.05, 0.6), (0.5, 0.0, 2.0)])
def test_prefill_rate_within_meets_the_slo_exactly(service: float, kv: float, slo: float) -> None:
    rate = pm.prefill_rate_within(service, kv, slo)
    rho = rate * service
    assert 0 < rho < 1
    assert rho * service / (2 * (1 - rho)) + service + kv == pytest.approx(slo)


def test_prefill_rate_is_zero_without_slack() -> None:
    assert pm.prefill_rate_within(0.5, 0.2, 0.6) == 0.0
