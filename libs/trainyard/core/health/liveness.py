"""Liveness: which nodes have gone silent, judged only on what has been read.

A node is lost when it has been silent for longer than the timeout.  Silence
is measured on the heartbeats' own clock, never on the judge's:

1. Nobody is judged on a view that is behind: the caller must have read every
   heartbeat the stream held when the check began (``caught_up``).  A judge
   that stalled reads its backlog first, and the backlog holds the heartbeats
   the fleet sent meanwhile.
2. The reference time is the newest heartbeat read from the whole fleet
   (capped by the judge's clock).  A node is silent for ``reference - its last
   heartbeat``.  Time the judge spent stalled is not silence of the nodes.
3. When the whole fleet is silent (the newest heartbeat is older than the
   timeout by the judge's clock), the fault lies between the fleet and the
   judge (the bus, the network, the telemetry path): nobody is declared lost
   and one alert says so.
4. Only heartbeats of the node's registered boot count.  A heartbeat from an
   older boot (the previous agent process, still draining its queue) neither
   keeps the new boot alive nor makes it lost; a boot never heard from is
   watched from its registration or from when the judge first saw it.
5. Silence counts only from the evidence floor (:func:`evidence_floor`): the
   newest heartbeat of this judge's first read after its own start, and the
   first heartbeat read after every interruption: the whole fleet seen
   silent for longer than ``gap_s`` (the nodes' host stalled or restarting),
   or the judge's connection to the bus lost and made again (the bus
   restarting: heartbeats sent meanwhile were never stored).  During an
   interruption nobody's silence says anything about one node, and while the
   fleet comes back node by node, the first node's heartbeat must not turn
   the others' shared silence into losses.
6. Nobody is judged while the node projection catches up (``roster_caught_up``):
   a boot registered again must be seen before its heartbeats are counted.

A node that heartbeats again (same boot) after it was declared lost comes
back: see :func:`heartbeat_resumes`.

Pure: no I/O, no clock reads.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from trainyard.domain.node import NodeState

#: States in which a node is watched; a lost node waits for a heartbeat or a registration.
WATCHED_STATES = frozenset(
    s.value for s in (NodeState.HEALTHY, NodeState.SUSPECT, NodeState.CORDONED, NodeState.DRAINING, NodeState.REPAIR)
)


class HeartbeatView(msgspec.Struct, frozen=True, kw_only=True):
    """What the judge has read of the heartbeat stream."""

    caught_up: bool  # every heartbeat stored when the check began has been read and recorded
    newest_at: float | None  # the newest heartbeat read from any node (stream time); None: none yet
    now: float  # the judge's own clock, only to cap the reference and notice fleet-wide silence
    roster_caught_up: bool = True  # the node projection holds every NODES event stored when the check began


class NodeWatch(msgspec.Struct, frozen=True, kw_only=True):
    """One node as the judge sees it."""

    node_id: str
    state: str  # projected node state
    boot_id: str  # the boot the node last registered with
    last_heartbeat_at: float | None  # newest heartbeat of that boot (stream time); None: not heard from yet
    watched_since: float  # when watching this boot began (registration, or the judge's first sight)


class SilentNode(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    boot_id: str  # the boot that went silent
    last_heartbeat_at: float  # its last heartbeat, or when watching it began
    silent_for_s: float


class LivenessVerdict(msgspec.Struct, frozen=True, kw_only=True):
    judged: bool  # False: nobody was judged (see reason)
    reason: str = ""  # why nobody was judged, or ""
    reference: float | None = None  # the time silence was measured against
    lost: tuple[SilentNode, ...] = ()  # nodes silent for longer than the timeout, by node id
    fleet_silent_for_s: float | None = None  # set when the whole fleet is silent (an alert, not a loss)


def judge_liveness(nodes: Iterable[NodeWatch], view: HeartbeatView, timeout_s: float) -> LivenessVerdict:
    """Which watched nodes are lost, on a caught-up view of the fleet's heartbeats."""
    # 1. Only a view that has read everything judges anyone.
    if not view.caught_up:
        return LivenessVerdict(judged=False, reason="heartbeat backlog not read yet")
    if not view.roster_caught_up:
        return LivenessVerdict(judged=False, reason="node projection catching up")
    if view.newest_at is None:
        return LivenessVerdict(judged=False, reason="no heartbeat read from the fleet yet")
    # 2. The reference is the fleet's newest heartbeat, never later than the judge's clock.
    reference = min(view.newest_at, view.now)
    # 3. A silent fleet is a fault of the path to it, not of every node.
    fleet_silence = view.now - view.newest_at
    if fleet_silence > timeout_s:
        return LivenessVerdict(
            judged=False,
            reason=f"no heartbeat from any node for {fleet_silence:.1f} s",
            reference=reference,
            fleet_silent_for_s=fleet_silence,
        )
    # 4. Each watched node against the reference.
    lost = []
    for node in sorted(nodes, key=lambda n: n.node_id):
        if node.state not in WATCHED_STATES:
            continue
        last = max(node.last_heartbeat_at or node.watched_since, node.watched_since)
        silent = reference - last
        if silent > timeout_s:
            lost.append(
                SilentNode(node_id=node.node_id, boot_id=node.boot_id, last_heartbeat_at=last, silent_for_s=silent)
            )
    return LivenessVerdict(judged=True, reference=reference, lost=tuple(lost))


def evidence_floor(
    floor: float | None, previous_newest: float | None, heartbeats: Iterable[float], interrupted: bool
) -> float | None:
    """The stream time from which a node's silence counts, after a caught-up
    read of the fleet's ``heartbeats`` (each node's newest).

    ``floor`` and ``previous_newest`` are what the previous caught-up read left
    (None: this judge's first), ``interrupted`` whether an interruption (see
    :func:`fleet_interrupted`, or the bus reconnecting) has not yet been
    followed by a heartbeat.  The first read starts the floor at its newest
    heartbeat; after an interruption the floor moves to the first heartbeat
    newer than ``previous_newest``.  It never moves back.  Without an
    interruption it stays, so a judge that reads seldom (stalled, loaded)
    still counts every node's silence in full."""
    beats = list(heartbeats)
    if not beats:
        return floor
    if previous_newest is None:
        return max(beats) if floor is None else max(floor, max(beats))
    resumed = [t for t in beats if t > previous_newest]
    if not interrupted or not resumed:
        return floor
    return min(resumed) if floor is None else max(floor, min(resumed))


def fleet_interrupted(view: HeartbeatView, gap_s: float) -> bool:
    """Whether a caught-up read shows the whole fleet silent for longer than ``gap_s``."""
    return view.caught_up and view.newest_at is not None and view.now - view.newest_at > gap_s


def heartbeat_counts(registered_boot: str | None, heartbeat_boot: str) -> bool:
    """A heartbeat counts only for the boot the node is registered with."""
    return registered_boot is not None and heartbeat_boot == registered_boot


def heartbeat_resumes(node_state: str, registered_boot: str | None, heartbeat_boot: str, advanced: bool) -> bool:
    """A lost node comes back when its registered boot sends a heartbeat newer
    than any read before (``advanced``): the loss was a false alarm."""
    return node_state == NodeState.LOST.value and advanced and heartbeat_counts(registered_boot, heartbeat_boot)
