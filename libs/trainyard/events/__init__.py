"""The event vocabulary: commands (imperative) and events (past tense).

Everything on the wire is JSON, one msgspec tagged union per stream, tagged by
the ``type`` field.  Unknown fields are ignored so that old consumers survive
new producers; new fields always get defaults.
"""

from trainyard.events.codec import decode_intake, decode_job_event, decode_node_event, encode
from trainyard.events.jobs import (
    CancelJob,
    CheckpointSaved,
    IntakeCommand,
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobEvent,
    JobPlaced,
    JobRejected,
    PreemptionNotice,
    ReplicaPlacement,
    RunFailed,
    RunStarted,
    RunSucceeded,
    SubmitJob,
    job_subject,
    subject_disagrees,
    writer_of,
)
from trainyard.events.nodes import NodeEvent, NodeHeartbeat, NodeLost, NodeRegistered

__all__ = [
    "CancelJob",
    "CheckpointSaved",
    "PreemptionNotice",
    "IntakeCommand",
    "JobAccepted",
    "JobAdmitted",
    "JobCancelled",
    "JobEvent",
    "JobPlaced",
    "JobRejected",
    "NodeEvent",
    "NodeHeartbeat",
    "NodeLost",
    "NodeRegistered",
    "ReplicaPlacement",
    "RunFailed",
    "RunStarted",
    "RunSucceeded",
    "SubmitJob",
    "job_subject",
    "subject_disagrees",
    "writer_of",
    "decode_intake",
    "decode_job_event",
    "decode_node_event",
    "encode",
]
