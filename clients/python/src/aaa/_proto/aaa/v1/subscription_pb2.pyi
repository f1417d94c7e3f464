import datetime

from aaa._proto.aaa.v1 import routing_pb2 as _routing_pb2
from aaa._proto.aaa.v1 import types_pb2 as _types_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StartFrom(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    START_FROM_UNSPECIFIED: _ClassVar[StartFrom]
    START_FROM_BEGINNING: _ClassVar[StartFrom]
    START_FROM_NOW: _ClassVar[StartFrom]
    START_FROM_AFTER_POSITION: _ClassVar[StartFrom]
START_FROM_UNSPECIFIED: StartFrom
START_FROM_BEGINNING: StartFrom
START_FROM_NOW: StartFrom
START_FROM_AFTER_POSITION: StartFrom

class SubscribeRequest(_message.Message):
    __slots__ = ("open", "ack", "nack")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    open: SubscriptionOpen
    ack: Ack
    nack: Nack
    def __init__(self, open: _Optional[_Union[SubscriptionOpen, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., nack: _Optional[_Union[Nack, _Mapping]] = ...) -> None: ...

class SubscriptionOpen(_message.Message):
    __slots__ = ("group", "event_types", "labels", "start_from", "start_after_position", "ack_timeout_s", "max_deliveries", "max_in_flight")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GROUP_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    START_FROM_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_POSITION_FIELD_NUMBER: _ClassVar[int]
    ACK_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    group: str
    event_types: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.ScalarMap[str, str]
    start_from: StartFrom
    start_after_position: int
    ack_timeout_s: float
    max_deliveries: int
    max_in_flight: int
    def __init__(self, group: _Optional[str] = ..., event_types: _Optional[_Iterable[str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., start_from: _Optional[_Union[StartFrom, str]] = ..., start_after_position: _Optional[int] = ..., ack_timeout_s: _Optional[float] = ..., max_deliveries: _Optional[int] = ..., max_in_flight: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("delivery_id",)
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    delivery_id: str
    def __init__(self, delivery_id: _Optional[str] = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ("delivery_id", "reason")
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    delivery_id: str
    reason: str
    def __init__(self, delivery_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("subscribed", "delivery", "ack_result")
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    ACK_RESULT_FIELD_NUMBER: _ClassVar[int]
    subscribed: Subscribed
    delivery: Delivery
    ack_result: AckResult
    def __init__(self, subscribed: _Optional[_Union[Subscribed, _Mapping]] = ..., delivery: _Optional[_Union[Delivery, _Mapping]] = ..., ack_result: _Optional[_Union[AckResult, _Mapping]] = ...) -> None: ...

class Subscribed(_message.Message):
    __slots__ = ("group", "created", "member_id", "cursor", "event_types", "labels", "ack_timeout_s", "max_deliveries", "max_in_flight")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ACK_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    group: str
    created: bool
    member_id: str
    cursor: int
    event_types: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.ScalarMap[str, str]
    ack_timeout_s: float
    max_deliveries: int
    max_in_flight: int
    def __init__(self, group: _Optional[str] = ..., created: _Optional[bool] = ..., member_id: _Optional[str] = ..., cursor: _Optional[int] = ..., event_types: _Optional[_Iterable[str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., ack_timeout_s: _Optional[float] = ..., max_deliveries: _Optional[int] = ..., max_in_flight: _Optional[int] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("delivery_id", "event", "attempt", "ack_deadline", "replayed")
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ACK_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    delivery_id: str
    event: _types_pb2.Event
    attempt: int
    ack_deadline: _timestamp_pb2.Timestamp
    replayed: bool
    def __init__(self, delivery_id: _Optional[str] = ..., event: _Optional[_Union[_types_pb2.Event, _Mapping]] = ..., attempt: _Optional[int] = ..., ack_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class AckResult(_message.Message):
    __slots__ = ("delivery_id", "stale", "reason")
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    delivery_id: str
    stale: bool
    reason: str
    def __init__(self, delivery_id: _Optional[str] = ..., stale: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("group", "page_size", "page_token")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    group: str
    page_size: int
    page_token: str
    def __init__(self, group: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("event", "deliveries", "last_error", "dead_at", "replaying")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    DEAD_AT_FIELD_NUMBER: _ClassVar[int]
    REPLAYING_FIELD_NUMBER: _ClassVar[int]
    event: _types_pb2.Event
    deliveries: int
    last_error: str
    dead_at: _timestamp_pb2.Timestamp
    replaying: bool
    def __init__(self, event: _Optional[_Union[_types_pb2.Event, _Mapping]] = ..., deliveries: _Optional[int] = ..., last_error: _Optional[str] = ..., dead_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., replaying: _Optional[bool] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ("dead_letters", "next_page_token")
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    dead_letters: _containers.RepeatedCompositeFieldContainer[DeadLetter]
    next_page_token: str
    def __init__(self, dead_letters: _Optional[_Iterable[_Union[DeadLetter, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReplayDeadLettersRequest(_message.Message):
    __slots__ = ("group", "positions")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    group: str
    positions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, group: _Optional[str] = ..., positions: _Optional[_Iterable[int]] = ...) -> None: ...

class ReplayDeadLettersResponse(_message.Message):
    __slots__ = ("replayed",)
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    replayed: int
    def __init__(self, replayed: _Optional[int] = ...) -> None: ...
