"""The live-cluster report (vgpu.whatif.live): histogram arithmetic as Prometheus does it, and the bundled
scenarios replayed as vLLM metric series (tests/e2e/vllm_replay.py) read back without a Prometheus: the live
verdict names the same layer as the simulation's. The same through a real Prometheus:
tests/e2e/test_validate_live_e2e.py."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import replace

import pytest

from tests.e2e.vllm_replay import Replay
from vgpu.perf.params import PerfParams
from vgpu.whatif import live
from vgpu.whatif.live import Histogram, Window
from vgpu.whatif.scenarios import SCENARIOS
from vgpu.whatif.sim import kv_capacity_tokens, simulate
from vgpu.whatif.verdict import diagnose, judge
from vgpu.whatif.workload import generate
from vgpu_cli.main import main

PARAMS = PerfParams()
REPLAYED = {"few-decode": 60.0, "uneven-slices": 60.0, "healthy": 60.0, "round-robin-chat": 120.0, "cross-rack": 120.0}
_LINE = re.compile(r"^([\w:]+)\{([^}]*)\} (\S+)$")


def test_histogram_quantile_and_share_interpolate_inside_the_bucket() -> None:
    h = Histogram(((0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (math.inf, 40.0)), 12.0, 40.0)
    assert h.quantile(0.5) == pytest.approx(0.3)  # rank 20: halfway through (0.1, 0.5]
    assert h.quantile(0.25) == pytest.approx(0.1)
    assert h.share_within(0.5) == pytest.approx(0.75)
    assert h.share_within(0.3) == pytest.approx(0.5)
    assert h.share_within(5.0) == 1.0
    assert h.mean() == pytest.approx(0.3)
    assert math.isnan(Histogram().quantile(0.5))
    over = Histogram(((1.0, 1.0), (math.inf, 4.0)), 0.0, 4.0)
    assert over.quantile(0.99) == 1.0  # past the last finite bound: that bound, as histogram_quantile


def _parse(text: str) -> dict[tuple[str, str], dict[str, float]]:
    """(metric, role) -> {le or "": value summed over pods}."""
    out: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        out[(m.group(1), labels.get("role", ""))][labels.get("le", "")] += float(m.group(3))
    return out


def window_from_replay(rp: Replay, seconds: float, step: float = 1.0) -> Window:
    """What the adapter would read from a Prometheus that scraped `rp` over [0, seconds]."""
    m = _parse(rp.text(seconds))
    names = live.NAMES["vllm"]

    def hist(key: str, role: str, name: str = "") -> Histogram:
        name = name or names[key][0]
        b = m[(f"{name}_bucket", role)]
        buckets = tuple(sorted((float(le), v) for le, v in b.items()))
        return Histogram(buckets, m[(f"{name}_sum", role)][""], m[(f"{name}_count", role)][""])

    steps = [k * step for k in range(int(seconds / step) + 1)]
    pods = [i for i in rp.pool.instances]
    return Window(
        seconds=seconds,
        arrivals=m[(live.ROUTER_REQUESTS, "")][""],
        ttft=hist("ttft", "", live.ROUTER_TTFT),
        tpot=hist("tpot", "decode"),
        prefill_queue=hist("queue", "prefill"),
        decode_queue=hist("queue", "decode"),
        kv_xfer=hist("kv_xfer", "decode"),
        prompt_tokens=hist("prompt", "decode"),
        output_tokens=hist("output", "decode"),
        prefix_queries=m[(names["prefix_queries"][0], "prefill")][""],
        prefix_hits=m[(names["prefix_hits"][0], "prefill")][""],
        running={i.name: [rp._gauge(i.name, "running", t) for t in steps] for i in pods},
        waiting={i.name: [rp._gauge(i.name, "waiting", t) for t in steps] for i in pods},
        kv_usage={
            i.name: [rp._gauge(i.name, "kv_tokens", t) / rp.kv_cap[i.name] for t in steps]
            for i in pods
            if i.role == "decode"
        },
    )


@pytest.mark.parametrize("name", list(REPLAYED))
def test_replayed_scenario_gives_the_simulations_verdict(name: str) -> None:
    s = SCENARIOS[name]
    reqs = generate(replace(s.workload, duration_s=REPLAYED[name]), s.seed)
    offline, verdict = diagnose(s.pool, reqs, s.policy, s.slos, PARAMS)
    assert verdict.layer == s.planted
    rp = Replay("ns", s.pool, reqs, simulate(s.pool, reqs, s.policy, PARAMS), PARAMS)
    w = window_from_replay(rp, REPLAYED[name] + 2)
    cache = sum(kv_capacity_tokens(s.pool, i, PARAMS) for i in s.pool.role("prefill"))
    rep = live.build(s.pool, w, s.slos, PARAMS, live.oracle_hit_rate(reqs, cache))
    f = judge(rep, s.pool, s.policy)
    assert (f.layer if f else "none") == s.planted, (rep, f)
    assert rep.oracle_hit_rate == pytest.approx(offline.oracle_hit_rate)
    # within 10 points; 15 where the SLO falls between vLLM's bucket bounds (cross-rack's 0.2 s: 0.1-0.25)
    tol = 0.1 if s.slos.ttft_s in live.TTFT_BUCKETS else 0.15
    assert abs(rep.ttft_attainment - offline.ttft_attainment) < tol, (rep.ttft_attainment, offline.ttft_attainment)
    engine_ttft = hist_of(rp, REPLAYED[name] + 2)
    assert engine_ttft.count == w.ttft.count and engine_ttft.mean() < w.ttft.mean()


def hist_of(rp: Replay, seconds: float) -> Histogram:
    """The decode pods' own vLLM TTFT: it misses the prefill part under P/D."""
    m = _parse(rp.text(seconds))
    name = live.NAMES["vllm"]["ttft"][0]
    b = m[(f"{name}_bucket", "decode")]
    return Histogram(tuple(sorted((float(le), v) for le, v in b.items())), m[(f"{name}_sum", "decode")][""],
                     m[(f"{name}_count", "decode")][""])  # fmt: skip


def test_pool_from_slices_orders_roles_and_treats_best_effort_as_the_whole_gpu() -> None:
    s = SCENARIOS["healthy"]
    slices = [
        live.Slice("d0", "decode", 0.0, 40.0, "g1", "n0"),
        live.Slice("p0", "prefill", 0.4, 40.0, "g0", "n0"),
    ]
    pool = live.pool_from_slices(s.pool.model, s.pool.gpu, slices)
    assert [i.name for i in pool.instances] == ["p0", "d0"]
    assert pool.instances[1].sm_share == 1.0
    with pytest.raises(ValueError, match="no decode instance"):
        live.pool_from_slices(s.pool.model, s.pool.gpu, slices[1:])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--window", "ten"], "--window 'ten'"),
        (["--model", "gpt-9"], "--model 'gpt-9'"),
        ([], "live mode needs --routing"),
        (["--step", "1"], "--prometheus http://127.0.0.1:1: "),  # nothing listens there
    ],
)
def test_live_mode_bad_arguments_name_what_is_wrong(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["validate", "--prometheus", "http://127.0.0.1:1", "--model", "llama-8b"]
    if argv and argv[0] != "--model":
        base += ["--routing", "round-robin"]
    assert main(base + argv) == 2
    assert message in capsys.readouterr().err
