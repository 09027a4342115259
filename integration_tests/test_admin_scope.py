"""The admin API is scoped by tenant: a tenant sees and changes only its own jobs (ListJobs, SetJobHints,
GetTimeline) and its own figures (GetStats); admins (the server's own user, root, tenants named in --admins)
see and change every tenant's, and alone may change the policy and tenants' limits. Limits per tenant (the
tenants file's LIMIT=VALUE fields, `ctl limits`): max-jobs refuses one job more, max-priority lowers a higher
hint and the job's row says so, weight shows in the stats. Tokens issued at run time: limits, revocation,
expiry, binding to a user, and memory reservations held for the token's jobs (the servers have 64 MiB).

Token tenants (bot1, bot2 with limits, and boss, named in --admins) and this process's own user (root in CI:
an admin) talk to one server per isolation mode with raw gRPC and `ctl`. Costs about 20 s: two servers, no
TensorFlow client process (TensorFlow is imported here only to build a small graph).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import subprocess
import time
from pathlib import Path

import grpc
import pytest
import tensorflow as tf

import salus_wire as wire
from conftest import SalusProcess, child_env, venv_python, wait_until
from server_ctl import ctl, ctl_json

ADMIN = "/salus.v1.Admin/"
TOKENS = {"bot1": "tok-scope-bot1", "bot2": "tok-scope-bot2", "boss": "tok-scope-boss"}
LIMITS = {"bot2": "max-jobs=2 max-priority=1"}


@pytest.fixture(scope="module", params=["tenant", "none"])
def server(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(f"scope-{request.param}")
    tenants = directory / "tenants"
    tenants.write_text("".join(f"{name} {hashlib.sha256(token.encode()).hexdigest()} - {LIMITS.get(name, '')}\n"
                               for name, token in TOKENS.items()))
    s = SalusProcess(directory / "salus-server.stderr.log",
                     ("--tenants-file", str(tenants), "--admins", "boss", "--isolation", request.param,
                      "--memory-capacity", "64MiB", "--admission-timeout", "2s"))
    yield s
    assert s.stop() == 0, s.stderr_tail()


def channel(address: str, tenant: str | None) -> grpc.Channel:
    options = [("grpc.primary_user_agent", f"salus1.{TOKENS[tenant]}")] if tenant else []
    return grpc.insecure_channel(address, options=options)


def graph_bytes() -> bytes:
    g = tf.Graph()
    with g.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [None], name="a")
        c = tf.add(a * 2.0, 1.0, name="c")
        tf.identity(c, name="salus_main_iter")  # fetched: a main iteration, which memory admission gates
    return g.as_graph_def().SerializeToString()


def session_config(name: str) -> bytes:
    config = tf.compat.v1.ConfigProto()
    config.experimental.session_metadata.name = name
    return config.SerializeToString()


def open_session(ch: grpc.Channel, name: str = "", fetch: str = "c:0") -> str:
    request = wire.create_session_request(graph_bytes(), session_config(name) if name else b"")
    handle = wire.first(wire.call(ch, "CreateSession", request), 1).decode()
    feed = wire.tensor_proto(wire.DT_FLOAT, [2], float_val=[1.0, 2.0])
    for _ in range(3):
        request = wire.run_step_request(handle, feeds=[("a:0", feed)], fetches=[fetch], store_errors=False)
        wire.call(ch, "RunStep", request)
    return handle


def open_main(ch: grpc.Channel, name: str) -> str:
    """A session whose runs are main iterations: each asks memory admission for the `name`'s hints first."""
    return open_session(ch, name, "salus_main_iter:0")


def jobs(ch: grpc.Channel) -> list[dict]:
    rows = []
    for row in wire.fields(wire.call(ch, ADMIN + "ListJobs", b""), 1):
        rows.append({"id": wire.first(row, 1, 0), "handle": wire.first(row, 2, b"").decode(),
                     "tenant": wire.first(row, 31, b"").decode()})
    return rows


def timeline_jobs(ch: grpc.Channel) -> set[int]:
    spans = wire.fields(wire.call(ch, ADMIN + "GetTimeline", b""), 5)
    return {wire.first(span, 1, 0) for span in spans}


def set_priority(ch: grpc.Channel, job: str, priority: int) -> bytes:
    hints = wire.f_varint(1, priority & 0xFFFFFFFFFFFFFFFF)
    return wire.call(ch, ADMIN + "SetJobHints", wire.f_bytes(1, job) + wire.f_bytes(2, hints))


def test_tenants_see_and_change_only_their_own_jobs(server):
    own = {name: channel(server.address, name) for name in TOKENS}
    me = channel(server.address, None)  # this process's user: root in CI, the server's own user otherwise
    try:
        h1, h2 = open_session(own["bot1"]), open_session(own["bot2"])
        mine1, mine2 = jobs(own["bot1"]), jobs(own["bot2"])
        assert [r["handle"] for r in mine1] == [h1] and mine1[0]["tenant"] == "bot1", mine1
        assert [r["handle"] for r in mine2] == [h2] and mine2[0]["tenant"] == "bot2", mine2
        id1, id2 = mine1[0]["id"], mine2[0]["id"]
        for admin in (me, own["boss"]):
            everyone = {r["handle"]: r["tenant"] for r in jobs(admin)}
            assert everyone == {h1: "bot1", h2: "bot2"}, everyone

        # Another tenant's job is no job of yours, by id, handle or name; your own is yours to change.
        for key in (str(id1), h1):
            with pytest.raises(grpc.RpcError) as refused:
                set_priority(own["bot2"], key, 5)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "no job of yours" in refused.value.details(), refused.value.details()
        assert wire.first(set_priority(own["bot2"], str(id2), 3), 2, b"").decode() == h2
        assert wire.first(set_priority(own["boss"], str(id1), -2), 2, b"").decode() == h1

        # Timelines: a tenant's own spans only; an admin's, everyone's.
        assert timeline_jobs(own["bot1"]) == {id1}
        assert timeline_jobs(own["bot2"]) == {id2}
        assert {id1, id2} <= timeline_jobs(own["boss"])

        # The policy is the admins'.
        with pytest.raises(grpc.RpcError) as refused:
            wire.call(own["bot1"], ADMIN + "SetPolicy", wire.f_bytes(1, "fifo"))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "admin" in refused.value.details() and "bot1" in refused.value.details(), refused.value.details()
        previous = wire.first(wire.call(own["boss"], ADMIN + "SetPolicy", wire.f_bytes(1, "fifo")), 1).decode()
        wire.call(me, ADMIN + "SetPolicy", wire.f_bytes(1, previous))

        for name, handle in (("bot1", h1), ("bot2", h2)):
            wire.call(own[name], "CloseSession", wire.close_session_request(handle))
    finally:
        for ch in [*own.values(), me]:
            ch.close()



def test_ctl_and_the_python_client_carry_a_token(server):
    """`ctl --token` / SALUS_TOKEN and the Python admin client identify by token, not by this process's user
    (root, an admin): a tenant's token sees only its jobs and may not issue tokens; an admin token may."""
    bot1 = channel(server.address, "bot1")
    handle = open_session(bot1, "carried")
    try:
        rows = ctl_json(server.address, "--token", TOKENS["bot1"], "jobs")["jobs"]
        assert rows and {r["tenant"] for r in rows} == {"bot1"}, rows
        refused = ctl(server.address, "--token", TOKENS["bot1"], "token", "list", check=False)
        assert refused.returncode != 0 and "needs an admin" in refused.stderr, refused.stderr
        assert ctl(server.address, "--token", TOKENS["boss"], "token", "list").returncode == 0
        bad = ctl(server.address, "--token", "two words", "jobs", check=False)
        assert bad.returncode != 0 and "token" in bad.stderr and "two words" not in bad.stderr, bad.stderr

        env = {k: v for k, v in child_env().items() if not k.startswith("SALUS_")}
        salus = str(Path(venv_python()).parent / "salus")
        listed = subprocess.run([salus, "jobs", "--json"], capture_output=True, text=True, timeout=60,
                                env={**env, "SALUS_SERVER": server.address, "SALUS_TOKEN": TOKENS["bot1"]})
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)["jobs"]
        assert rows and {(r["tenant"], r["uid"]) for r in rows} == {("bot1", None)}, rows
    finally:
        wire.call(bot1, "CloseSession", wire.close_session_request(handle))
        bot1.close()


def stats_tenants(ch: grpc.Channel) -> list[str]:
    """The tenant names of GetStats' per-tenant rows the caller sees."""
    return [wire.first(row, 1, b"").decode() for row in wire.fields(wire.call(ch, ADMIN + "GetStats", b""), 13)]


def test_limits_cap_jobs_and_priority_and_admins_change_them(server):
    own = {name: channel(server.address, name) for name in TOKENS}
    opened: list[tuple[str, str]] = []
    try:
        # max-jobs=2: the third is refused with the limit named, before anything is built; another tenant is not.
        opened += [("bot2", open_session(own["bot2"], "capped?priority=9")), ("bot2", open_session(own["bot2"]))]
        with pytest.raises(grpc.RpcError) as refused:
            open_session(own["bot2"])
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = refused.value.details()
        assert "bot2" in details and "2 open jobs" in details and "max-jobs=2" in details, details
        opened.append(("bot1", open_session(own["bot1"], "free?priority=9")))

        # max-priority=1: the hint asked is lowered, and the row says so; bot1 has no limit.
        rows = {row["name"].split("?")[0]: row for row in ctl_json(server.address, "jobs")["jobs"]}
        assert rows["capped"]["priority"] == 1, rows["capped"]
        assert "priority 9 asked, lowered to 1" in rows["capped"]["note"], rows["capped"]
        assert rows["free"]["priority"] == 9 and "lowered" not in rows["free"]["note"], rows["free"]
        set_priority(own["bot2"], "capped", 5)
        rows = {row["name"].split("?")[0]: row for row in ctl_json(server.address, "jobs")["jobs"]}
        assert rows["capped"]["priority"] == 1 and "priority 5 asked" in rows["capped"]["note"], rows["capped"]

        # Per-tenant figures: a tenant sees its own row, an admin everyone's, with limits and weights.
        assert stats_tenants(own["bot1"]) == ["bot1"]
        assert sorted(stats_tenants(own["boss"])) == ["bot1", "bot2"]
        by_tenant = {t["tenant"]: t for t in ctl_json(server.address, "stats")["tenants"]}
        assert by_tenant["bot2"]["max_jobs"] == 2 and by_tenant["bot2"]["jobs"] == 2, by_tenant
        assert by_tenant["bot2"]["refusals"] == 1 and by_tenant["bot1"]["refusals"] == 0, by_tenant
        assert by_tenant["bot1"]["weight"] == 1 and by_tenant["bot1"]["max_jobs"] is None, by_tenant

        # Limits are the admins' to change; a change applies to the next job and at once to weights.
        limits_request = wire.f_bytes(1, "bot2") + wire.f_bytes(2, wire.f_varint(2, 3))
        with pytest.raises(grpc.RpcError) as refused:
            wire.call(own["bot2"], ADMIN + "SetTenantLimits", limits_request)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
        wire.call(own["boss"], ADMIN + "SetTenantLimits", limits_request)
        printed = ctl(server.address, "limits", "bot2", "--weight", "3").stdout
        assert printed == "limits of bot2: weight=3 max-jobs=3 max-priority=1\n", printed
        bad = ctl(server.address, "limits", "bot2", "--weight", "0", check=False)
        assert bad.returncode != 0 and "1 to 1000" in bad.stderr, bad.stderr
        opened.append(("bot2", open_session(own["bot2"])))
        by_tenant = {t["tenant"]: t for t in ctl_json(server.address, "stats")["tenants"]}
        assert by_tenant["bot2"]["weight"] == 3 and by_tenant["bot2"]["jobs"] == 3, by_tenant
    finally:
        for name, handle in opened:
            wire.call(own[name], "CloseSession", wire.close_session_request(handle))
        for ch in own.values():
            ch.close()


def token_channel(address: str, token: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=[("grpc.primary_user_agent", f"salus1.{token}")])


def refused_code(ch: grpc.Channel) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as refused:
        open_session(ch)
    return refused.value.code(), refused.value.details()


def test_tokens_issued_at_run_time(server):
    bot1 = channel(server.address, "bot1")
    opened: list[tuple[grpc.Channel, str]] = []
    try:
        with pytest.raises(grpc.RpcError) as refused:
            wire.call(bot1, ADMIN + "IssueToken", wire.f_bytes(1, "mine"))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()

        # Issued by an admin (this process's user), printed once; the token's limits apply to its tenant.
        token = ctl(server.address, "token", "issue", "--tenant", "agent-job", "--max-priority", "2",
                    "--expires", "1h").stdout.strip()
        assert len(token) == 64, token
        agent = token_channel(server.address, token)
        opened.append((agent, open_session(agent, "placed?priority=9")))
        row = next(r for r in ctl_json(server.address, "jobs")["jobs"] if r["name"].startswith("placed"))
        assert row["tenant"] == "agent-job" and row["priority"] == 2, row
        listed = ctl_json(server.address, "token", "list")
        assert [t["tenant"] for t in listed] == ["agent-job"] and listed[0]["max_priority"] == 2, listed
        assert token not in ctl(server.address, "token", "list").stdout
        assert listed[0]["expires_unix_s"] > listed[0]["issued_unix_s"] + 3500, listed

        # Revoked: every later request the server identifies with it is refused; under --isolation tenant
        # its executor is stopped, which ends the TF1 connections already handed to it, and their jobs.
        printed = ctl(server.address, "token", "revoke", listed[0]["id"]).stdout
        assert printed == f"revoked {listed[0]['id']} (tenant agent-job)\n", printed
        isolation = wire.first(wire.call(bot1, ADMIN + "GetServerInfo", b""), 20, b"").decode()
        if isolation == "tenant":
            assert wait_until(lambda: not any(r["tenant"] == "agent-job" for r in ctl_json(server.address, "jobs")["jobs"]),
                              timeout=10, interval=0.2), ctl(server.address, "jobs").stdout
            opened.pop()
        code, details = refused_code(agent)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "nor issued and still valid" in details, details
        gone = ctl(server.address, "token", "revoke", listed[0]["id"], check=False)
        assert gone.returncode != 0 and "no issued token" in gone.stderr, gone.stderr

        # Bound to a user: accepted only from that user (this process is root, the token nobody's).
        bound = ctl(server.address, "token", "issue", "--tenant", "nobodys", "--uid", "nobody").stdout.strip()
        code, details = refused_code(token_channel(server.address, bound))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "only valid from its own user" in details, details

        # Expired: refused with the reason.
        issued = ctl_json(server.address, "token", "issue", "--tenant", "brief", "--expires", "5s")
        brief = token_channel(server.address, issued["token"])
        opened.append((brief, open_session(brief)))
        time.sleep(max(0.0, issued["expires_unix_s"] - time.time()) + 0.2)
        code, details = refused_code(brief)
        # Refused with the reason until the server's 5 s sweep forgets the token, then as unknown.
        assert code == grpc.StatusCode.UNAUTHENTICATED, details
        assert "expired" in details or "still valid" in details, details
        opened.pop()  # its session cannot be closed by it any more; the server reclaims it

        bad = ctl(server.address, "token", "issue", "--tenant", "two words", check=False)
        assert bad.returncode != 0 and "tenant name" in bad.stderr, bad.stderr
    finally:
        for ch, handle in opened:
            with contextlib.suppress(grpc.RpcError):
                wire.call(ch, "CloseSession", wire.close_session_request(handle))
        ctl(server.address, "token", "revoke", "--tenant", "nobodys", check=False)
        bot1.close()


MiB = 1 << 20


def reservations(ch: grpc.Channel) -> list[tuple[str, int]]:
    listed = wire.fields(wire.call(ch, ADMIN + "ListJobs", b""), 2)
    return [(wire.first(r, 1, b"").decode(), wire.first(r, 2, 0)) for r in listed]


def test_a_token_reserves_memory_for_its_jobs(server):
    bot1 = channel(server.address, "bot1")
    opened: list[tuple[grpc.Channel, str]] = []
    token_id = None
    try:
        issued = ctl_json(server.address, "token", "issue", "--tenant", "placed-job", "--memory", "40MiB",
                          "--expires", "1h")
        token_id = issued["id"]
        agent = token_channel(server.address, issued["token"])
        # The job and the admin see the reservation; another tenant does not.
        assert reservations(agent) == [("placed-job", 40 * MiB)]
        assert reservations(bot1) == []
        printed = ctl(server.address, "jobs").stdout
        assert "reserved for placed-job: 40 MiB (0 B claimed by its jobs" in printed, printed  # sizes in MiB/GiB
        info = wire.call(bot1, ADMIN + "GetServerInfo", b"")
        assert wire.first(info, 24, 0) == 40 * MiB and wire.first(info, 25, 0) == 40 * MiB

        # Others find 24 of the 64 MiB: 21 fit, 11 more wait and time out though 43 are free.
        opened.append((bot1, open_main(bot1, "small?persistent=20MiB&ephemeral=1MiB")))
        with pytest.raises(grpc.RpcError) as refused:
            open_main(bot1, "big?persistent=10MiB&ephemeral=1MiB")
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()

        # The token's job gets its 40.
        placed = open_main(agent, "placed?persistent=30MiB&ephemeral=10MiB")
        held = ctl(server.address, "jobs").stdout
        assert "(40 MiB claimed by its jobs" in held, held
        # --json carries what the text shows: the reservation too, tenants as bare names with their uid apart.
        listed = ctl_json(server.address, "jobs")
        assert [(r["tenant"], r["uid"], r["reserved_bytes"], r["claimed_bytes"], r["token_ids"])
                for r in listed["reservations"]] == [("placed-job", None, 40 * MiB, 40 * MiB, [token_id])], listed
        assert [j["name"].split("?")[0] for j in listed["jobs"] if (j["tenant"], j["uid"]) == ("placed-job", None)] \
            == ["placed"], listed

        # Reservations together never exceed the device.
        over = ctl(server.address, "token", "issue", "--tenant", "second", "--memory", "30MiB", check=False)
        assert over.returncode != 0 and "cannot reserve" in over.stderr, over.stderr
        # (An expired token of an earlier test may be listed until the server's sweep, every 5 s, forgets it.)
        live = [t["tenant"] for t in ctl_json(server.address, "token", "list")
                if (t.get("expires_unix_s") or float("inf")) > time.time()]
        assert live == ["placed-job"]

        # Revoked: the reservation is gone and the memory is everyone's again.
        wire.call(agent, "CloseSession", wire.close_session_request(placed))
        revoked = ctl_json(server.address, "token", "revoke", token_id)
        assert [(t["id"], t["tenant"], t["uid"]) for t in revoked] == [(token_id, "placed-job", None)], revoked
        token_id = None
        assert "reserved for" not in ctl(server.address, "jobs").stdout
        opened.append((bot1, open_main(bot1, "big?persistent=10MiB&ephemeral=1MiB")))
    finally:
        for ch, handle in opened:
            with contextlib.suppress(grpc.RpcError):
                wire.call(ch, "CloseSession", wire.close_session_request(handle))
        if token_id:
            ctl(server.address, "token", "revoke", token_id, check=False)
        bot1.close()


def token_ids(address: str) -> set[str]:
    return {t["id"] for t in ctl_json(address, "token", "list")}


def test_revoking_by_tenant_never_touches_a_token_whose_id_is_that_name(server):
    """`token revoke --tenant X` matches tenants only, `--id X` (or X alone) ids only (issue 58)."""
    victim = ctl_json(server.address, "token", "issue", "--tenant", "victim", "--expires", "1h")
    # A tenant named exactly like the victim's token id.
    namesake = ctl_json(server.address, "token", "issue", "--tenant", victim["id"], "--expires", "1h")
    try:
        revoked = ctl_json(server.address, "token", "revoke", "--tenant", victim["id"])
        assert [t["id"] for t in revoked] == [namesake["id"]], revoked
        assert victim["id"] in token_ids(server.address)
        again = ctl_json(server.address, "token", "issue", "--tenant", victim["id"], "--expires", "1h")
        revoked = ctl_json(server.address, "token", "revoke", "--id", victim["id"])
        assert [t["id"] for t in revoked] == [victim["id"]], revoked
        assert again["id"] in token_ids(server.address)
        # A bare word is an id, never a tenant's name (what an older client's request means too).
        gone = ctl(server.address, "token", "revoke", victim["id"], check=False)
        assert gone.returncode != 0 and "no issued token has id" in gone.stderr, gone.stderr
        both = ctl(server.address, "token", "revoke", "--id", "x", "--tenant", "y", check=False)
        assert both.returncode != 0, both.stdout
        ctl(server.address, "token", "revoke", "--tenant", victim["id"])
    finally:
        for token in (victim, namesake):
            ctl(server.address, "token", "revoke", "--id", token["id"], check=False)


def history_names(ch: grpc.Channel, tenant: str = "") -> list[str]:
    """ListHistory as `ch`'s tenant sees it: the identities' job names."""
    listed = wire.call(ch, ADMIN + "ListHistory", wire.f_bytes(1, tenant) if tenant else b"")
    return [wire.first(i, 2, b"").decode() for i in wire.fields(listed, 1)]


def run_and_close(ch: grpc.Channel, name: str) -> None:
    """A job of main iterations under `name`, closed: its run goes into the job history."""
    handle = open_main(ch, f"{name}?persistent=1MiB&ephemeral=1MiB")
    wire.call(ch, "CloseSession", wire.close_session_request(handle))


def test_a_token_tenant_named_like_a_user_reaches_only_its_own_history(server):
    """History is kept by tenant, not by name: a token tenant named after this process's user (root in CI) neither
    sees nor erases that user's history, and an admin tells the two apart (issue 58)."""
    my_name = pwd.getpwuid(os.geteuid()).pw_name
    me = channel(server.address, None)
    issued = ctl_json(server.address, "token", "issue", "--tenant", my_name, "--expires", "1h")
    namesake = token_channel(server.address, issued["token"])
    try:
        run_and_close(me, "hist-user-job")
        assert wait_until(lambda: any(i["name"].startswith("hist-user-job")
                                      for i in ctl_json(server.address, "history", "--tenant", f"user:{my_name}")["identities"]),
                          timeout=20, interval=0.2), ctl(server.address, "history").stdout
        # The token tenant of the same name sees none of it, by its name or none, and may not name the user.
        assert not any(n.startswith("hist-user-job") for n in history_names(namesake))
        assert not any(n.startswith("hist-user-job") for n in history_names(namesake, my_name))
        for other in (f"user:{my_name}", f"uid:{os.geteuid()}"):
            for call, request in (("ListHistory", other), ("EraseHistory", other)):
                with pytest.raises(grpc.RpcError) as refused:
                    wire.call(namesake, ADMIN + call, wire.f_bytes(1, request))
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
        # Erasing "its own" by the shared name erases nothing of the user's.
        erased = wire.call(namesake, ADMIN + "EraseHistory", wire.f_bytes(1, my_name))
        assert wire.first(erased, 1, 0) == 0
        kept = ctl_json(server.address, "history", "--tenant", f"user:{my_name}")["identities"]
        assert any(i["name"].startswith("hist-user-job") for i in kept), kept

        # Its own job is its own history; an admin sees both tenants apart.
        run_and_close(namesake, "hist-token-job")
        assert wait_until(lambda: any(n.startswith("hist-token-job") for n in history_names(namesake)),
                          timeout=20, interval=0.2)
        assert not any(n.startswith("hist-user-job") for n in history_names(namesake))
        listed = {i["name"].split("?")[0]: i["tenant"] for i in ctl_json(server.address, "history")["identities"]}
        assert listed.get("hist-user-job") == f"user:{my_name}", listed
        assert listed.get("hist-token-job") == f"token:{my_name}", listed
        # A bare name is both tenants: an erasure refuses it; spelled, it erases that tenant's only.
        ambiguous = ctl(server.address, "history", "erase", "--tenant", my_name, check=False)
        assert ambiguous.returncode != 0 and "name one" in ambiguous.stderr, ambiguous.stderr
        erased = ctl_json(server.address, "history", "erase", "--tenant", f"token:{my_name}")
        assert erased["erased_identities"] == 1, erased
        listed = {i["name"].split("?")[0] for i in ctl_json(server.address, "history")["identities"]}
        assert "hist-user-job" in listed and "hist-token-job" not in listed, listed
    finally:
        ctl(server.address, "token", "revoke", "--id", issued["id"], check=False)
        ctl(server.address, "history", "erase", "--tenant", f"user:{my_name}", check=False)
        namesake.close()
        me.close()


def executor_status(pid: int) -> dict[str, list[int]]:
    """The uids, gids and supplementary groups of process `pid` (/proc/PID/status)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {key: [int(v) for v in fields[key].split()] for key in ("Uid", "Gid", "Groups")}


def signal_as(uid: int, pid: int) -> subprocess.CompletedProcess:
    """`kill -0 PID` from a process of uid (and gid) `uid` and no groups: whether it may signal `pid`."""
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                           "/bin/sh", "-c", f"kill -0 {pid}"], capture_output=True, text=True, timeout=30)


def test_token_tenants_without_a_user_run_as_uids_of_their_own(server):
    """Two token tenants whose user is `-` (bot1, bot2) have executors of distinct uids from --tenant-uid-range
    (gid the same, no groups), and neither uid may signal the other's executor (issue 58)."""
    if ctl_json(server.address, "info")["isolation"] != "tenant":
        pytest.skip("no executor processes under --isolation none")
    if os.geteuid() != 0:
        pytest.skip("executors switch users only when the server runs as root")
    own = {name: channel(server.address, name) for name in ("bot1", "bot2")}
    handles = {}
    try:
        handles = {name: open_session(ch) for name, ch in own.items()}
        pids = {e["tenant"]: e["pid"] for e in ctl_json(server.address, "info")["executors"]}
        assert {"bot1", "bot2"} <= set(pids), pids
        status = {name: executor_status(pids[name]) for name in ("bot1", "bot2")}
        uids = {name: s["Uid"][0] for name, s in status.items()}
        assert uids["bot1"] != uids["bot2"], status
        for name, s in status.items():
            uid = uids[name]
            assert s["Uid"] == [uid] * 4 and s["Gid"] == [uid] * 4 and s["Groups"] == [], (name, s)
            assert 1879048192 <= uid <= 1879113727, (name, uid)  # the default --tenant-uid-range
        # bot1's uid may signal its own executor, not bot2's (EPERM), and the other way round.
        assert signal_as(uids["bot1"], pids["bot1"]).returncode == 0
        for a, b in (("bot1", "bot2"), ("bot2", "bot1")):
            refused = signal_as(uids[a], pids[b])
            assert refused.returncode != 0 and "not permitted" in refused.stderr, (a, b, refused.stderr)
        # The uids are kept in the state directory, 0600.
        state = server.log_path.with_name(server.log_path.name + ".state") / "tenant-uids.json"
        assert state.stat().st_mode & 0o777 == 0o600
        kept = json.loads(state.read_text())["data"]["uids"]
        assert kept["name:bot1"] == uids["bot1"] and kept["name:bot2"] == uids["bot2"], kept
    finally:
        for name, handle in handles.items():
            with contextlib.suppress(grpc.RpcError):
                wire.call(own[name], "CloseSession", wire.close_session_request(handle))
        for ch in own.values():
            ch.close()
