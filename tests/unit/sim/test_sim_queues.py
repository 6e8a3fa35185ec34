"""The simulator keeps each queue's pending jobs in exactly the order the admission core sorts them
(priority, then least-attained-service rank with aging, then submission order), so admission takes them as
given (``AdmissionSnapshot.pending_in_order``); the invariant check says when a queue is not."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.core.admission import AdmissionSnapshot, PendingJob
from trainyard.core.admission.ordering import group_in_order, group_pending, service_order
from trainyard.core.admission.tree import Scheduling
from trainyard.sim.checks import check_order
from trainyard.sim.queues import PendingQueues

HOUR = 3600.0
LAS = Scheduling(order="las", service_levels_gpu_h=(1.0, 64.0), starvation_s=10 * HOUR)

jobs = st.lists(
    st.tuples(
        st.sampled_from([0, 100]),  # priority
        st.sampled_from([0.0, 0.5 * HOUR, 10 * HOUR, 100 * HOUR]),  # attained GPU-seconds
        st.sampled_from([0.0, 5 * HOUR, 10 * HOUR, 15 * HOUR, 19 * HOUR]),  # submitted
    ),
    max_size=24,
)


def shown(queues: PendingQueues, spec: list[tuple[int, float, float]]) -> list[PendingJob]:
    """Every pending job as the simulator hands it to admission, queue by queue, in the order it keeps."""
    out = []
    for name, keys in queues.lists.items():
        for neg_priority, _, order, i in keys:
            _, attained, submitted = spec[i]
            out.append(
                PendingJob(
                    f"j{i}", "t", name, order, {"H100": 1}, -neg_priority, None, False, None, attained, submitted
                )
            )
    return out


@settings(max_examples=200, deadline=None)
@given(jobs, st.sampled_from([LAS, Scheduling(order="fifo")]), st.sampled_from([20 * HOUR, 25 * HOUR, 29 * HOUR]))
def test_each_queue_is_kept_in_the_order_the_core_sorts_it(spec, scheduling, later):
    queues = PendingQueues(["q1", "q2"], scheduling)
    now = 20 * HOUR  # every job is submitted by then; some have waited exactly the starvation limit
    for i, (priority, attained, submitted) in enumerate(spec):
        queues.add(f"q{1 + i % 2}", i, priority, i, attained, submitted, now)
    for at in (now, later):  # later: more jobs have waited past the limit
        queues.promote(at)
        pending = shown(queues, spec)
        core = group_pending(pending, service_order(scheduling, at))
        assert {k: [j.job_id for j in v] for k, v in group_in_order(pending).items()} == {
            k: [j.job_id for j in v] for k, v in core.items()
        }


def test_the_check_names_a_queue_handed_over_out_of_order():
    fresh = PendingJob("fresh", "t", "q", 2, {"H100": 1}, submitted_at=20 * HOUR)
    served = PendingJob("served", "t", "q", 1, {"H100": 1}, attained_gpu_s=100 * HOUR, submitted_at=19 * HOUR)
    in_order = AdmissionSnapshot([fresh, served], {"H100": 8}, {}, pending_in_order=True)
    assert check_order(in_order, LAS, 20 * HOUR) == []
    wrong = AdmissionSnapshot([served, fresh], {"H100": 8}, {}, pending_in_order=True)
    assert check_order(wrong, LAS, 20 * HOUR) == ["t=72000: queue t/q's pending jobs are not in admission order"]
    # a snapshot the core sorts itself is not checked
    assert check_order(AdmissionSnapshot([served, fresh], {"H100": 8}, {}), LAS, 20 * HOUR) == []
