from aaa._proto.aaa.v1 import routing_pb2 as _routing_pb2
from aaa._proto.aaa.v1 import worker_pb2 as _worker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PeerPollRequest(_message.Message):
    __slots__ = ("poll", "accept", "returned", "withdraw")
    POLL_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_FIELD_NUMBER: _ClassVar[int]
    RETURNED_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_FIELD_NUMBER: _ClassVar[int]
    poll: _worker_pb2.PollTaskRequest
    accept: bool
    returned: bool
    withdraw: bool
    def __init__(self, poll: _Optional[_Union[_worker_pb2.PollTaskRequest, _Mapping]] = ..., accept: _Optional[bool] = ..., returned: _Optional[bool] = ..., withdraw: _Optional[bool] = ...) -> None: ...

class PeerPollResponse(_message.Message):
    __slots__ = ("offered", "task", "ended")
    OFFERED_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    offered: bool
    task: _worker_pb2.Task
    ended: bool
    def __init__(self, offered: _Optional[bool] = ..., task: _Optional[_Union[_worker_pb2.Task, _Mapping]] = ..., ended: _Optional[bool] = ...) -> None: ...

class GetClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetClusterResponse(_message.Message):
    __slots__ = ("this_server", "store", "members", "shards", "unowned_shards", "shard_owners")
    THIS_SERVER_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    UNOWNED_SHARDS_FIELD_NUMBER: _ClassVar[int]
    SHARD_OWNERS_FIELD_NUMBER: _ClassVar[int]
    this_server: str
    store: str
    members: _containers.RepeatedCompositeFieldContainer[ClusterMember]
    shards: int
    unowned_shards: int
    shard_owners: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, this_server: _Optional[str] = ..., store: _Optional[str] = ..., members: _Optional[_Iterable[_Union[ClusterMember, _Mapping]]] = ..., shards: _Optional[int] = ..., unowned_shards: _Optional[int] = ..., shard_owners: _Optional[_Iterable[str]] = ...) -> None: ...

class ClusterMember(_message.Message):
    __slots__ = ("server", "address", "alive", "shards", "epoch", "lease_left_ms", "gone_for_ms", "up_ms", "spreads")
    SERVER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_LEFT_MS_FIELD_NUMBER: _ClassVar[int]
    GONE_FOR_MS_FIELD_NUMBER: _ClassVar[int]
    UP_MS_FIELD_NUMBER: _ClassVar[int]
    SPREADS_FIELD_NUMBER: _ClassVar[int]
    server: str
    address: str
    alive: bool
    shards: int
    epoch: int
    lease_left_ms: int
    gone_for_ms: int
    up_ms: int
    spreads: bool
    def __init__(self, server: _Optional[str] = ..., address: _Optional[str] = ..., alive: _Optional[bool] = ..., shards: _Optional[int] = ..., epoch: _Optional[int] = ..., lease_left_ms: _Optional[int] = ..., gone_for_ms: _Optional[int] = ..., up_ms: _Optional[int] = ..., spreads: _Optional[bool] = ...) -> None: ...
