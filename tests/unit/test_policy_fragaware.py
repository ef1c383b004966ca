from __future__ import annotations

from tests.unit.policy_helpers import choice, cluster, node, place, pod
from vgpu.placement import fgd, fragaware
from vgpu.replay.trace import to_pod_info


def _feed(p: fragaware.FragAware, milli: int, n: int) -> None:
    for i in range(n):
        p.observe(to_pod_info(pod(milli, cpu=1000), f"x{i}"))


def test_learns_the_arriving_workload_online() -> None:
    p = fragaware.create()
    assert p.model.workload == []
    _feed(p, 600, 10)
    (shape, share), *_ = p.model.workload
    assert shape.slice_request == (None, 60, 60) and share == 1.0
    _feed(p, 300, 6)  # 16 pods: 10 of 600, 6 of 300
    assert {s.slice_request[1]: round(w, 3) for s, w in p.model.workload} == {60: 0.625, 30: 0.375}


def test_epoch_moves_only_on_schedule_and_real_change() -> None:
    p = fragaware.create()
    _feed(p, 600, 2048)
    steady = p.epoch
    _feed(p, 600, 2048)  # same distribution: checkpoints at 3072 and 4096 change nothing
    assert p.epoch == steady
    _feed(p, 300, 2048)  # a third of the pods now 300: the next checkpoint rebuilds
    assert p.epoch > steady


def test_learned_workload_steers_placement_like_fgd() -> None:
    planner = cluster("default", node("a", gpus=1), node("b", gpus=1))
    _feed(planner.policy("default"), 600, 50)  # type: ignore[arg-type]
    place(planner, "a", pod(300))
    assert choice(planner, pod(200))[0] == "b"


def test_default_is_fragaware_and_learns_from_arrivals_only() -> None:
    p = fragaware.create()
    assert p.trace_prior is False and p.name == "fragaware" and p.whole_gpu_weight == 0.5


def test_cold_start_without_observe_uses_the_pods_own_shape() -> None:
    planner = cluster("default", node("a", gpus=1), node("b", gpus=1))
    place(planner, "a", pod(300))  # a: 700 free; a 400 there would leave 300, useless to another 400
    row = pod(400)
    ev = planner.evaluate(to_pod_info(row, row.name))  # no observe() at all
    assert ev.feasible["b"].score > ev.feasible["a"].score


def test_default_scores_on_wider_steps_than_fgd() -> None:
    planner = cluster("default", node("a", gpus=2), node("b", gpus=2))
    policy = planner.policy("default")
    assert isinstance(policy, fragaware.FragAware) and policy.scale > fgd.Fgd.scale
    _feed(policy, 600, 50)
    place(planner, "a", pod(300))
    info = to_pod_info(pod(200), "probe")
    ev = planner.evaluate(info)
    for name, res in ev.feasible.items():
        assert res.placement is not None
        delta = policy.delta(planner.state.nodes[name], res.placement, info)
        assert res.score == fgd.quantized(delta, policy.scale) / 100


def test_whole_gpu_weight_scales_whole_gpu_shapes_in_the_workload() -> None:
    plain, half = fragaware.FragAwareWholeFull(), fragaware.FragAware()
    for p in (plain, half):
        _feed(p, 1000, 8)  # whole GPUs
        _feed(p, 500, 8)
    weights = [{s.whole_gpus: round(w, 3) for s, w in p.model.workload} for p in (plain, half)]
    assert weights[0] == {True: 0.5, False: 0.5}
    assert weights[1] == {True: 0.333, False: 0.667}  # 8 x 0.5 against 8 x 1


def test_a_shared_slice_is_not_a_whole_gpu_shape() -> None:
    from vgpu.placement.frag import shape_of

    assert shape_of(to_pod_info(pod(1000), "w"), with_memory=True).whole_gpus
    assert not shape_of(to_pod_info(pod(990), "s"), with_memory=True).whole_gpus
    assert not shape_of(to_pod_info(pod(0, num_gpu=0), "c"), with_memory=True).whole_gpus


def test_a_slice_in_mib_with_all_sms_is_a_whole_gpu_shape() -> None:
    from vgpu.placement.frag import TaskShape

    def shape(mem: int, cores: int | None) -> TaskShape:
        return TaskShape(8000, 0, 1, (mem, None, cores), None)

    assert shape(143_771, 100).whole_gpus  # pd-bench's 70B prefill: a full H200 and all its SMs
    assert not shape(81_920, 50).whole_gpus
    # Memory alone in MiB stays a shared slice: whether it fills the card depends on the card.
    assert not shape(81_920, None).whole_gpus


def test_step_width_follows_the_share_of_whole_gpu_pods() -> None:
    def learned_scale(whole: int, shared: int) -> float:
        p = fragaware.FragAware()
        _feed(p, 1000, whole)
        _feed(p, 400, shared)
        return p.scale

    assert fragaware.FragAware().scale == 2000  # before anything is learnt
    assert learned_scale(0, 16) == 1500  # sharing only: narrowest steps
    assert learned_scale(4, 12) == 1750  # a quarter whole cards: half way
    assert learned_scale(8, 8) == learned_scale(12, 4) == 2000  # half or more: the widest


def test_cpu_only_pods_do_not_move_the_step_width() -> None:
    p = fragaware.FragAware()
    _feed(p, 400, 8)
    for i in range(8):
        p.observe(to_pod_info(pod(0, num_gpu=0), f"c{i}"))
    assert p.scale == 1500


def test_the_step_width_changes_only_with_a_rebuilt_workload() -> None:
    p = fragaware.FragAware()
    _feed(p, 400, 2048)
    epoch, scale = p.epoch, p.scale
    _feed(p, 1000, 40)
    _feed(p, 400, 984)  # the 3072 checkpoint: too small a change to rebuild, so cached scores stay valid
    assert p.scale_for(p.counts) != scale
    assert (p.epoch, p.scale) == (epoch, scale)
    _feed(p, 1000, 1024)  # a third whole cards by 4096: rebuilt, wider steps
    assert p.epoch > epoch and p.scale > scale


def test_previous_defaults_keep_fixed_steps() -> None:
    for p in (fragaware.FragAwareWholeFull(), fragaware.FragAwareFixedSteps()):
        _feed(p, 400, 32)
        assert p.scale == 2000


def test_slice_goes_to_the_gpu_adding_least_fragmentation_even_inside_one_step() -> None:
    """GPU 1 has a 350 hole that a 600 can never use; a 150 there shrinks it, on GPU 0 (900 free) it
    changes nothing. The difference is under one integer step, so only the exact growth sees it."""
    rows = {}
    for name in ("default", "fragaware-gpusteps"):
        planner = cluster(name, node("a", gpus=2))
        policy = planner.policy(name)
        assert isinstance(policy, fragaware.FragAware)
        for i in range(60):
            policy.observe(to_pod_info(pod(600 if i % 3 else 300, cpu=1000), f"x{i}"))
        place(planner, "a", pod(100), gpu=0)
        place(planner, "a", pod(650), gpu=1)
        rows[name] = choice(planner, pod(150))
        info = to_pod_info(pod(150), "probe")
        rank = policy.node_gpu_rank(planner.state.nodes["a"], info)
        gpus = planner.state.nodes["a"].gpus
        ranks = [rank(u, u.device.memory_mib * 15 // 100, 15, info) for u in gpus]
        if name == "fragaware-gpusteps":
            assert ranks[0] == ranks[1]  # the steps tie: the lowest index wins
        else:
            assert ranks[1] < ranks[0] <= 0
    assert rows == {"default": ("a", [1]), "fragaware-gpusteps": ("a", [0])}
