"""Client of salus-server's admin API (gRPC service salus.v1.Admin, on the server's port).

    from salus.admin import AdminClient
    with AdminClient("127.0.0.1:5501") as admin:
        for job in admin.list_jobs():
            print(job["name"], job["state"], job["iterations"])

Messages are plain dicts with the field names of proto/salus/v1/admin.proto.
"""

from __future__ import annotations

import grpc

from . import _config, _proto

SERVICE = "/salus.v1.Admin/"
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
    def __init__(self, server: str | None = None, timeout: float = DEFAULT_TIMEOUT_S):
        self.address = _server_address(server)
        self.timeout = timeout
        self._channel = grpc.insecure_channel(self.address)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method: str, request: bytes, response: str) -> dict:
        fn = self._channel.unary_unary(SERVICE + method, request_serializer=None, response_deserializer=None)
        try:
            raw = fn(request, timeout=self.timeout)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            detail = (e.details() if hasattr(e, "details") else "") or str(code)
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise ServerUnreachable(f"cannot reach salus-server at {self.address}: {detail}", code) from None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise AdminError(f"{self.address} does not serve the Salus admin API (is it a salus-server?): "
                                 f"{detail}", code) from None
            raise AdminError(detail, code) from None
        try:
            return _proto.decode(response, raw)
        except ValueError as e:
            raise AdminError(f"malformed {response} from {self.address}: {e}") from None

    def server_info(self) -> dict:
        return self._call("GetServerInfo", b"", "ServerInfo")

    def list_jobs(self) -> list[dict]:
        return self._call("ListJobs", b"", "ListJobsResponse")["jobs"]

    def stats(self) -> dict:
        return self._call("GetStats", b"", "SchedulerStats")

    def set_policy(self, policy: str) -> dict:
        """Returns {'previous': ..., 'policy': ...}."""
        return self._call("SetPolicy", _proto.encode("SetPolicyRequest", {"policy": policy}), "SetPolicyResponse")

    def set_job_hints(self, job: str, priority: int = 0, iterations: int = 0, seconds: float = 0.0) -> dict:
        """Replaces a job's hints (job: id, session handle or name); returns the job."""
        req = _proto.encode("SetJobHintsRequest", {"job": job, "hints": {
            "priority": priority, "expected_iterations": iterations, "expected_seconds": seconds}})
        return self._call("SetJobHints", req, "JobInfo")


def job_json(job: dict) -> dict:
    """A job with the keys of `salus-server ctl jobs --json`."""
    h = job.get("hints") or {}
    return {
        "id": job["id"],
        "handle": job["handle"],
        "name": job["name"],
        "state": job["state"],
        # A job waiting for (or not yet asking for) memory has no lane.
        "lane": None if job["memory_state"] in ("waiting for memory", "not admitted yet") else job["lane"],
        "policy": job["policy"],
        "iterations": job["iterations"],
        "attained_s": job["attained_seconds"],
        "mean_iteration_ms": job["mean_iteration_ms"],
        "queue_wait_s": job["queue_wait_seconds"],
        "queued": job["queued"],
        "priority": h.get("priority", 0),
        "expected_iterations": h.get("expected_iterations") or None,
        "expected_seconds": h.get("expected_seconds") or None,
        "note": job["note"],
        "graph_version": job["graph_version"],
        "graph_nodes": job["graph_nodes"],
        "runs_completed": job["runs_completed"],
        "runs_failed": job["runs_failed"],
        "age_s": job["age_seconds"],
        "idle_s": job["idle_seconds"],
        # Newer servers only (JobInfo fields 20-22); 0 from a server that does not send them.
        "variable_bytes": job["variable_bytes"],
        "variables": job["variables"],
        "variables_of_unknown_size": job["variables_of_unknown_size"],
        "memory_state": job["memory_state"],
        "persistent_estimate_bytes": job["persistent_estimate_bytes"],
        "ephemeral_estimate_bytes": job["ephemeral_estimate_bytes"],
        "persistent_source": job["persistent_source"],
        "ephemeral_source": job["ephemeral_source"],
        "kind": job["kind"] or "graph",
    }


def stats_json(s: dict) -> dict:
    """Scheduler stats with the keys of `salus-server ctl stats --json`."""
    lat = s["switch_latency"]
    return {
        "policy": s["policy"],
        "iterations_total": s["iterations_total"],
        "iterations_per_s": s["iterations_per_second"],
        "queued": s["queued"],
        "cheap_runs_total": s["cheap_runs_total"],
        "dropped_iterations": s["dropped_iterations"],
        "switch_latency_us": {"count": lat["count"], "p50": lat["p50_us"], "p99": lat["p99_us"],
                              "max": lat["max_us"], "buckets": lat["buckets"]},
        "lanes": [{"lane": q["lane"], "queued": q["queued"], "running": q["running"]} for q in s["lanes"]],
    }
