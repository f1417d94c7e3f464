from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RouteKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUTE_KIND_UNSPECIFIED: _ClassVar[RouteKind]
    ROUTE_KIND_READ: _ClassVar[RouteKind]
    ROUTE_KIND_RUN: _ClassVar[RouteKind]
    ROUTE_KIND_TASK_TOKEN: _ClassVar[RouteKind]
    ROUTE_KIND_REQUEST_ID: _ClassVar[RouteKind]
    ROUTE_KIND_GROUP: _ClassVar[RouteKind]
    ROUTE_KIND_ANY_OWNER: _ClassVar[RouteKind]
    ROUTE_KIND_LOCAL: _ClassVar[RouteKind]
ROUTE_KIND_UNSPECIFIED: RouteKind
ROUTE_KIND_READ: RouteKind
ROUTE_KIND_RUN: RouteKind
ROUTE_KIND_TASK_TOKEN: RouteKind
ROUTE_KIND_REQUEST_ID: RouteKind
ROUTE_KIND_GROUP: RouteKind
ROUTE_KIND_ANY_OWNER: RouteKind
ROUTE_KIND_LOCAL: RouteKind
ROUTE_FIELD_NUMBER: _ClassVar[int]
route: _descriptor.FieldDescriptor

class Route(_message.Message):
    __slots__ = ("kind", "field")
    KIND_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    kind: RouteKind
    field: str
    def __init__(self, kind: _Optional[_Union[RouteKind, str]] = ..., field: _Optional[str] = ...) -> None: ...
