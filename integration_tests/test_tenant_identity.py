"""Tenants: who a request comes from (a loopback client's Unix user, or a token from the tenants file), what a
tenant's handles are worth to another tenant (nothing), and what a tenant may do with files.

Real Unix users (conftest.unix_users) run real TensorFlow clients. One server with the default `--auth both` and a
tenants file, one with `--auth token`, one with `--isolation none`. Costs about 45 s: three servers, seven TensorFlow
client processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct

import grpc
import pytest

import salus_wire as wire
from conftest import WORKLOADS, SalusProcess, last_json_line, run_as, venv_python

TOKENS = {"ta": "tok-ta-4f1c", "bot1": "tok-bot1-9a2e", "bot2": "tok-bot2-77d0"}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def tenants_file(tmp_path_factory, unix_users):
    path = tmp_path_factory.mktemp("tenants") / "tenants"
    path.write_text(
        "# name  sha256-of-token  run-as\n"
        f"ta   {sha256(TOKENS['ta'])}   salus-ta   # a token bound to a Unix user\n"
        f"bot1 {sha256(TOKENS['bot1'])} -\n"
        f"bot2 {sha256(TOKENS['bot2'])} -\n")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, tenants_file):
    """Default identity (--auth both) with the tenants file."""
    s = SalusProcess(tmp_path_factory.mktemp("identity") / "salus-server.stderr.log",
                     ("--tenants-file", str(tenants_file)))
    yield s
    assert s.stop() == 0, s.stderr_tail()


def channel(address: str, token: str | None = None) -> grpc.Channel:
    options = [("grpc.primary_user_agent", f"salus1.{token}")] if token else []
    return grpc.insecure_channel(address, options=options)


def empty_graph_session(ch: grpc.Channel) -> str:
    return wire.first(wire.call(ch, "CreateSession", wire.create_session_request(b"")), 1).decode()


def create_context_request(context_id: int) -> bytes:
    server_def = wire.f_bytes(2, "worker")  # job_name
    return wire.f_bytes(1, server_def) + wire.tag(7, 1) + struct.pack("<Q", context_id)


def keep_alive(ch: grpc.Channel, context_id: int) -> bytes:
    return wire.call(ch, "/tensorflow.eager.EagerService/KeepAlive", wire.tag(1, 1) + struct.pack("<Q", context_id))


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


# --- identity ---------------------------------------------------------------------------------------------

def test_tokens_right_wrong_and_bound_to_another_user(server):
    with channel(server.address, TOKENS["bot1"]) as ch:
        assert empty_graph_session(ch).startswith("salus-")
    with channel(server.address, "not-a-token") as ch:
        err = code_of(lambda: empty_graph_session(ch))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, err
        assert "neither in the server's tenants file nor issued" in err.details() and "SALUS_TOKEN" in err.details()
    # This test runs as root; ta's token is bound to salus-ta: a loopback client of another user may not use it.
    with channel(server.address, TOKENS["ta"]) as ch:
        err = code_of(lambda: empty_graph_session(ch))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, err
        assert "only valid from its own user" in err.details(), err.details()
    # Health checks need no identity.
    with channel(server.address, "not-a-token") as ch:
        assert wire.health_check(ch) == wire.SERVING


def test_token_mode_refuses_a_request_without_a_token(tmp_path, tenants_file):
    s = SalusProcess(tmp_path / "server.log", ("--auth", "token", "--tenants-file", str(tenants_file)))
    try:
        with channel(s.address) as ch:
            err = code_of(lambda: empty_graph_session(ch))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED, err
            assert "set SALUS_TOKEN" in err.details(), err.details()
        with channel(s.address, TOKENS["bot2"]) as ch:
            assert empty_graph_session(ch)
    finally:
        assert s.stop() == 0, s.stderr_tail()


def test_a_stock_client_of_another_user_is_that_user_and_its_token_must_match(server, unix_users):
    """A TF1 client run as salus-tb is salus-tb; with salus-ta's token it is refused with UNAUTHENTICATED,
    which the stock client raises at once."""
    tb = unix_users["salus-tb"]
    script = ("import sys, tensorflow as tf\n"
              "tf.compat.v1.disable_eager_execution()\n"
              "with tf.compat.v1.Session(sys.argv[1]) as s:\n"
              "    try:\n"
              "        print('RESULT', s.run(tf.constant(2.0) * 3.0))\n"
              "    except tf.errors.OpError as e:\n"
              "        print('RESULT', type(e).__name__, e.message)\n")
    ok = run_as(tb, [venv_python(), "-c", script, server.target])
    assert "RESULT 6.0" in ok.stdout, ok.stderr[-3000:]
    assert "tenant=salus-tb" in server.stderr_tail(200_000)
    refused = run_as(tb, [venv_python(), "-c", script, server.target], env={"SALUS_TOKEN": TOKENS["ta"]})
    assert "RESULT UnauthenticatedError" in refused.stdout and "only valid from its own user" in refused.stdout, (
        refused.stdout, refused.stderr[-3000:])


# --- ownership ----------------------------------------------------------------------------------------------

def test_another_tenants_session_handle_is_not_found(server):
    with channel(server.address, TOKENS["bot1"]) as mine, channel(server.address, TOKENS["bot2"]) as other:
        graph = wire.f_bytes(1, wire.f_bytes(1, "c") + wire.f_bytes(2, "Const")
                             + wire.f_bytes(5, wire.f_bytes(1, "dtype") + wire.f_bytes(2, wire.f_varint(6, 1)))
                             + wire.f_bytes(5, wire.f_bytes(1, "value") + wire.f_bytes(
                                 2, wire.f_bytes(8, wire.tensor_proto(1, float_val=[4.0])))))
        handle = wire.first(wire.call(mine, "CreateSession", wire.create_session_request(graph)), 1).decode()
        for method, request in [
            ("RunStep", wire.run_step_request(handle, fetches=["c:0"], store_errors=False)),
            ("ExtendSession", wire.f_bytes(1, handle)),
            ("ListDevices", wire.f_bytes(1, handle)),
            ("MakeCallable", wire.f_bytes(1, handle)),
            ("CloseSession", wire.close_session_request(handle)),
        ]:
            err = code_of(lambda: wire.call(other, method, request))
            assert err.code() == grpc.StatusCode.NOT_FOUND or err.code() == grpc.StatusCode.ABORTED, (method, err)
            assert handle in err.details(), (method, err.details())
        # Unchanged for its owner.
        result = wire.RunStepResult(wire.call(mine, "RunStep", wire.run_step_request(handle, fetches=["c:0"])))
        assert result.status_code == 0 and "c:0" in result.tensors, result
        wire.call(mine, "CloseSession", wire.close_session_request(handle))


def test_context_ids_are_per_tenant(server):
    """Two tenants may pick the same eager context id; each reaches only its own context."""
    context_id = 0x5A1005
    with channel(server.address, TOKENS["bot1"]) as mine, channel(server.address, TOKENS["bot2"]) as other:
        wire.call(mine, "/tensorflow.eager.EagerService/CreateContext", create_context_request(context_id))
        err = code_of(lambda: keep_alive(other, context_id))
        assert "not found" in err.details().lower(), err.details()
        pull = wire.f_varint(1, context_id) + wire.f_bytes(2, "/job:worker;0;/job:localhost;edge_1;0:0")
        err = code_of(lambda: wire.call(other, "/tensorflow.WorkerService/RecvTensor", pull, timeout=10))
        assert "not found" in err.details().lower(), err.details()
        keep_alive(mine, context_id)
        # The same id is free for the other tenant, and then each has its own.
        wire.call(other, "/tensorflow.eager.EagerService/CreateContext", create_context_request(context_id))
        keep_alive(other, context_id)
        keep_alive(mine, context_id)
        for ch in (mine, other):
            wire.call(ch, "/tensorflow.eager.EagerService/CloseContext",
                      wire.tag(1, 1) + struct.pack("<Q", context_id))


# --- files ----------------------------------------------------------------------------------------------------

def files_run(user, target: str, own_file: str, other_file: str, out_dir: str, other_dir: str) -> dict:
    cmd = [venv_python(), str(WORKLOADS / "tenant_files.py"), "--target", target, "--own-file", own_file,
           "--other-file", other_file, "--out-dir", out_dir, "--other-dir", other_dir]
    proc = run_as(user, cmd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return last_json_line(proc.stdout)["outcomes"]


@pytest.fixture(scope="module")
def user_files(unix_users):
    """Each test user's 0600 file and 0700 directory in its home."""
    files = {}
    for name, user in unix_users.items():
        own = os.path.join(user.pw_dir, "private.txt")
        with open(own, "w") as f:
            f.write(f"{name}'s secret\n")
        os.chown(own, user.pw_uid, user.pw_gid)
        os.chmod(own, 0o600)
        files[name] = own
    return files


def test_the_servers_own_user_does_with_files_what_it_does_in_process(server, tmp_path):
    """The test runs as root, like the server: its jobs run with its own permissions, so reading, writing,
    checkpoints, summaries and TFRecord training behave exactly as in its own process."""
    import pwd
    root = pwd.getpwuid(os.getuid())
    own = tmp_path / "own.txt"
    own.write_text("root's file\n")
    other_dir = tmp_path / "elsewhere"
    other_dir.mkdir()
    runs = {}
    for where, target in (("salus", server.target), ("in_process", "")):
        runs[where] = files_run(root, target, str(own), str(own), str(tmp_path / where), str(other_dir))
    print(json.dumps(runs, indent=1))
    assert runs["salus"] == runs["in_process"]
    assert all(outcome[0] == "ok" for outcome in runs["salus"].values()), runs["salus"]


def test_another_users_jobs_on_one_process_server_are_confined(tmp_path, unix_users, user_files):
    """A server that runs as root in one process (--isolation none): salus-ta's computation would run as root, so
    file ops are refused and checkpoints confined, as for an anonymous tenant. (With the default --isolation
    tenant it runs as salus-ta instead: test_tenant_isolation.py.)"""
    single = SalusProcess(tmp_path / "server.log", ("--isolation", "none"))
    ta = unix_users["salus-ta"]
    try:
        out = files_run(ta, single.target, user_files["salus-ta"], user_files["salus-tb"],
                        os.path.join(ta.pw_dir, "out"), unix_users["salus-tb"].pw_dir)
    finally:
        assert single.stop() == 0, single.stderr_tail()
    print(json.dumps(out, indent=1))
    for attempt in ("read_own", "read_other", "write_own", "write_other", "summary", "tfrecord"):
        assert out[attempt][0] == "PermissionDeniedError" and "not allowed on this server" in out[attempt][1], (
            attempt, out[attempt])
    assert out["checkpoint"][0] == "InvalidArgumentError" and "outside" in out["checkpoint"][1], out["checkpoint"]
    assert not os.path.exists(os.path.join(unix_users["salus-tb"].pw_dir, "intruder.txt"))
