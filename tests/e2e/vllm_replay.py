"""Replays a simulated scenario as the metric series a P/D deployment would expose, in vLLM's exposition
format (histograms with _bucket/_sum/_count, vLLM's bucket bounds), plus the router's arrivals counter and
our slice metrics, in real time from `start`: each request's events land when the simulation says they
happen (vgpu.whatif.live.NAMES for the names and their sources).

Per request (the simulation's Outcome): router: end-to-end TTFT at the first token; prefill pod: queue time and prefix-cache queries/hits when its
prefill starts, waiting/running gauges; decode pod: KV transfer (NIXL) when it lands, queue time at
admission, TTFT counted from the hand-over after prefill (as vLLM on a P/D decode pod counts it), per-request TPOT and token-count histograms at completion,
waiting/running gauges and KV-cache use (reserved tokens over the slice's KV capacity).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass

from vgpu.perf.params import PerfParams
from vgpu.whatif import live
from vgpu.whatif.deployment import Pool
from vgpu.whatif.sim import SimResult, kv_capacity_tokens
from vgpu.whatif.workload import Request

PROMPT_BUCKETS = tuple(float(b * 10**e) for e in range(0, 6) for b in (1, 2, 5))  # build_1_2_5_buckets


@dataclass(frozen=True, slots=True)
class _Obs:
    times: list[float]
    values: list[float]


class Replay:
    def __init__(self, namespace: str, pool: Pool, requests: list[Request], result: SimResult, params: PerfParams):
        self.ns, self.pool = namespace, pool
        self.model = pool.model.name
        self.arrivals = sorted(r.arrival for r in requests)
        arrival = {r.id: r.arrival for r in requests}
        raw: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        self.intervals: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
        for o in result.outcomes:
            a = arrival[o.id]
            start = a + o.prefill_wait
            pdone = start + o.prefill_s
            kv_end = pdone + o.kv_s
            admit = kv_end + o.decode_wait
            first = a + o.ttft
            done = first + o.tpot * max(0, o.output - 1)
            raw[(o.prefill, "queue")].append((start, o.prefill_wait))
            raw[(o.prefill, "prefix_queries")].append((start, float(o.prompt)))
            raw[(o.prefill, "prefix_hits")].append((start, float(o.hit_tokens)))
            raw[(o.decode, "kv_xfer")].append((kv_end, o.kv_s))
            raw[(o.decode, "queue")].append((admit, o.decode_wait))
            raw[(o.decode, "ttft")].append((first, first - pdone))  # decode vLLM's view: from the hand-over
            raw[("router", "ttft")].append((first, o.ttft))
            raw[(o.decode, "tpot")].append((done, o.tpot))
            raw[(o.decode, "prompt")].append((done, float(o.prompt)))
            raw[(o.decode, "output")].append((done, float(o.output)))
            self.intervals[(o.prefill, "waiting")].append((a, start, 1.0))
            self.intervals[(o.prefill, "running")].append((start, pdone, 1.0))
            self.intervals[(o.decode, "waiting")].append((kv_end, admit, 1.0))
            self.intervals[(o.decode, "running")].append((admit, done, 1.0))
            self.intervals[(o.decode, "kv_tokens")].append((admit, done, float(o.prompt + o.output)))
        self.obs = {k: _Obs([t for t, _ in sorted(v)], [x for _, x in sorted(v)]) for k, v in raw.items()}
        self.kv_cap = {i.name: kv_capacity_tokens(pool, i, params) for i in pool.role("decode")}
        self.last = max((t for o in self.obs.values() for t in o.times), default=0.0)

    def _labels(self, pod: str, role: str) -> str:
        return f'model_name="{self.model}",namespace="{self.ns}",pod="{pod}",role="{role}"'

    def _gauge(self, pod: str, what: str, t: float) -> float:
        return sum(w for a, b, w in self.intervals.get((pod, what), ()) if a <= t < b)

    def text(self, t: float) -> str:
        """The exposition at `t` seconds into the scenario."""
        out: list[str] = []
        n = bisect.bisect_right(self.arrivals, t)
        out += [f"# TYPE {live.ROUTER_REQUESTS} counter",
                f'{live.ROUTER_REQUESTS}{{model_name="{self.model}",namespace="{self.ns}"}} {n}']  # fmt: skip
        names = live.NAMES["vllm"]
        out.append(f"# TYPE {live.ROUTER_TTFT} histogram")
        ob = self.obs.get(("router", "ttft"), _Obs([], []))
        k = bisect.bisect_right(ob.times, t)
        lab = f'model_name="{self.model}",namespace="{self.ns}"'
        for b in (*live.TTFT_BUCKETS, math.inf):
            le = "+Inf" if math.isinf(b) else repr(float(b))
            out.append(f'{live.ROUTER_TTFT}_bucket{{{lab},le="{le}"}} {sum(1 for v in ob.values[:k] if v <= b)}')
        out += [f"{live.ROUTER_TTFT}_sum{{{lab}}} {sum(ob.values[:k])!r}", f"{live.ROUTER_TTFT}_count{{{lab}}} {k}"]
        hists = {"ttft": live.TTFT_BUCKETS, "tpot": live.TPOT_BUCKETS, "queue": live.LATENCY_BUCKETS,
                 "kv_xfer": live.XFER_BUCKETS, "prompt": PROMPT_BUCKETS, "output": PROMPT_BUCKETS}  # fmt: skip
        for key, bounds in hists.items():
            name = names[key][0]
            out.append(f"# TYPE {name} histogram")
            for i in self.pool.instances:
                ob = self.obs.get((i.name, key))
                if ob is None:
                    continue
                k = bisect.bisect_right(ob.times, t)
                vals = ob.values[:k]
                lab = self._labels(i.name, i.role)
                for b in (*bounds, math.inf):
                    le = "+Inf" if math.isinf(b) else repr(float(b))
                    out.append(f'{name}_bucket{{{lab},le="{le}"}} {sum(1 for v in vals if v <= b)}')
                out += [f"{name}_sum{{{lab}}} {sum(vals)!r}", f"{name}_count{{{lab}}} {k}"]
        for key in ("prefix_queries", "prefix_hits"):
            name = names[key][0]
            out.append(f"# TYPE {name.removesuffix('_total')} counter")
            for i in self.pool.role("prefill"):
                ob = self.obs.get((i.name, key), _Obs([], []))
                k = bisect.bisect_right(ob.times, t)
                out.append(f"{name}{{{self._labels(i.name, i.role)}}} {sum(ob.values[:k])!r}")
        for key in ("running", "waiting", "kv_usage"):
            name = names[key][0]
            out.append(f"# TYPE {name} gauge")
            for i in self.pool.instances:
                if key == "kv_usage":
                    if i.role != "decode":
                        continue
                    v = self._gauge(i.name, "kv_tokens", t) / max(1, self.kv_cap[i.name])
                else:
                    v = self._gauge(i.name, key, t)
                out.append(f"{name}{{{self._labels(i.name, i.role)}}} {v!r}")
        out += [f"# TYPE {live.SLICE_SM} gauge", f"# TYPE {live.SLICE_MEMORY} gauge"]
        for k, i in enumerate(self.pool.instances):
            lab = (f'Hostname="{i.node}",gpu="{k}",UUID="GPU-{i.gpu}",modelName="NVIDIA H200",'
                   f'namespace="{self.ns}",pod="{i.name}",container="vllm",role="{i.role}"')  # fmt: skip
            out.append(f"{live.SLICE_SM}{{{lab}}} {i.sm_share!r}")
            out.append(f"{live.SLICE_MEMORY}{{{lab}}} {i.memory_gb * 1e9!r}")
        return "\n".join(out) + "\n"
