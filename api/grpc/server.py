"""The gRPC server: engram.memory.v1's services over a runtime's service layer, the standard
health service (grpc.health.v1, following the runtime's readiness) and server reflection, so
grpcurl-style tools and load balancers work."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from api.grpc.forgets import Forgets
from api.grpc.memories import Memories
from api.grpc.operators import Approvals, Control, Keys, Reviews
from api.http import MAX_BODY_BYTES
from engram.domain.errors import ConfigError
from engram_grpc.memory.v1 import memory_pb2, memory_pb2_grpc

log = logging.getLogger("engram.grpc")
HEALTH_CHECK_S = 5.0  # how often the health service's status follows the runtime's readiness
SERVICES = tuple(service.full_name for service in memory_pb2.DESCRIPTOR.services_by_name.values())
_ADDERS = ((memory_pb2_grpc.add_MemoryServiceServicer_to_server, Memories),
           (memory_pb2_grpc.add_ForgetServiceServicer_to_server, Forgets),
           (memory_pb2_grpc.add_ReviewServiceServicer_to_server, Reviews),
           (memory_pb2_grpc.add_ApprovalServiceServicer_to_server, Approvals),
           (memory_pb2_grpc.add_ControlServiceServicer_to_server, Control),
           (memory_pb2_grpc.add_KeyServiceServicer_to_server, Keys))


@contextlib.asynccontextmanager
async def serving(runtime, host: str, port: int, *, health_check_s: float = HEALTH_CHECK_S) -> AsyncIterator[int]:
    """Serve the gRPC API over `runtime` on host:port (port 0: any free one) until the block
    ends; yields the bound port. Health answers SERVING, for the server ("") and each service,
    while every component of `runtime.readiness()` is ok, NOT_SERVING otherwise, and
    NOT_SERVING once shutdown begins. A message over the HTTP body limit is refused
    (RESOURCE_EXHAUSTED). Raises ConfigError if the address cannot be bound."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_BODY_BYTES)])
    for add, servicer in _ADDERS:
        add(servicer(runtime), server)
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    reflection.enable_server_reflection((*SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as err:
        raise ConfigError(f"the gRPC API cannot listen on {host}:{port}: {err}") from err
    await server.start()
    follow = asyncio.create_task(_follow_readiness(runtime, checker, health_check_s))
    try:
        yield bound
    finally:
        follow.cancel()
        await checker.enter_graceful_shutdown()
        await server.stop(grace=5)


async def _follow_readiness(runtime, checker, every_s: float) -> None:
    serving_now = None
    while True:
        try:
            state = await runtime.readiness()
            ready = all(part.get("ok") for part in state.values())
        except Exception:  # noqa: BLE001 - readiness never raises; if it does, we are not ready
            log.exception("readiness failed")
            ready = False
        if ready != serving_now:
            status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
            for name in ("", *SERVICES):
                await checker.set(name, status)
            serving_now = ready
        await asyncio.sleep(every_s)
