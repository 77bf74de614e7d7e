"""What the agent client and the controller client share: one channel, a deadline on
every call, and gRPC errors turned into the package's own typed error.

::

    RpcError                a call refused, or a peer not reachable; ``code`` is the status
     ├── SouthboundError    from an agent (sixlab.southbound.client)
     ├── AgentError         by this agent, the server side (sixlab.southbound.agent)
     └── NorthboundError    from a controller (sixlab.controller.client; also a
                            ``ControllerError``)
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

import grpc

__all__ = ["GrpcClient", "RpcError"]


class RpcError(Exception):
    """A call refused (or a peer not reached); ``code`` is the gRPC status, ``details``
    its message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def from_rpc(cls, exc: grpc.RpcError) -> Self:
        return cls(exc.code(), exc.details() or "")


class GrpcClient:
    """Base of the typed clients: ``_call(method, request)`` with the deadline."""

    #: The error the subclass raises, and how its messages name the peer.
    error: ClassVar[type[RpcError]] = RpcError
    peer: ClassVar[str] = "peer"

    def __init__(self, target: str, channel: grpc.Channel, timeout: float) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = channel

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the peer accepts connections (e.g. right after it was started)."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise self.error(
                grpc.StatusCode.UNAVAILABLE,
                f"{self.peer} at {self.target} not ready in {timeout} s",
            ) from None

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise self.error.from_rpc(exc) from None

    _stub: Any
