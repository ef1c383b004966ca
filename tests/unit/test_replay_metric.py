from __future__ import annotations

import pytest

from vgpu.replay.metric import summarize, unallocated_curve


def test_curve_averages_events_that_round_to_the_same_x() -> None:
    # capacity 1000: events at 10.4 % and 9.6 % round to x = 10; 50 % and 140 % (beyond x_max) alone.
    curve = unallocated_curve([104, 96, 500, 1400], [104, 0, 400, 900], 1000)
    assert curve == pytest.approx({10: 100 - (10.4 + 0) / 2, 50: 60.0})


def test_summary_median_mean_and_per_seed() -> None:
    s = summarize([{100: 4.0}, {100: 6.0}, {100: 5.0, 101: 1.0}])
    assert s["100"]["median"] == 5.0
    assert s["100"]["mean"] == pytest.approx(5.0)
    assert s["100"]["per_seed"] == [4.0, 6.0, 5.0]
    assert s["101"]["per_seed"] == [1.0]
