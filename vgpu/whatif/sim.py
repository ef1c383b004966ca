"""The discrete-event simulation: every request routed, queued, prefilled, its KV moved, decoded. Pure.

Per prefill instance: one prompt at a time, FIFO; service = uncached prompt tokens x the time per token
on the slice's SM share (`vgpu.perf.model.prefill_seconds`, linear in tokens and in SMs); an LRU prefix
cache in tokens, as large as the slice's KV memory (memory minus weights minus the activation reserve).
Then the whole prompt's KV goes to the decode instance over the link between them
(`vgpu.perf.model.kv_bytes_per_seq` over `LINK_GB_S`, or only the visible part when layer-wise).
Per decode instance: continuous batching; a request is admitted when its prompt + output KV fits the
slice's KV memory (else it waits, FIFO) and joins at the next step; a step reads the weights and the
batch's whole context at the slice's bandwidth (`decode_step_seconds`: HBM x decode MBU x beta(SM share)
/ co-residence slowdown). The first token is out at the end of the first step (TTFT); TPOT is the mean
step time after it. An oracle cache (one LRU as large as all prefill caches together, fed in arrival
order) gives the hit rate perfect cache-aware routing would reach.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from vgpu.perf import model as pm
from vgpu.perf.params import LINK_GB_S, PerfParams
from vgpu.whatif import routing
from vgpu.whatif.deployment import LINK_RANK, Instance, Pool, link
from vgpu.whatif.workload import Request


class PrefixCache:
    """LRU of cached prompt prefixes, sized in tokens; a prefix's entry holds only the tokens beyond
    the shorter prefix it extends (the system prompt is stored once, not once per session)."""

    __slots__ = ("capacity", "entries", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.entries: OrderedDict[str, int] = OrderedDict()

    def match(self, prefixes: tuple[tuple[str, int], ...]) -> int:
        """Tokens of the longest cached prefix."""
        best = 0
        for key, tokens in prefixes:
            if key in self.entries:
                best = tokens
        return best

    def insert(self, prefixes: tuple[tuple[str, int], ...], key: str, prompt: int) -> None:
        below = 0
        entries = self.entries
        for k, tokens in (*prefixes, (key, prompt)):
            if k in entries:
                entries.move_to_end(k)
            else:
                size = max(0, tokens - below)
                entries[k] = size
                self.used += size
            below = tokens
        while self.used > self.capacity and entries:
            _, size = entries.popitem(last=False)
            self.used -= size


def kv_capacity_tokens(pool: Pool, inst: Instance, params: PerfParams) -> int:
    """Tokens of KV the slice holds: its memory x TP less the activation reserve and the weights."""
    free = inst.memory_gb * inst.tp * (1.0 - params.activation_reserve) - pool.model.weights_gb
    return max(0, int(free * 1e9 / pm.kv_bytes_per_seq(pool.model, 1)))


def prefill_s_per_token(pool: Pool, inst: Instance, params: PerfParams) -> float:
    one = params.with_(prompt_tokens=1)
    return pm.prefill_seconds(pool.model, pool.gpu, inst.sm_share, one, tp=inst.tp) * inst.slowdown


def decode_bytes_per_s(pool: Pool, inst: Instance, params: PerfParams) -> float:
    per_gpu = pool.gpu.hbm_gb_s * 1e9 * params.decode_mbu * pm.beta(inst.sm_share, params.s_sat)
    return per_gpu * inst.tp / inst.slowdown


def kv_seconds(pool: Pool, a: Instance, b: Instance, tokens: int, params: PerfParams) -> float:
    lk = link(a, b)
    gb_s = pool.gpu.hbm_gb_s if lk == "same-gpu" else LINK_GB_S[lk]
    full = pm.kv_bytes_per_seq(pool.model, tokens) / (gb_s * 1e9)
    return min(full, params.layerwise_visible_s) if params.layerwise_kv else full


@dataclass(slots=True)
class Outcome:
    """What happened to one request (seconds)."""

    id: int
    prompt: int
    output: int
    ttft: float
    tpot: float
    prefill_wait: float
    decode_wait: float
    wait_peer_idle: float  # part of the waits spent while a peer of the same role was idle
    prefill_s: float
    kv_s: float
    hit_tokens: int
    prefill: str
    decode: str


@dataclass(slots=True)
class SimResult:
    outcomes: list[Outcome]
    oracle_hit_tokens: int
    busy_s: dict[str, float]  # instance -> seconds busy (prefilling, or stepping)
    kv_peak: dict[str, float]  # decode instance -> highest share of its KV memory reserved
    kv_mean: dict[str, float]  # decode instance -> time-averaged share reserved, first arrival to last completion
    span_s: float  # first arrival to last completion
    events: int


class _Req:
    __slots__ = (
        "admit",
        "d",
        "done",
        "enq",
        "est",
        "first",
        "hit",
        "kv_end",
        "kv_s",
        "need",
        "p",
        "peer_idle",
        "req",
        "start",
        "wait_peer",
    )  # fmt: skip

    def __init__(self, req: Request) -> None:
        self.req = req
        self.est = self.hit = self.need = self.p = self.d = 0
        self.enq = self.start = self.done = self.kv_s = self.kv_end = self.admit = self.first = self.wait_peer = 0.0
        self.peer_idle = False


@dataclass(slots=True)
class _Prefill:
    inst: Instance
    s_per_token: float
    cache: PrefixCache
    queue: deque[_Req] = field(default_factory=deque)
    current: _Req | None = None
    pending: int = 0  # estimated uncached tokens queued or in service
    busy_s: float = 0.0


@dataclass(slots=True)
class _Decode:
    inst: Instance
    capacity: int  # KV tokens
    bytes_per_s: float
    weights: float  # bytes
    kv_per_token: float
    reserved: int = 0
    ctx: int = 0
    batch: int = 0
    step: int = 0
    stepping: bool = False
    step_s: float = 0.0
    joining: list[_Req] = field(default_factory=list)
    new: list[_Req] = field(default_factory=list)
    finishing: list[tuple[int, int, _Req]] = field(default_factory=list)
    waiting: deque[_Req] = field(default_factory=deque)
    busy_s: float = 0.0
    peak: int = 0  # most KV tokens reserved at once
    area: float = 0.0  # reserved KV tokens x seconds


_PREFILL_DONE, _KV_DONE, _STEP_DONE = 1, 2, 3


def simulate(pool: Pool, requests: list[Request], policy: routing.Policy, params: PerfParams) -> SimResult:
    """Run every request of `requests` (sorted by arrival) through `pool` routed by `policy`."""
    pool.check()
    prefills = [
        _Prefill(i, prefill_s_per_token(pool, i, params), PrefixCache(kv_capacity_tokens(pool, i, params)))
        for i in pool.role("prefill")
    ]
    kv_tok = pm.kv_bytes_per_seq(pool.model, 1)
    decodes = [
        _Decode(i, kv_capacity_tokens(pool, i, params), decode_bytes_per_s(pool, i, params),
                pool.model.weights_gb * 1e9, kv_tok)
        for i in pool.role("decode")
    ]  # fmt: skip
    kv_link = [[kv_seconds(pool, p.inst, d.inst, 1, params) for d in decodes] for p in prefills]
    rank = [[LINK_RANK[link(p.inst, d.inst)] for d in decodes] for p in prefills]
    nearest = params.routing == "nearest"
    oracle = PrefixCache(sum(p.cache.capacity for p in prefills))
    oracle_hits = 0
    outcomes: list[Outcome] = []
    heap: list[tuple[float, int, int, object]] = []
    seq = 0
    turn_p = turn_d = 0
    events = 0
    want_hits = policy in ("prefix-aware", "llm-d")

    def push(t: float, kind: int, obj: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, obj))

    def start_prefill(p: _Prefill, r: _Req, now: float) -> None:
        req = r.req
        r.hit = p.cache.match(req.prefixes)
        r.start = now
        if r.peer_idle:
            r.wait_peer += now - r.enq
        p.current = r
        push(now + max(req.prompt - r.hit, 1) * p.s_per_token, _PREFILL_DONE, p)

    def admit(d: _Decode, r: _Req, now: float) -> None:
        d.reserved += r.need
        r.admit = now
        if r.peer_idle:
            r.wait_peer += now - r.kv_end
        d.joining.append(r)
        if not d.stepping:
            start_step(d, now)

    def start_step(d: _Decode, now: float) -> None:
        d.peak = max(d.peak, d.reserved)
        for r in d.joining:
            d.ctx += r.req.prompt
            d.batch += 1
            heapq.heappush(d.finishing, (d.step + r.req.output, r.req.id, r))
        d.new, d.joining = d.joining, []
        d.step_s = (d.weights + d.ctx * d.kv_per_token) / d.bytes_per_s
        d.stepping = True
        d.area += d.reserved * d.step_s
        push(now + d.step_s, _STEP_DONE, d)

    def fits(d: _Decode, r: _Req) -> bool:
        return d.reserved + r.need <= d.capacity or d.reserved == 0

    def route_decode(p_idx: int, r: _Req) -> int:
        nonlocal turn_d
        turn_d += 1
        if len(decodes) == 1:
            return 0
        cands = list(range(len(decodes)))
        if nearest and policy != "round-robin":
            # PerfParams.routing "nearest": a KV-aware router keeps the nearest decodes with KV room
            room = [j for j in cands if decodes[j].reserved + r.need <= decodes[j].capacity]
            if room:
                best = min(rank[p_idx][j] for j in room)
                cands = [j for j in room if rank[p_idx][j] == best]
        waiting = [float(len(decodes[j].waiting)) for j in cands]
        util = [min(1.0, decodes[j].reserved / decodes[j].capacity) if decodes[j].capacity else 1.0 for j in cands]
        return cands[routing.pick(policy, turn_d, waiting, util, util)]

    arrivals = [_Req(q) for q in requests]
    ai = 0
    n_arr = len(arrivals)
    now = 0.0
    while ai < n_arr or heap:
        events += 1
        if ai < n_arr and (not heap or arrivals[ai].req.arrival <= heap[0][0]):
            r = arrivals[ai]
            ai += 1
            req = r.req
            now = req.arrival
            oracle_hits += oracle.match(req.prefixes)
            oracle.insert(req.prefixes, req.key, req.prompt)
            turn_p += 1
            if len(prefills) == 1:
                i = 0
            else:
                waiting = [float(len(p.queue) + (p.current is not None)) for p in prefills]
                load = [float(p.pending) for p in prefills]
                util = [min(1.0, p.pending / p.cache.capacity) if p.cache.capacity else 1.0 for p in prefills]
                hits = [p.cache.match(req.prefixes) / req.prompt for p in prefills] if want_hits else None
                i = routing.pick(policy, turn_p, waiting, load, util, hits)
            p = prefills[i]
            r.p = i
            r.est = req.prompt - p.cache.match(req.prefixes)
            r.enq = now
            p.pending += r.est
            if p.current is None:
                start_prefill(p, r, now)
            else:
                r.peer_idle = any(q.current is None for q in prefills)
                p.queue.append(r)
            continue
        now, _, kind, obj = heapq.heappop(heap)
        if kind == _PREFILL_DONE:
            assert isinstance(obj, _Prefill)
            p = obj
            r = p.current  # type: ignore[assignment]
            assert r is not None
            req = r.req
            p.cache.insert(req.prefixes, req.key, req.prompt)
            p.pending -= r.est
            r.done = now
            p.busy_s += now - r.start
            r.need = req.prompt + req.output
            j = route_decode(r.p, r)
            r.d = j
            r.kv_s = kv_link[r.p][j] * req.prompt if not params.layerwise_kv else kv_link[r.p][j]
            r.peer_idle = False
            push(now + r.kv_s, _KV_DONE, r)
            p.current = None
            if p.queue:
                start_prefill(p, p.queue.popleft(), now)
        elif kind == _KV_DONE:
            assert isinstance(obj, _Req)
            r = obj
            r.kv_end = now
            d = decodes[r.d]
            if not d.waiting and fits(d, r):
                admit(d, r, now)
            else:
                r.peer_idle = any(not e.waiting and e.reserved + r.need <= e.capacity for e in decodes if e is not d)
                d.waiting.append(r)
        else:
            assert isinstance(obj, _Decode)
            d = obj
            d.busy_s += d.step_s
            d.step += 1
            d.ctx += d.batch
            for r in d.new:
                r.first = now
            d.new = []
            while d.finishing and d.finishing[0][0] <= d.step:
                _, _, r = heapq.heappop(d.finishing)
                req = r.req
                d.batch -= 1
                d.ctx -= req.prompt + req.output
                d.reserved -= r.need
                outcomes.append(
                    Outcome(
                        id=req.id, prompt=req.prompt, output=req.output,
                        ttft=r.first - req.arrival,
                        tpot=(now - r.first) / (req.output - 1) if req.output > 1 else 0.0,
                        prefill_wait=r.start - r.enq, decode_wait=r.admit - r.kv_end,
                        wait_peer_idle=r.wait_peer, prefill_s=r.done - r.start, kv_s=r.kv_s,
                        hit_tokens=r.hit, prefill=prefills[r.p].inst.name, decode=d.inst.name,
                    )
                )  # fmt: skip
            while d.waiting and fits(d, d.waiting[0]):
                r = d.waiting.popleft()
                d.reserved += r.need
                r.admit = now
                if r.peer_idle:
                    r.wait_peer += now - r.kv_end
                d.joining.append(r)
            if d.batch or d.joining:
                start_step(d, now)
            else:
                d.stepping = False
    busy = {p.inst.name: p.busy_s for p in prefills} | {d.inst.name: d.busy_s for d in decodes}
    span = now - requests[0].arrival if requests else 0.0
    outcomes.sort(key=lambda o: o.id)
    peak = {d.inst.name: d.peak / d.capacity if d.capacity else 1.0 for d in decodes}
    mean = {d.inst.name: d.area / span / d.capacity if d.capacity and span > 0 else 0.0 for d in decodes}
    return SimResult(outcomes, oracle_hits, busy, peak, mean, span, events)
