"""Request-level what-if (vgpu.whatif, `vgpu validate`): the bundled scenarios' verdicts, the simulation's
timing against the performance formulas, the prefix cache, routing, the trace format and the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from vgpu.perf import model as pm
from vgpu.perf.params import LINK_GB_S, PerfParams
from vgpu.whatif import routing, traces
from vgpu.whatif.deployment import Instance, Pool, link
from vgpu.whatif.placed import place_pool
from vgpu.whatif.scenarios import PLACEMENT_CASES, SCENARIOS, pd_pool
from vgpu.whatif.sim import PrefixCache, kv_capacity_tokens, simulate
from vgpu.whatif.verdict import diagnose
from vgpu.whatif.workload import Request, WorkloadSpec, generate, offered
from vgpu_cli.main import main

PARAMS = PerfParams()


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_verdict_names_the_planted_cause_and_the_what_if_meets_the_slo(name: str) -> None:
    s = SCENARIOS[name]
    rep, verdict = diagnose(s.pool, generate(s.workload, s.seed), s.policy, s.slos, PARAMS)
    assert verdict.layer == s.planted
    if s.planted == "none":
        assert rep.slo_met and verdict.fix is None
    else:
        assert not rep.slo_met
        assert verdict.fix is not None and verdict.fix.report.slo_met
        assert verdict.fix.report.slo_attainment > rep.slo_attainment + 0.1


def test_round_robin_chat_loses_hit_rate_that_llmd_routing_recovers_without_new_gpus() -> None:
    s = SCENARIOS["round-robin-chat"]
    rep, verdict = diagnose(s.pool, generate(s.workload, s.seed), s.policy, s.slos, PARAMS)
    assert verdict.fix is not None
    after = verdict.fix.report
    assert rep.oracle_hit_rate - rep.hit_rate > 0.2
    assert after.hit_rate > rep.hit_rate + 0.2
    assert after.prefill_instances == rep.prefill_instances and after.decode_instances == rep.decode_instances
    assert rep.prefill_load < 0.9  # not a shortage: capacity suffices at the oracle hit rate


def test_one_request_times_match_the_performance_formulas() -> None:
    pool = pd_pool(1, 1, decode_rack="r1")  # prefill in r0, decode in another rack
    req = Request(0, 0.0, 1000, 3, (), "k")
    out = simulate(pool, [req], "llm-d", PARAMS).outcomes[0]
    p, d = pool.role("prefill")[0], pool.role("decode")[0]
    assert link(p, d) == "cross-rack"
    prefill = pm.prefill_seconds(pool.model, pool.gpu, p.sm_share, PARAMS.with_(prompt_tokens=1000))
    kv = pm.kv_bytes_per_seq(pool.model, 1000) / (LINK_GB_S["cross-rack"] * 1e9)
    bw = pool.gpu.hbm_gb_s * 1e9 * PARAMS.decode_mbu * pm.beta(d.sm_share, PARAMS.s_sat)
    step1 = (pool.model.weights_gb * 1e9 + pm.kv_bytes_per_seq(pool.model, 1000)) / bw
    step2 = (pool.model.weights_gb * 1e9 + pm.kv_bytes_per_seq(pool.model, 1001)) / bw
    step3 = (pool.model.weights_gb * 1e9 + pm.kv_bytes_per_seq(pool.model, 1002)) / bw
    assert out.prefill_s == pytest.approx(prefill)
    assert out.kv_s == pytest.approx(kv)
    assert out.ttft == pytest.approx(prefill + kv + step1)
    assert out.tpot == pytest.approx((step2 + step3) / 2)
    assert out.prefill_wait == 0 and out.decode_wait == 0


def test_a_second_turn_hits_the_prefill_cache_only_on_the_instance_that_served_the_first() -> None:
    pool = pd_pool(2, 1)
    first = Request(0, 0.0, 2000, 10, (("sys", 500),), "s1t1")
    second = Request(1, 5.0, 2500, 10, (("sys", 500), ("s1t1", 2000)), "s1t2")
    rr = simulate(pool, [first, second], "round-robin", PARAMS).outcomes
    aware = simulate(pool, [first, second], "llm-d", PARAMS).outcomes
    assert rr[0].prefill != rr[1].prefill and rr[1].hit_tokens == 0
    assert aware[1].prefill == aware[0].prefill and aware[1].hit_tokens == 2000
    assert aware[1].prefill_s == pytest.approx(rr[1].prefill_s * 500 / 2500)


def test_decode_admission_waits_for_kv_room() -> None:
    pool = pd_pool(2, 1, d_mem=24.0)  # two prefills: both prompts reach the decode together
    cap = kv_capacity_tokens(pool, pool.role("decode")[0], PARAMS)
    big = cap // 2 + 1  # two of these do not fit together
    reqs = [Request(0, 0.0, big - 50, 50, (), "a"), Request(1, 0.0, big - 50, 50, (), "b")]
    a, b = simulate(pool, reqs, "llm-d", PARAMS).outcomes
    first, second = sorted((a, b), key=lambda o: o.decode_wait)
    assert first.decode_wait == 0 and second.decode_wait > 0.1  # held until the first one's 50 steps end
    assert second.wait_peer_idle == 0  # no peer decode to blame
    # Round-robin onto two decodes while the other one sits empty: no wait at all.
    two = pd_pool(2, 2, d_mem=24.0)
    a2, b2 = simulate(two, reqs, "round-robin", PARAMS).outcomes
    assert a2.decode != b2.decode and b2.decode_wait == 0


def test_prefix_cache_is_lru_in_tokens_and_stores_a_shared_prefix_once() -> None:
    c = PrefixCache(1000)
    c.insert((("sys", 300),), "a", 600)  # sys 300 + a's own 300
    c.insert((("sys", 300),), "b", 600)  # + b's 300 = 900
    assert c.used == 900 and c.match((("sys", 300), ("a", 600))) == 600
    c.insert((("sys", 300),), "c", 500)  # + 200 = 1100: evicts the least recently used ("a")
    assert "a" not in c.entries and c.used == 800
    assert c.match((("sys", 300), ("a", 600))) == 300


def test_routing_policies() -> None:
    zeros = [0.0, 0.0, 0.0]
    assert [routing.pick("round-robin", t, zeros, zeros, zeros) for t in range(4)] == [0, 1, 2, 0]
    assert routing.pick("load-aware", 0, zeros, [5.0, 1.0, 3.0], zeros) == 1
    assert routing.pick("prefix-aware", 0, zeros, [0.0, 9.0, 9.0], zeros, [0.0, 0.0, 0.8]) == 2
    # llm-d: prefix 3 x 0.5 = 1.5 outweighs a full queue-score gap (2) only when combined with KV room
    assert routing.pick("llm-d", 0, [0.0, 4.0], zeros[:2], [0.0, 0.0], [0.0, 0.5]) == 0
    assert routing.pick("llm-d", 0, [0.0, 4.0], zeros[:2], [0.6, 0.0], [0.0, 0.5]) == 1
    with pytest.raises(ValueError, match="allowed: round-robin, load-aware, prefix-aware, llm-d"):
        routing.check("random")


def test_workload_is_seeded_chains_session_prefixes_and_hits_its_rate() -> None:
    spec = WorkloadSpec(rate=50.0, duration_s=200.0, turns=4.0, think_s=2.0)
    a, b = generate(spec, 7), generate(spec, 7)
    assert a == b and a != generate(spec, 8)
    rate, _, _ = offered(a)
    assert 40 < rate < 55
    keys = {r.key: r for r in a}
    later = [r for r in a if len(r.prefixes) == 2]
    assert later and all(keys[r.prefixes[1][0]].prompt == r.prefixes[1][1] < r.prompt for r in later)
    with pytest.raises(ValueError, match="rate"):
        generate(WorkloadSpec(rate=0.0), 1)


def test_pool_check_names_the_problem() -> None:
    pool = pd_pool(1, 1)
    with pytest.raises(ValueError, match="no decode instance"):
        Pool(pool.model, pool.gpu, tuple(pool.role("prefill"))).check()
    tiny = Instance("d", "decode", 0.5, 10.0, "g", "n", "r")
    with pytest.raises(ValueError, match="does not hold llama-8b"):
        Pool(pool.model, pool.gpu, (*pool.role("prefill"), tiny)).check()


def test_cli_json_verdict_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "few-decode", "--json", "--duration", "60"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"]["layer"] == "allocation" and "decode" in data["whatIf"]["change"]
    assert data["whatIf"]["report"]["slo_met"] is True
    assert main(["validate", "healthy", "--duration", "60"]) == 0
    out = capsys.readouterr().out
    assert "VERDICT  none" in out and "cache" in out and "communication" in out


def test_cli_trace_file_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [{"arrival": i * 0.1, "prompt": 800, "output": 50, "prefixes": [["sys", 400]]} for i in range(200)]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["validate", "healthy", "--trace", str(trace), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["report"]["requests"] == 200 and data["report"]["hit_rate"] > 0.4
    trace.write_text('{"arrival": 0, "prompt": 10}\n')
    assert main(["validate", "healthy", "--trace", str(trace)]) == 2
    assert "line 1: expected a JSON object with arrival" in capsys.readouterr().err
    assert main(["validate", "nope"]) == 2
    assert "bundled: healthy" in capsys.readouterr().err
    assert main(["validate", "healthy", "--rate", "-1"]) == 2
    assert "rate" in capsys.readouterr().err


def test_azure_trace_is_read_with_100ns_timestamps_and_bad_rows_are_named() -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:45.0000000,879,20\n"
    )
    reqs = traces.parse(text)
    assert [(r.arrival, r.prompt, r.output) for r in reqs] == [
        (0.0, 879, 20),
        (pytest.approx(1.68059), 374, 44),
        (pytest.approx(5.995169), 396, 109),
    ]
    assert all(r.prefixes == () for r in reqs)
    with pytest.raises(ValueError, match=r"line 3: expected 'YYYY-MM-DD HH:MM:SS\.fff,ContextTokens"):
        traces.parse("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,1,1\nyesterday,5,5\n")
    with pytest.raises(ValueError, match="line 2: ContextTokens and GeneratedTokens must be >= 1"):
        traces.parse("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,0,1\n")


def test_a_written_trace_replays_to_the_same_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "chat.jsonl"
    assert main(["validate", "round-robin-chat", "--duration", "30", "--write-trace", str(path)]) == 0
    s = SCENARIOS["round-robin-chat"]
    back, orig = traces.parse(path.read_text()), generate(replace(s.workload, duration_s=30.0), s.seed)
    assert [replace(r, arrival=0.0) for r in back] == [replace(r, arrival=0.0) for r in orig]
    assert [r.arrival for r in back] == pytest.approx([r.arrival for r in orig], abs=1e-6)


def test_cli_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "v.png"
    main(["validate", "few-decode", "--duration", "30", "--plot", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_placement_in_the_loop_hami_defaults_slow_slices_that_our_default_keeps_partitioned() -> None:
    from vgpu_cli.validate import compare_placements

    case = PLACEMENT_CASES["shared-node"]
    rows = {r["config"]: r for r in compare_placements(case, PARAMS)}
    assert set(rows) >= {"hami", "binpack", "spread", "default"}
    for r in rows.values():
        assert not r["unplaced"] and len(r["slices"]) == 5
    hami, ours = rows["hami"], rows["default"]
    assert any(x["slowdown"] >= 1.5 for x in hami["slices"])  # best-effort decode next to a prefill
    assert all(x["slowdown"] < 1.5 for x in ours["slices"])
    assert not hami["report"]["slo_met"] and hami["layer"] == "allocation" and "placement" in hami["verdict"]
    assert ours["report"]["slo_met"]
    assert hami["report"]["tpot_p99_s"] > 1.5 * ours["report"]["tpot_p99_s"]


def test_placed_pool_carries_the_planner_slices() -> None:
    from vgpu.perf.bench import configs
    from vgpu.perf.params import H200
    from vgpu.perf.workload import cluster

    case = PLACEMENT_CASES["shared-node"]
    default = next(c for c in configs() if c.name == "default")
    pl = place_pool(case.target, cluster(1), default, H200, PARAMS, case.neighbours)
    pool = pl.pool
    assert len(pool.role("prefill")) == 3 and len(pool.role("decode")) == 2
    assert all(i.node == "node-00" and i.rack == "rack-0" and i.tp == 1 for i in pool.instances)
    assert {round(i.sm_share, 2) for i in pool.role("prefill")} == {0.4}  # nvidia.com/gpucores 40
    assert all(i.memory_gb == pytest.approx(40960 * 1024**2 / 1e9) for i in pool.role("decode"))
