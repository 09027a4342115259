"""Client of salus-server's admin API (gRPC service salus.v1.Admin, on the server's port).

    from salus.admin import AdminClient
    with AdminClient("127.0.0.1:5501") as admin:
        for job in admin.list_jobs():
            print(job["name"], job["state"], job["iterations"])

Messages are plain dicts with the field names of proto/salus/v1/admin.proto. The client is generated
from that file when the package is built (salus.v1.admin_pb2, see python/hatch_build.py).
"""

from __future__ import annotations

import grpc

from . import _config
from ._messages import to_dict

try:
    from .v1 import admin_pb2 as pb
    from .v1 import admin_pb2_grpc as pb_grpc
except ImportError as e:  # running from a source tree that was never built
    raise ImportError("salus.v1.admin_pb2 is generated from admin.proto when the package is built: "
                      "install it with `python -m pip install ./python`") from e

DEFAULT_TIMEOUT_S = 5.0


class AdminError(RuntimeError):
    """The server answered with an error (message is the server's)."""

    def __init__(self, message: str, code=None):
        super().__init__(message)
        self.code = code


class ServerUnreachable(AdminError, ConnectionError):
    """No salus-server answers at the address."""


def _server_address(server: str | None) -> str:
    import os
    raw = server or os.environ.get(_config.ENV_SERVER) or _config.DEFAULT_SERVER
    source = "--server" if server else (_config.ENV_SERVER if os.environ.get(_config.ENV_SERVER) else "server")
    return _config.normalize_server(raw, source)


class AdminClient:
    def __init__(self, server: str | None = None, timeout: float = DEFAULT_TIMEOUT_S, token: str | None = None):
        """`token` (default: SALUS_TOKEN) identifies the caller: a tenant's, or an admin token named in the
        server's --admins; without one the server identifies a loopback caller by its Unix user."""
        import os
        from . import _token
        self.address = _server_address(server)
        self.timeout = timeout
        token = token if token is not None else os.environ.get(_token.ENV_TOKEN)
        options = []
        if token:
            problem = _token.token_problem(token)
            if problem is not None:
                raise AdminError(f"the token {problem} ({_token.RULE})")
            options.append((_token.USER_AGENT_KEY, f"salus1.{token}"))
        self._channel = grpc.insecure_channel(self.address, options=options)
        self._stub = pb_grpc.AdminStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method: str, request) -> dict:
        fn = getattr(self._stub, method)
        try:
            reply = fn(request, timeout=self.timeout)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            detail = (e.details() if hasattr(e, "details") else "") or str(code)
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise ServerUnreachable(f"cannot reach salus-server at {self.address}: {detail}", code) from None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise AdminError(f"{self.address} does not serve the Salus admin API (is it a salus-server?) "
                                 f"or not this call (an older server?): {detail}", code) from None
            if code == grpc.StatusCode.INTERNAL and "deserializ" in detail.lower():
                raise AdminError(f"malformed {method} reply from {self.address}: {detail}", code) from None
            raise AdminError(detail, code) from None
        return to_dict(reply)

    def server_info(self) -> dict:
        return self._call("GetServerInfo", pb.GetServerInfoRequest())

    def list_jobs(self) -> list[dict]:
        return self._call("ListJobs", pb.ListJobsRequest())["jobs"]

    def jobs_and_reservations(self) -> tuple[list[dict], list[dict]]:
        """The jobs, and the device memory issued tokens reserve for their tenants (those the caller sees)."""
        reply = self._call("ListJobs", pb.ListJobsRequest())
        return reply["jobs"], reply.get("reservations", [])

    def stats(self) -> dict:
        return self._call("GetStats", pb.GetStatsRequest())

    def set_policy(self, policy: str) -> dict:
        """Returns {'previous': ..., 'policy': ...}."""
        return self._call("SetPolicy", pb.SetPolicyRequest(policy=policy))

    def set_job_hints(self, job: str, priority: int | None = None, iterations: int | None = None,
                      seconds: float | None = None) -> dict:
        """Changes the hints given (job: id, session handle or name); the job keeps the others (None).
        0 iterations or seconds clears that expectation. Returns the job."""
        hints = pb.JobHintsUpdate()
        if priority is not None:
            hints.priority = priority
        if iterations is not None:
            hints.expected_iterations = iterations
        if seconds is not None:
            hints.expected_seconds = seconds
        return self._call("SetJobHints", pb.SetJobHintsRequest(job=job, hints=hints))

    def timeline(self, seconds: float = 0.0) -> dict:
        """Runs that ended in the last `seconds` (0: all the server keeps); times are seconds before the
        server's "now", so no clock sync is needed."""
        return self._call("GetTimeline", pb.GetTimelineRequest(seconds=seconds))

    def issue_token(self, tenant: str, uid: int | None = None, memory_bytes: int | None = None,
                    max_priority: int | None = None, max_jobs: int | None = None, weight: int | None = None,
                    expires_seconds: float = 0.0) -> dict:
        """A new token for `tenant` (admins only): {'token': ..., 'info': {'id', 'tenant', 'limits', ...}}.
        `memory_bytes` is also a reservation held on this server while the token is valid; the server
        refuses one that would not fit (AdminError, RESOURCE_EXHAUSTED). 0 seconds: until revoked."""
        limits = pb.TenantLimits(weight=weight, max_jobs=max_jobs, max_priority=max_priority,
                                 memory_bytes=memory_bytes)
        return self._call("IssueToken", pb.IssueTokenRequest(tenant=tenant, uid=uid, limits=limits,
                                                             expires_seconds=expires_seconds))

    def revoke_tokens(self, which: str) -> list[dict]:
        """Revokes the token with this id (admins only; never a tenant's tokens: `salus token revoke
        --tenant NAME` does that); returns those revoked."""
        return self._call("RevokeTokens", pb.RevokeTokensRequest(which=which))["tokens"]

    def list_tokens(self) -> list[dict]:
        """The tokens issued and valid (admins only): id, tenant, uid, limits, expiry; never the tokens."""
        return self._call("ListTokens", pb.ListTokensRequest())["tokens"]
