from dissem.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResizeGridRequest(_message.Message):
    __slots__ = ("rows", "cols")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    cols: int
    def __init__(self, rows: _Optional[int] = ..., cols: _Optional[int] = ...) -> None: ...

class ResizeGridResponse(_message.Message):
    __slots__ = ("grid", "moving_to", "waiting", "done")
    GRID_FIELD_NUMBER: _ClassVar[int]
    MOVING_TO_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    grid: str
    moving_to: str
    waiting: _containers.RepeatedScalarFieldContainer[str]
    done: bool
    def __init__(self, grid: _Optional[str] = ..., moving_to: _Optional[str] = ..., waiting: _Optional[_Iterable[str]] = ..., done: _Optional[bool] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("exit",)
    EXIT_FIELD_NUMBER: _ClassVar[int]
    exit: bool
    def __init__(self, exit: _Optional[bool] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("draining", "outbox_pending", "deliveries_open", "deliveries_queued", "owed_to_links", "drained")
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    OUTBOX_PENDING_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_OPEN_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_QUEUED_FIELD_NUMBER: _ClassVar[int]
    OWED_TO_LINKS_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    draining: bool
    outbox_pending: int
    deliveries_open: int
    deliveries_queued: int
    owed_to_links: int
    drained: bool
    def __init__(self, draining: _Optional[bool] = ..., outbox_pending: _Optional[int] = ..., deliveries_open: _Optional[int] = ..., deliveries_queued: _Optional[int] = ..., owed_to_links: _Optional[int] = ..., drained: _Optional[bool] = ...) -> None: ...

class DeadLettersRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("subscription_id", "object_id", "reason", "at_unix_ms")
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    subscription_id: int
    object_id: _common_pb2.ObjectId
    reason: str
    at_unix_ms: int
    def __init__(self, subscription_id: _Optional[int] = ..., object_id: _Optional[_Union[_common_pb2.ObjectId, _Mapping]] = ..., reason: _Optional[str] = ..., at_unix_ms: _Optional[int] = ...) -> None: ...

class DeadLettersResponse(_message.Message):
    __slots__ = ("dead_letters",)
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    dead_letters: _containers.RepeatedCompositeFieldContainer[DeadLetter]
    def __init__(self, dead_letters: _Optional[_Iterable[_Union[DeadLetter, _Mapping]]] = ...) -> None: ...

class RedriveRequest(_message.Message):
    __slots__ = ("dead_letters", "all")
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    dead_letters: _containers.RepeatedCompositeFieldContainer[DeadLetter]
    all: bool
    def __init__(self, dead_letters: _Optional[_Iterable[_Union[DeadLetter, _Mapping]]] = ..., all: _Optional[bool] = ...) -> None: ...

class RedriveResponse(_message.Message):
    __slots__ = ("redriven",)
    REDRIVEN_FIELD_NUMBER: _ClassVar[int]
    redriven: int
    def __init__(self, redriven: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("node", "objects_stored", "puts_accepted", "puts_rejected", "outbox_pending", "subscriptions", "role", "matches_handed", "matches_repeated", "deliveries", "deliveries_acked", "delivery_failures", "dead_lettered", "deliveries_queued", "copies_unfinished", "copies_finished", "objects_taken_over", "cluster", "image_loaded", "copies_forwarding", "view", "copies_pulled", "registry_kept", "registry_ready_ms", "images_compiled", "images_kept", "qos0_dropped", "objects_handed", "objects_taken_back", "store_failed", "puts_waited", "puts_refused_overloaded", "puts_waiting", "images_applied", "images_compacted")
    NODE_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_STORED_FIELD_NUMBER: _ClassVar[int]
    PUTS_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    PUTS_REJECTED_FIELD_NUMBER: _ClassVar[int]
    OUTBOX_PENDING_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MATCHES_HANDED_FIELD_NUMBER: _ClassVar[int]
    MATCHES_REPEATED_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_ACKED_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FAILURES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_QUEUED_FIELD_NUMBER: _ClassVar[int]
    COPIES_UNFINISHED_FIELD_NUMBER: _ClassVar[int]
    COPIES_FINISHED_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_TAKEN_OVER_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    IMAGE_LOADED_FIELD_NUMBER: _ClassVar[int]
    COPIES_FORWARDING_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    COPIES_PULLED_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_KEPT_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_READY_MS_FIELD_NUMBER: _ClassVar[int]
    IMAGES_COMPILED_FIELD_NUMBER: _ClassVar[int]
    IMAGES_KEPT_FIELD_NUMBER: _ClassVar[int]
    QOS0_DROPPED_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_HANDED_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_TAKEN_BACK_FIELD_NUMBER: _ClassVar[int]
    STORE_FAILED_FIELD_NUMBER: _ClassVar[int]
    PUTS_WAITED_FIELD_NUMBER: _ClassVar[int]
    PUTS_REFUSED_OVERLOADED_FIELD_NUMBER: _ClassVar[int]
    PUTS_WAITING_FIELD_NUMBER: _ClassVar[int]
    IMAGES_APPLIED_FIELD_NUMBER: _ClassVar[int]
    IMAGES_COMPACTED_FIELD_NUMBER: _ClassVar[int]
    node: int
    objects_stored: int
    puts_accepted: int
    puts_rejected: int
    outbox_pending: int
    subscriptions: int
    role: str
    matches_handed: int
    matches_repeated: int
    deliveries: int
    deliveries_acked: int
    delivery_failures: int
    dead_lettered: int
    deliveries_queued: int
    copies_unfinished: int
    copies_finished: int
    objects_taken_over: int
    cluster: ClusterStats
    image_loaded: int
    copies_forwarding: int
    view: ClusterView
    copies_pulled: int
    registry_kept: bool
    registry_ready_ms: int
    images_compiled: int
    images_kept: int
    qos0_dropped: int
    objects_handed: int
    objects_taken_back: int
    store_failed: bool
    puts_waited: int
    puts_refused_overloaded: int
    puts_waiting: int
    images_applied: int
    images_compacted: int
    def __init__(self, node: _Optional[int] = ..., objects_stored: _Optional[int] = ..., puts_accepted: _Optional[int] = ..., puts_rejected: _Optional[int] = ..., outbox_pending: _Optional[int] = ..., subscriptions: _Optional[int] = ..., role: _Optional[str] = ..., matches_handed: _Optional[int] = ..., matches_repeated: _Optional[int] = ..., deliveries: _Optional[int] = ..., deliveries_acked: _Optional[int] = ..., delivery_failures: _Optional[int] = ..., dead_lettered: _Optional[int] = ..., deliveries_queued: _Optional[int] = ..., copies_unfinished: _Optional[int] = ..., copies_finished: _Optional[int] = ..., objects_taken_over: _Optional[int] = ..., cluster: _Optional[_Union[ClusterStats, _Mapping]] = ..., image_loaded: _Optional[int] = ..., copies_forwarding: _Optional[int] = ..., view: _Optional[_Union[ClusterView, _Mapping]] = ..., copies_pulled: _Optional[int] = ..., registry_kept: _Optional[bool] = ..., registry_ready_ms: _Optional[int] = ..., images_compiled: _Optional[int] = ..., images_kept: _Optional[int] = ..., qos0_dropped: _Optional[int] = ..., objects_handed: _Optional[int] = ..., objects_taken_back: _Optional[int] = ..., store_failed: _Optional[bool] = ..., puts_waited: _Optional[int] = ..., puts_refused_overloaded: _Optional[int] = ..., puts_waiting: _Optional[int] = ..., images_applied: _Optional[int] = ..., images_compacted: _Optional[int] = ...) -> None: ...

class ClusterView(_message.Message):
    __slots__ = ("rows", "cols", "members", "leader_name", "leader_url", "leader_epoch", "leader_nonce", "lease_ms", "next_rows", "next_cols")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_NAME_FIELD_NUMBER: _ClassVar[int]
    LEADER_URL_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_NONCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_ROWS_FIELD_NUMBER: _ClassVar[int]
    NEXT_COLS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    cols: int
    members: _containers.RepeatedCompositeFieldContainer[GridMember]
    leader_name: str
    leader_url: str
    leader_epoch: int
    leader_nonce: int
    lease_ms: int
    next_rows: int
    next_cols: int
    def __init__(self, rows: _Optional[int] = ..., cols: _Optional[int] = ..., members: _Optional[_Iterable[_Union[GridMember, _Mapping]]] = ..., leader_name: _Optional[str] = ..., leader_url: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., leader_nonce: _Optional[int] = ..., lease_ms: _Optional[int] = ..., next_rows: _Optional[int] = ..., next_cols: _Optional[int] = ...) -> None: ...

class GridMember(_message.Message):
    __slots__ = ("node", "row", "col", "alive", "heir", "endpoint")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    COL_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    HEIR_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    node: int
    row: int
    col: int
    alive: bool
    heir: int
    endpoint: str
    def __init__(self, node: _Optional[int] = ..., row: _Optional[int] = ..., col: _Optional[int] = ..., alive: _Optional[bool] = ..., heir: _Optional[int] = ..., endpoint: _Optional[str] = ...) -> None: ...

class ClusterStats(_message.Message):
    __slots__ = ("nonce", "image_version", "image_subscriptions", "nodes", "waiting_tasks", "open_batches", "mean_test_ms", "mean_match_ms", "reassignments", "dead_workers", "objects_arrived", "objects_matched", "objects_in_flight", "messages", "loads", "workers", "match_latency_p50_ms", "match_latency_p99_ms")
    class WorkersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NONCE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_VERSION_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    WAITING_TASKS_FIELD_NUMBER: _ClassVar[int]
    OPEN_BATCHES_FIELD_NUMBER: _ClassVar[int]
    MEAN_TEST_MS_FIELD_NUMBER: _ClassVar[int]
    MEAN_MATCH_MS_FIELD_NUMBER: _ClassVar[int]
    REASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    DEAD_WORKERS_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_ARRIVED_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_MATCHED_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    MATCH_LATENCY_P50_MS_FIELD_NUMBER: _ClassVar[int]
    MATCH_LATENCY_P99_MS_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    image_version: int
    image_subscriptions: int
    nodes: int
    waiting_tasks: int
    open_batches: int
    mean_test_ms: float
    mean_match_ms: float
    reassignments: int
    dead_workers: int
    objects_arrived: int
    objects_matched: int
    objects_in_flight: int
    messages: int
    loads: int
    workers: _containers.ScalarMap[str, int]
    match_latency_p50_ms: float
    match_latency_p99_ms: float
    def __init__(self, nonce: _Optional[int] = ..., image_version: _Optional[int] = ..., image_subscriptions: _Optional[int] = ..., nodes: _Optional[int] = ..., waiting_tasks: _Optional[int] = ..., open_batches: _Optional[int] = ..., mean_test_ms: _Optional[float] = ..., mean_match_ms: _Optional[float] = ..., reassignments: _Optional[int] = ..., dead_workers: _Optional[int] = ..., objects_arrived: _Optional[int] = ..., objects_matched: _Optional[int] = ..., objects_in_flight: _Optional[int] = ..., messages: _Optional[int] = ..., loads: _Optional[int] = ..., workers: _Optional[_Mapping[str, int]] = ..., match_latency_p50_ms: _Optional[float] = ..., match_latency_p99_ms: _Optional[float] = ...) -> None: ...

class WorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("id", "block", "state", "node", "urgent")
    ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    URGENT_FIELD_NUMBER: _ClassVar[int]
    id: str
    block: str
    state: str
    node: int
    urgent: bool
    def __init__(self, id: _Optional[str] = ..., block: _Optional[str] = ..., state: _Optional[str] = ..., node: _Optional[int] = ..., urgent: _Optional[bool] = ...) -> None: ...

class WorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...
