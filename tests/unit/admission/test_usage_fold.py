"""The fair-share fold over event times: the closed form, and the same figures
bit for bit however often the fold is saved and resumed."""

from __future__ import annotations

import json
import random

import pytest

from trainyard.core.admission.usage_fold import KEEP_PREEMPTIONS_S, UsageFold, held

H = 3600.0


def test_held_is_the_decayed_integral() -> None:
    steps = 100_000
    dt = 600.0 / steps
    numeric = sum(8 * 0.5 ** ((1000.0 - (100.0 + (i + 0.5) * dt)) / H) * dt for i in range(steps))
    assert held(8, 100.0, 700.0, 1000.0, H) == pytest.approx(numeric, rel=1e-9)
    assert held(8, 5.0, 5.0, 10.0, H) == 0.0


def test_a_steady_holder_converges_to_gpus_times_half_life_over_ln2() -> None:
    fold = UsageFold(H)
    fold.admitted("j", "j-r1", "t/q", {"H100": 4}, 0.0)
    assert fold.usage(100 * H)["t/q"]["H100"] == pytest.approx(4 * H / 0.6931471805599453, rel=1e-9)


def events(seed: int) -> list[tuple[str, tuple[object, ...]]]:
    rng = random.Random(seed)
    out: list[tuple[str, tuple[object, ...]]] = []
    t = 0.0
    for i in range(300):
        t += rng.uniform(0, 120)
        job = f"j{rng.randrange(20)}"
        kind = rng.choice(["admitted", "ended", "ended", "preempted"])
        if kind == "admitted":
            out.append((kind, (job, f"{job}-r{i}", f"t/q{rng.randrange(3)}", {"H100": rng.randrange(1, 9)}, t)))
        elif kind == "ended":
            out.append((kind, (job, None, t - rng.uniform(0, 300))))  # producers' clocks disagree
        else:
            out.append((kind, (t,)))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_resumed_folds_equal_one_pass_bit_for_bit(seed: int) -> None:
    one = UsageFold(H)
    resumed = UsageFold(H)
    for n, (kind, args) in enumerate(events(seed)):
        getattr(one, kind)(*args)
        getattr(resumed, kind)(*args)
        if n % 7 == 0:  # saved to Redis and read back
            resumed = UsageFold.from_dict(json.loads(json.dumps(resumed.to_dict())))
    assert json.dumps(one.to_dict(), sort_keys=True) == json.dumps(resumed.to_dict(), sort_keys=True)
    assert one.usage(50_000.0) == resumed.usage(50_000.0)
    assert one.recent_preemptions(50_000.0, 600.0) == resumed.recent_preemptions(50_000.0, 600.0)


def test_an_end_names_the_run_it_ends() -> None:
    fold = UsageFold(H)
    fold.admitted("j", "j-r2", "t/q", {"H100": 8}, 0.0)
    fold.ended("j", "j-r1", 50.0)  # a late end of an older run
    assert "j" in fold.open
    fold.ended("j", "j-r2", 100.0)
    assert fold.open == {} and fold.usage(100.0)["t/q"]["H100"] == held(8, 0.0, 100.0, 100.0, H)


def test_old_preemptions_are_dropped_and_the_window_reads_recent_ones() -> None:
    fold = UsageFold(H)
    for t in (0.0, 10.0, KEEP_PREEMPTIONS_S + 5.0):
        fold.preempted(t)
    assert fold.preemptions == [10.0, KEEP_PREEMPTIONS_S + 5.0]
    assert fold.recent_preemptions(KEEP_PREEMPTIONS_S + 10.0, 600.0) == [KEEP_PREEMPTIONS_S + 5.0]


def test_a_half_life_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="half-life must be greater than 0, got 0"):
        UsageFold(0.0)
