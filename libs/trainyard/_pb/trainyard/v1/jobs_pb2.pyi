from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TopologyLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOPOLOGY_LEVEL_UNSPECIFIED: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_NVLINK: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_RACK: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_BLOCK: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_ZONE: _ClassVar[TopologyLevel]
TOPOLOGY_LEVEL_UNSPECIFIED: TopologyLevel
TOPOLOGY_LEVEL_NVLINK: TopologyLevel
TOPOLOGY_LEVEL_RACK: TopologyLevel
TOPOLOGY_LEVEL_BLOCK: TopologyLevel
TOPOLOGY_LEVEL_ZONE: TopologyLevel

class TopologyConstraint(_message.Message):
    __slots__ = ("level", "required")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    level: TopologyLevel
    required: bool
    def __init__(self, level: _Optional[_Union[TopologyLevel, str]] = ..., required: _Optional[bool] = ...) -> None: ...

class Role(_message.Message):
    __slots__ = ("name", "replicas", "gpus_per_replica", "gpu_type", "cpu_per_replica", "memory_gib_per_replica", "topology", "command", "env", "working_dir", "launch")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_REPLICA_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    CPU_PER_REPLICA_FIELD_NUMBER: _ClassVar[int]
    MEMORY_GIB_PER_REPLICA_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    name: str
    replicas: int
    gpus_per_replica: int
    gpu_type: str
    cpu_per_replica: float
    memory_gib_per_replica: float
    topology: TopologyConstraint
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    working_dir: str
    launch: str
    def __init__(self, name: _Optional[str] = ..., replicas: _Optional[int] = ..., gpus_per_replica: _Optional[int] = ..., gpu_type: _Optional[str] = ..., cpu_per_replica: _Optional[float] = ..., memory_gib_per_replica: _Optional[float] = ..., topology: _Optional[_Union[TopologyConstraint, _Mapping]] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., working_dir: _Optional[str] = ..., launch: _Optional[str] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("tenant", "queue", "roles", "name", "priority_class", "labels", "topology", "max_runtime_s", "image", "command", "workload_ref", "simulated_duration_s", "stop_signal", "stop_grace_s", "checkpoint_dir")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TENANT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNTIME_S_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_REF_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    STOP_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STOP_GRACE_S_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    queue: str
    roles: _containers.RepeatedCompositeFieldContainer[Role]
    name: str
    priority_class: str
    labels: _containers.ScalarMap[str, str]
    topology: TopologyConstraint
    max_runtime_s: int
    image: str
    command: _containers.RepeatedScalarFieldContainer[str]
    workload_ref: str
    simulated_duration_s: float
    stop_signal: str
    stop_grace_s: float
    checkpoint_dir: str
    def __init__(self, tenant: _Optional[str] = ..., queue: _Optional[str] = ..., roles: _Optional[_Iterable[_Union[Role, _Mapping]]] = ..., name: _Optional[str] = ..., priority_class: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., topology: _Optional[_Union[TopologyConstraint, _Mapping]] = ..., max_runtime_s: _Optional[int] = ..., image: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., workload_ref: _Optional[str] = ..., simulated_duration_s: _Optional[float] = ..., stop_signal: _Optional[str] = ..., stop_grace_s: _Optional[float] = ..., checkpoint_dir: _Optional[str] = ...) -> None: ...

class FieldError(_message.Message):
    __slots__ = ("field", "message")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    field: str
    message: str
    def __init__(self, field: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class FieldErrors(_message.Message):
    __slots__ = ("errors",)
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    errors: _containers.RepeatedCompositeFieldContainer[FieldError]
    def __init__(self, errors: _Optional[_Iterable[_Union[FieldError, _Mapping]]] = ...) -> None: ...

class ReplicaPlacement(_message.Message):
    __slots__ = ("role", "replica", "rank", "node_id", "gpus")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    role: str
    replica: int
    rank: int
    node_id: str
    gpus: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, role: _Optional[str] = ..., replica: _Optional[int] = ..., rank: _Optional[int] = ..., node_id: _Optional[str] = ..., gpus: _Optional[_Iterable[int]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "status", "tenant", "queue", "name", "priority_class", "gpus", "reason", "message", "position", "run_id", "attempt", "requeues", "placement", "errors", "submitted_at", "accepted_at", "admitted_at", "placed_at", "started_at", "finished_at", "spec")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REQUEUES_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_AT_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    PLACED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    status: str
    tenant: str
    queue: str
    name: str
    priority_class: str
    gpus: int
    reason: str
    message: str
    position: int
    run_id: str
    attempt: int
    requeues: int
    placement: _containers.RepeatedCompositeFieldContainer[ReplicaPlacement]
    errors: _containers.RepeatedCompositeFieldContainer[FieldError]
    submitted_at: float
    accepted_at: float
    admitted_at: float
    placed_at: float
    started_at: float
    finished_at: float
    spec: JobSpec
    def __init__(self, job_id: _Optional[str] = ..., status: _Optional[str] = ..., tenant: _Optional[str] = ..., queue: _Optional[str] = ..., name: _Optional[str] = ..., priority_class: _Optional[str] = ..., gpus: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., position: _Optional[int] = ..., run_id: _Optional[str] = ..., attempt: _Optional[int] = ..., requeues: _Optional[int] = ..., placement: _Optional[_Iterable[_Union[ReplicaPlacement, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[FieldError, _Mapping]]] = ..., submitted_at: _Optional[float] = ..., accepted_at: _Optional[float] = ..., admitted_at: _Optional[float] = ..., placed_at: _Optional[float] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec", "job_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    job_id: str
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ..., job_id: _Optional[str] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job_id", "status")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    status: str
    def __init__(self, job_id: _Optional[str] = ..., status: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("tenant", "status", "limit", "cursor", "submitted_after", "submitted_before", "archived")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AFTER_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    status: str
    limit: int
    cursor: str
    submitted_after: float
    submitted_before: float
    archived: bool
    def __init__(self, tenant: _Optional[str] = ..., status: _Optional[str] = ..., limit: _Optional[int] = ..., cursor: _Optional[str] = ..., submitted_after: _Optional[float] = ..., submitted_before: _Optional[float] = ..., archived: _Optional[bool] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_cursor")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_cursor: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_cursor: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("job_id", "status")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    status: str
    def __init__(self, job_id: _Optional[str] = ..., status: _Optional[str] = ...) -> None: ...

class GetJobLogsRequest(_message.Message):
    __slots__ = ("job_id", "rank", "attempt", "offset", "limit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    attempt: int
    offset: int
    limit: int
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., attempt: _Optional[int] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class JobLogs(_message.Message):
    __slots__ = ("job_id", "attempt", "rank", "node_id", "offset", "next_offset", "size", "data", "finished")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    rank: int
    node_id: str
    offset: int
    next_offset: int
    size: int
    data: str
    finished: bool
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., rank: _Optional[int] = ..., node_id: _Optional[str] = ..., offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., size: _Optional[int] = ..., data: _Optional[str] = ..., finished: _Optional[bool] = ...) -> None: ...
