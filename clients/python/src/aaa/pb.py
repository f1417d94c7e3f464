"""The generated aaa.v1 protobuf modules and gRPC stubs, for calls the SDK does not wrap.

::

    from aaa.pb import worker_pb2
    await client.stubs.worker.PollTask(worker_pb2.PollTaskRequest(identity="me", tools=["x"]))
"""

from ._proto.aaa.v1 import (
    approval_pb2,
    approval_pb2_grpc,
    policy_pb2,
    policy_pb2_grpc,
    run_pb2,
    run_pb2_grpc,
    subscription_pb2,
    subscription_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)

__all__ = [
    "approval_pb2",
    "approval_pb2_grpc",
    "policy_pb2",
    "policy_pb2_grpc",
    "run_pb2",
    "run_pb2_grpc",
    "subscription_pb2",
    "subscription_pb2_grpc",
    "types_pb2",
    "worker_pb2",
    "worker_pb2_grpc",
]
