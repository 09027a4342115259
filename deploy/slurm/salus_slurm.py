#!/usr/bin/env python3
"""Slurm places jobs onto per-node Salus servers by device memory (count-only GRES `salusmem`, in MiB).

Python 3 standard library only; runs with the system python3 on every node. Subcommands:

  config       asks each node's salus-server its capacity and writes gres.conf, the slurm.conf lines, the
               node -> server map and the prolog/epilog/task-prolog wrappers into a directory
  prolog       Slurm Prolog (PrologFlags=Alloc, as root): issues a token bound to the job's user that
               reserves the job's salusmem on this node's server, and records it for the job
  task-prolog  Slurm TaskProlog (as the job's user, per task): prints `export SALUS_SERVER=...` and
               `export SALUS_TOKEN=...` for the task's environment
  epilog       Slurm Epilog (as root): revokes the job's token (its reservation is released) and removes
               the job's files; idempotent

A job asks for device memory with `sbatch --gres=salusmem:4096 job.sh` (MiB on each node) and, optionally,
a scheduling priority with `--comment salus-priority=N` (see deploy/slurm/README.md).

Exit codes of prolog/epilog: 0 done (or nothing to do); 1 the node cannot serve the job's salusmem (its
server cannot be reached, refuses the reservation, or the node is missing from the map). Slurm drains a
node whose Prolog or Epilog fails and requeues the job, which is what a node whose Salus is unusable needs.
A server that refuses only because tokens issued outside Slurm (Ray, Kubernetes, an admin) hold the memory makes
the prolog wait for it (--room-wait, 300 s by default, said in the job's AdminComment) before it fails so.
A job that asks no salusmem is left alone by every hook: nothing printed, nothing reserved, exit 0.

Where a failure is said (never a bare exit status):
  prolog, epilog  stderr, which slurmd writes to its log when the hook fails, and the job's AdminComment
                  (`scontrol show job`), since the job has no output yet (cleared when a later prolog succeeds)
  task-prolog     the job's output (`print` lines, via its wrapper) and syslog; slurmd's log shows only the status

The TaskProlog runs as the job's user: config refuses an interpreter (--python) or a directory that other users
cannot run or pass through (all hooks need only the Python standard library; /usr/bin/python3 will do).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRES_NAME = "salusmem"
DEFAULT_STATE_DIR = "/run/salus-slurm"
DEFAULT_EXPIRY_MARGIN_S = 600
PRIORITY_RE = re.compile(r"(?:^|[\s,;])salus-priority=(-?\d+)(?=$|[\s,;])")
# A token's tenant name: letters, digits, - _ . @ (the server's rule).
TENANT_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.@-]")
CTL_TIMEOUT_S = 30
CONNECT_RETRIES = 3  # a server restarting answers within a few seconds
CONNECT_RETRY_PAUSE_S = 2.0
# A server that refuses the reservation because tokens issued elsewhere (Ray, Kubernetes, an admin) hold its
# memory: the prolog waits this long for them to release it, asking again every ROOM_POLL_S.
DEFAULT_ROOM_WAIT_S = 300
ROOM_POLL_S = 2.0
# The server's refusal of a reservation that does not fit beside the others (runtime/admission.rs).
NO_ROOM_RE = re.compile(r"cannot reserve (\d+) bytes: the device has (\d+) and other tenants reserve (\d+)")


class Failure(Exception):
    """This node cannot serve the job's salusmem: the hook exits 1 (Slurm drains the node, requeues the job)."""


def log(msg: str) -> None:
    print(f"salus_slurm: {msg}", file=sys.stderr, flush=True)


# --- talking to the node's salus-server -------------------------------------------------------------------

def cli_command(salus_server: str) -> list[str]:
    """The `salus` CLI beside the salus-server binary (cargo and the release wheel install both together), else
    the deprecated `salus-server ctl`, which runs the same commands."""
    cli = os.path.join(os.path.dirname(os.path.abspath(salus_server)), "salus")
    return [cli] if os.access(cli, os.X_OK) else [salus_server, "ctl"]


def ctl(salus_server: str, address: str, *args: str) -> subprocess.CompletedProcess:
    """`salus --server ADDRESS ARGS`, retried while the server cannot be connected to."""
    cmd = [*cli_command(salus_server), "--server", address, *args]
    for attempt in range(CONNECT_RETRIES):
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CTL_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise Failure(f"{salus_server} not found (config --salus-server)") from None
        except subprocess.TimeoutExpired:
            proc = subprocess.CompletedProcess(cmd, 124, "", f"no answer within {CTL_TIMEOUT_S}s")
        if proc.returncode == 0 or not unreachable(proc):
            return proc
        if attempt + 1 < CONNECT_RETRIES:
            time.sleep(CONNECT_RETRY_PAUSE_S)
    return proc


def unreachable(proc: subprocess.CompletedProcess) -> bool:
    # 3: the CLI's "unreachable" exit status (docs/src/reference/exit-codes.md); 124: our timeout.
    return proc.returncode in (3, 124) or "cannot connect" in proc.stderr or "cannot reach" in proc.stderr


def ctl_error(proc: subprocess.CompletedProcess) -> str:
    return (proc.stderr.strip() or proc.stdout.strip() or f"exit code {proc.returncode}").splitlines()[-1]


def capacity_mib(salus_server: str, address: str) -> dict:
    proc = ctl(salus_server, address, "capacity", "--json")
    if proc.returncode != 0:
        raise Failure(f"salus-server at {address}: {ctl_error(proc)}")
    return json.loads(proc.stdout)


# --- config -----------------------------------------------------------------------------------------------

def parse_node(spec: str) -> tuple[str, str]:
    name, sep, address = spec.partition("=")
    if not sep or not name or ":" not in address:
        raise argparse.ArgumentTypeError(f"--node wants NAME=HOST:PORT, got {spec!r}")
    return name, address


def parse_capacity(spec: str) -> tuple[str, int]:
    name, sep, mib = spec.partition("=")
    if not sep or not name or not mib.isdigit() or int(mib) <= 0:
        raise argparse.ArgumentTypeError(f"--capacity wants NAME=MiB, got {spec!r}")
    return name, int(mib)


def read_nodes(path: Path) -> dict[str, str]:
    """The node -> server map written by `config`: `NAME HOST:PORT` lines, `#` comments."""
    nodes = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, address = line.split()
            nodes[name] = address
    return nodes


# A hook's wrapper runs the hook with its stderr captured, so that a failure says why where someone will look: the
# interpreter that cannot be run (sh's "Permission denied"), the script that cannot be read (python's "can't open
# file"), the hook's own message. Without it Slurm logs only "TaskProlog failed status=2". The captured lines go to
# the wrapper's stderr (slurmd's log: it logs a failed Prolog/Epilog's output, and slurmstepd's TaskProlog stderr)
# and, for the TaskProlog, also as `print` lines, which slurmstepd writes to the job's output.
WRAPPER = """#!/bin/sh
# Slurm {role} for Salus, generated by salus_slurm.py config (deploy/slurm/README.md).
# Runs as {runs_as}: the interpreter and the script must be {readable_by}.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
export PATH
{slurm_conf}# fd 3 carries the hook's stdout past the capture of its stderr (the TaskProlog's export lines).
exec 3>&1
err=$({python} {script} {command} {args} 2>&1 1>&3 3>&-)
status=$?
exec 3>&-
if [ "$status" -ne 0 ] && [ -z "$err" ]; then
    err="salus_slurm: {command}: {python} {script} exited with status $status and said nothing"
fi
if [ "$status" -ne 0 ]; then
    err="$err
salus_slurm: {command} failed (exit $status) on ${{SLURMD_NODENAME:-$(hostname)}} for job $SLURM_JOB_ID"
    # 126/127: sh could not run the interpreter; 2: python could not open the script.
    case "$status" in 2|126|127) err="$err; {remedy}" ;; esac
fi
if [ -n "$err" ]; then
    printf '%s\\n' "$err" >&2
{to_job}fi
exit "$status"
"""
# slurmstepd writes a TaskProlog's `print TEXT` lines to the job's standard output and drops its stderr (Slurm
# 22.05, measured); a hook running as the user cannot write slurmd's log, so the admin's copy goes to syslog.
TASK_PROLOG_TO_JOB = """    printf '%s\\n' "$err" | sed 's/^/print /'
    printf '%s\\n' "$err" | logger -t salus_slurm -p user.err 2>/dev/null || true
"""
# Said after exit 126, 127 or 2, which mostly mean that, though a usage error also exits 2 (its message precedes).
ROOT_REMEDY = "if the interpreter or salus_slurm.py could not be run: check salus_slurm.py config --python"
USER_REMEDY = ("if the interpreter or salus_slurm.py could not be run: both must be runnable by every user "
               "(salus_slurm.py config --python, deploy/slurm/README.md)")


# --- who can run the hooks --------------------------------------------------------------------------------

def not_usable_by_others(path: Path, need: str) -> str | None:
    """Why a user other than the owner (`other` permission bits, as the job's user is) cannot use `path`, or None.
    `need`: "x" to run it, "r" to read it, "rx" both. Every directory from / down to it needs o+x; a symlink is
    checked along its own path and again along its target's."""
    seen = set()
    todo = [Path(os.path.abspath(path))]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for d in reversed(p.parents):
            try:
                st = os.stat(d)
            except OSError as e:
                return f"{d}: {e.strerror}"
            if not st.st_mode & 0o001:
                return f"directory {d} is mode {st.st_mode & 0o777:o}: other users cannot pass through it"
        try:
            st = os.stat(p)
        except OSError as e:
            return f"{p}: {e.strerror}"
        bits = {"r": 0o004, "x": 0o001}
        missing = [c for c in need if not st.st_mode & bits[c]]
        if missing:
            what = {"r": "read", "x": "run"}
            return (f"{p} is mode {st.st_mode & 0o777:o}: other users cannot "
                    + " or ".join(what[c] for c in missing) + " it")
        if p.is_symlink() or os.path.realpath(p) != str(p):
            todo.append(Path(os.path.realpath(p)))
    return None


def check_as_user(user: str, wrapper: Path) -> str | None:
    """Runs the TaskProlog wrapper as `user` outside any job (it prints nothing and exits 0 there); why it failed,
    or None. Catches what mode bits cannot show: ACLs, SELinux, a noexec mount, a missing library."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return f"--check-as-user {user}: no such user"
    env = {"PATH": "/usr/bin:/bin", "HOME": "/", "USER": user, "LOGNAME": user}
    try:
        proc = subprocess.run([str(wrapper)], user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], env=env,
                              cwd="/", capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except PermissionError as e:
        return f"as {user}: {e}"
    except OSError as e:  # switching users needs root
        return f"cannot run {wrapper} as {user}: {e}"
    if proc.returncode != 0:
        return f"as {user}, {wrapper} exited with {proc.returncode}: {proc.stderr.strip()}"
    return None


def default_python() -> str:
    """The system python3 (every user can normally run it; the hooks need only the standard library), else this
    one."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return sys.executable or "/usr/bin/python3"


def user_hook_problems(python: str, out: Path, install: Path, state_dir: str) -> list[str]:
    """What keeps a job's user from running the TaskProlog, as far as this host can tell (the interpreter must exist
    here under the same path; the directory is checked where it is written, and where it will be installed if
    that is here)."""
    problems = []
    if not Path(python).is_absolute():
        problems.append(f"--python {python} is not an absolute path (Slurm's hooks run with no search path)")
    elif not os.path.exists(python):
        problems.append(f"--python {python} does not exist on this host (give the path it has on the nodes, "
                        "and install it there for every user)")
    else:
        why = not_usable_by_others(Path(python), "x")
        if why:
            problems.append(f"--python {python}: {why}")
    # The wrappers and the script are written 0755; the directories above them must let users through. The
    # install directory can only be checked if it is on this host.
    for place in dict.fromkeys([out, install]):
        if place == out or place.exists():
            why = not_usable_by_others(place, "x")
            if why:
                problems.append(f"the hooks' directory: {why}")
    # The task-prolog opens its job's file by name in the state directory (made 0711 by the prolog).
    existing = Path(state_dir)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    why = not_usable_by_others(existing, "x")
    if why:
        problems.append(f"--state-dir {state_dir}: {why}")
    return problems


def cmd_config(a) -> int:
    out = Path(a.out).resolve()
    install = Path(a.install_dir).resolve() if a.install_dir else out
    salus_server = a.salus_server or shutil.which("salus-server")
    if not salus_server:
        log("salus-server is not on PATH: give --salus-server PATH (where it is on the nodes)")
        return 2
    salus_server = str(Path(salus_server).resolve())
    nodes = dict(a.node)
    given = dict(a.capacity or [])
    unknown = sorted(set(given) - set(nodes))
    if unknown:
        log(f"--capacity for {', '.join(unknown)}, which no --node names")
        return 2
    counts = {}
    for name, address in nodes.items():
        if name in given:
            counts[name] = given[name]
            continue
        try:
            cap = capacity_mib(salus_server, address)
        except Failure as e:
            log(f"node {name}: {e} (start it with --memory-capacity SIZE)")
            return 1
        counts[name] = int(cap["capacity_mib"])
        if cap.get("reserved_bytes"):
            log(f"node {name}: {cap['reserved_bytes']} bytes of {address} are already reserved by tokens not "
                f"issued by Slurm; Slurm will count all {counts[name]} MiB as its own")
    out.mkdir(parents=True, exist_ok=True)
    python = a.python or default_python()
    # The TaskProlog runs as the job's user: an interpreter or script that user cannot run fails every job
    # with salusmem or without. Refused here, where the admin is, rather than found by users.
    problems = user_hook_problems(python, out, install, a.state_dir)
    if problems:
        for problem in problems:
            log(f"the TaskProlog runs as each job's user, who cannot use it: {problem}")
        log("give --python with an interpreter every user can run (e.g. --python /usr/bin/python3; the hooks "
            "need only the standard library), and --out/--install-dir in directories every user can pass "
            "through (mode o+x)")
        return 2
    header = f"# Generated by salus_slurm.py config from {', '.join(f'{n}={a}' for n, a in nodes.items())}\n"

    gres = header + "".join(f"NodeName={n} Name={GRES_NAME} Count={c} Flags=CountOnly\n" for n, c in counts.items())
    (out / "gres.conf").write_text(gres)

    (out / "nodes").write_text(header + "# node name -> its salus-server (read by the prolog)\n"
                               + "".join(f"{n} {nodes[n]}\n" for n in nodes))

    script = install / "salus_slurm.py"
    if Path(__file__).resolve() != (out / "salus_slurm.py").resolve():
        shutil.copyfile(__file__, out / "salus_slurm.py")
    os.chmod(out / "salus_slurm.py", 0o755)
    slurm_conf = f"SLURM_CONF={shlex.quote(a.slurm_conf)}\nexport SLURM_CONF\n" if a.slurm_conf else ""
    common = ["--state-dir", a.state_dir]
    root_args = [*common, "--nodes", str(install / "nodes"), "--salus-server", salus_server,
                 "--expiry-margin", str(a.expiry_margin), "--room-wait", str(a.room_wait)]
    if a.max_priority is not None:
        root_args += ["--max-priority", str(a.max_priority)]
    for role, command, args in (("Prolog", "prolog", root_args), ("Epilog", "epilog", root_args),
                                ("TaskProlog", "task-prolog", common)):
        path = out / command
        as_user = command == "task-prolog"
        path.write_text(WRAPPER.format(
            role=role, runs_as="the job's user" if as_user else "root (slurmd)",
            readable_by="readable and runnable by every user" if as_user else "runnable by root",
            slurm_conf=slurm_conf, python=shlex.quote(python), script=shlex.quote(str(script)),
            command=command, args=" ".join(shlex.quote(x) for x in args),
            remedy=USER_REMEDY if as_user else ROOT_REMEDY, to_job=TASK_PROLOG_TO_JOB if as_user else ""))
        os.chmod(path, 0o755)
    if a.check_as_user:
        if install != out:
            log(f"--check-as-user runs {out / 'task-prolog'}, which calls {install}: "
                "use it where the directory is installed (--install-dir = --out)")
            return 2
        why = check_as_user(a.check_as_user, out / "task-prolog")
        if why:
            log(f"the TaskProlog cannot run as a job's user: {why}")
            return 2

    conf = [header.rstrip("\n"),
            "# Lines to add to slurm.conf (merge PrologFlags/SchedulerParameters with values you already have).",
            f"GresTypes={GRES_NAME}",
            "PrologFlags=Alloc",
            f"Prolog={install / 'prolog'}",
            f"Epilog={install / 'epilog'}",
            f"TaskProlog={install / 'task-prolog'}",
            "# Optional: a job whose prolog failed (its node's Salus unusable) is requeued pending, not held.",
            "#SchedulerParameters=nohold_on_prolog_fail",
            "# Add Gres= to each node's NodeName line:"]
    conf += [f"#NodeName={n} Gres={GRES_NAME}:{c}" for n, c in counts.items()]
    (out / "slurm.conf.salus").write_text("\n".join(conf) + "\n")

    print(f"wrote {out}:")
    print(f"  gres.conf         salusmem per node ({', '.join(f'{n}: {c} MiB' for n, c in counts.items())}); "
          f"append to gres.conf next to slurm.conf on every node and the controller")
    print("  slurm.conf.salus  lines to add to slurm.conf, and Gres=salusmem:MiB for each NodeName line")
    print("  nodes             node name -> salus-server address, read by the prolog")
    print("  prolog, epilog, task-prolog, salus_slurm.py")
    print(f"                    copy the directory to {install} on every node (the paths are baked in), then")
    print("                    restart slurmctld and every slurmd (a new GresTypes and node Gres need a restart)")
    print(f"users: sbatch --gres={GRES_NAME}:MiB job.sh  [--comment salus-priority=N]")
    return 0


# --- the job's files --------------------------------------------------------------------------------------

def job_files(state_dir: str, job_id: str) -> tuple[Path, Path]:
    """(the user's file: what its tasks export; root's record: which token to revoke). The user owns its file
    and could rewrite it, so the epilog trusts only root's record."""
    if not job_id.isdigit():
        raise Failure(f"SLURM_JOB_ID {job_id!r} is not a job id")
    d = Path(state_dir)
    return d / f"job-{job_id}.env", d / f"job-{job_id}.root"


def write_file(path: Path, text: str, uid: int, gid: int) -> None:
    """Atomically: mode 0600, owned by uid:gid."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.chown(tmp, uid, gid)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_vars(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


# --- reading the job from Slurm ---------------------------------------------------------------------------

def scontrol_job(job_id: str) -> str:
    """`scontrol show job -d ID`, retried a few times (a busy slurmctld may time out)."""
    for attempt in range(CONNECT_RETRIES):
        proc = subprocess.run(["scontrol", "show", "job", "-d", job_id], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        if proc.returncode == 0:
            return proc.stdout
        if attempt + 1 < CONNECT_RETRIES:
            time.sleep(CONNECT_RETRY_PAUSE_S)
    raise Failure(f"scontrol show job -d {job_id}: {ctl_error(proc)}")


def expand_hostlist(hostlist: str) -> list[str]:
    if not any(c in hostlist for c in "[,"):
        return [hostlist]
    proc = subprocess.run(["scontrol", "show", "hostnames", hostlist], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise Failure(f"scontrol show hostnames {hostlist}: {ctl_error(proc)}")
    return proc.stdout.split()


# `salusmem:1536`, `salusmem:2K` (Slurm prints counts divisible by 1024 with K, M, G ...: 2K = 2048),
# `salusmem(CNT:2048)`, with an optional type (`salusmem:TYPE:...`).
GRES_COUNT_RE = re.compile(GRES_NAME + r"(?::[^:(,\s]+)?(?::|\(CNT:)(\d+)([KMGTP]?)(?=$|[(),\s])")
SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def node_salusmem(job_text: str, node: str) -> int:
    """MiB of salusmem the job holds on `node`: its per-node line `Nodes=n1 CPU_IDs=0 Mem=0 GRES=salusmem:4096`
    (count-only GRES are not in the job's environment)."""
    for line in job_text.splitlines():
        m = re.match(r"\s*Nodes=(\S+)\s.*\bGRES=(\S+)", line)
        if m and node in expand_hostlist(m.group(1)):
            for item in m.group(2).split(","):
                if item.startswith(GRES_NAME):
                    c = GRES_COUNT_RE.match(item)
                    if c:
                        return int(c.group(1)) * SUFFIX[c.group(2)]
    return 0


def job_field(job_text: str, key: str) -> str | None:
    m = re.search(rf"(?:^|\s){key}=(.*?)(?=\s+\w+=|\s*$)", job_text, re.M)
    return m.group(1) if m else None


def time_limit_s(text: str | None) -> int | None:
    """Slurm's TimeLimit ([D-]HH:MM:SS, MM:SS, UNLIMITED) in seconds; None for no limit."""
    if not text or text in ("UNLIMITED", "Partition_Limit", "NONE"):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts[-3:]
    return (int(days) if days else 0) * 86400 + h * 3600 + m * 60 + s


def asked_priority(comment: str | None) -> int | None:
    """`--comment salus-priority=N` (anywhere in the comment); anything else is not a priority."""
    m = PRIORITY_RE.search(comment or "")
    return int(m.group(1)) if m else None


# --- prolog / task-prolog / epilog ------------------------------------------------------------------------

def revoke(salus_server: str, address: str, token_id: str) -> None:
    proc = ctl(salus_server, address, "token", "revoke", token_id)
    if proc.returncode == 0 or "no issued token" in proc.stderr:  # already revoked, expired, or server restarted
        return
    raise Failure(f"cannot revoke token {token_id} on {address}: {ctl_error(proc)}")


# The job's AdminComment is where a root hook's failure reaches the job's user: `scontrol show job` shows it, while
# a Prolog's output reaches only slurmd's log and the job, requeued and held, has not started to have an output.
ADMIN_COMMENT_PREFIX = "salus_slurm"


def tell_job(job_id: str, text: str) -> None:
    """Sets the job's AdminComment (best effort: the failure it reports is already in slurmd's log)."""
    if not job_id.isdigit():
        return
    try:
        proc = subprocess.run(["scontrol", "update", f"JobId={job_id}", f"AdminComment={text}"],
                              capture_output=True, text=True, timeout=CTL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        log(f"cannot set job {job_id}'s AdminComment: {e}")
        return
    if proc.returncode != 0:
        log(f"cannot set job {job_id}'s AdminComment: {ctl_error(proc)}")


def cmd_prolog(a) -> int:
    job_id = os.environ.get("SLURM_JOB_ID", "")
    node = os.environ.get("SLURMD_NODENAME", "")
    user_name = os.environ.get("SLURM_JOB_USER", "")
    user_file, root_file = job_files(a.state_dir, job_id)
    job_text = scontrol_job(job_id)
    mib = node_salusmem(job_text, node)
    if mib <= 0:
        return 0  # the job asked no salusmem here: nothing to set up
    nodes = read_nodes(Path(a.nodes))
    if node not in nodes:
        raise Failure(f"node {node} has salusmem in Slurm but no salus-server in {a.nodes}")
    address = nodes[node]
    uid_text = os.environ.get("SLURM_JOB_UID")
    entry = pwd.getpwuid(int(uid_text)) if uid_text else pwd.getpwnam(user_name)
    # A record of this job already (prolog re-run after a requeue): its token goes first.
    if root_file.exists():
        old = read_vars(root_file)
        if old.get("SALUS_TOKEN_ID"):
            revoke(a.salus_server, old.get("SALUS_SERVER", address), old["SALUS_TOKEN_ID"])
    args = ["token", "issue", "--tenant", TENANT_BAD_CHARS.sub("_", entry.pw_name) or f"uid{entry.pw_uid}",
            "--uid", str(entry.pw_uid), "--memory", f"{mib}MiB", "--json"]
    limit = time_limit_s(job_field(job_text, "TimeLimit"))
    if limit is not None:
        args += ["--expires", f"{limit + a.expiry_margin}s"]
    priority = asked_priority(job_field(job_text, "Comment"))
    cap = priority
    if a.max_priority is not None:
        cap = a.max_priority if priority is None else min(priority, a.max_priority)
    if cap is not None:
        args += ["--max-priority", str(cap)]
    proc, told = issue_waiting_for_room(a, address, args, job_id, node, mib)
    if proc.returncode != 0:
        raise Failure(f"job {job_id}: cannot reserve {mib} MiB for {entry.pw_name} on {address}: {ctl_error(proc)}")
    issued = json.loads(proc.stdout)
    record = f"SALUS_SERVER={address}\nSALUS_TOKEN_ID={issued['id']}\nSALUS_MEMORY_MIB={mib}\n"
    exported = f"SALUS_SERVER={address}\nSALUS_TOKEN={issued['token']}\n"
    if priority is not None:
        exported += f"SALUS_PRIORITY={cap}\n"
    try:
        Path(a.state_dir).mkdir(mode=0o711, parents=True, exist_ok=True)
        write_file(root_file, record, 0, 0)
        write_file(user_file, exported, entry.pw_uid, entry.pw_gid)
    except OSError as e:  # no token may outlive a job that cannot use it
        revoke(a.salus_server, address, issued["id"])
        root_file.unlink(missing_ok=True)
        raise Failure(f"job {job_id}: cannot write its files in {a.state_dir}: {e}") from None
    if told or (job_field(job_text, "AdminComment") or "").startswith(ADMIN_COMMENT_PREFIX):
        tell_job(job_id, "")  # an earlier run's failure, or this run's wait, now past
    log(f"job {job_id}: {mib} MiB reserved for {entry.pw_name} on {address} (token {issued['id']}"
        + (f", expires in {limit + a.expiry_margin} s" if limit is not None else ", no expiry")
        + (f", max priority {cap}" if cap is not None else "") + ")")
    return 0


def issue_waiting_for_room(a, address: str, args: list[str], job_id: str, node: str,
                           mib: int) -> tuple[subprocess.CompletedProcess, bool]:
    """`ctl token issue ARGS`; while the server refuses it only because other tokens (issued by Ray, Kubernetes or
    an admin: Slurm's count of salusmem knows nothing of them) reserve the memory, asks again every ROOM_POLL_S for
    up to --room-wait seconds, saying so in the job's AdminComment. A reservation larger than the device fails at
    once (the server's capacity is below what gres.conf says). Returns the last answer and whether the job was
    told it waits."""
    deadline = time.monotonic() + max(0, a.room_wait)
    told = False
    while True:
        proc = ctl(a.salus_server, address, *args)
        m = NO_ROOM_RE.search(proc.stderr) if proc.returncode != 0 else None
        if m is None or int(m.group(1)) > int(m.group(2)) or time.monotonic() >= deadline:
            return proc, told
        if not told:
            why = " ".join(ctl_error(proc).split())
            log(f"job {job_id}: waiting up to {a.room_wait} s for {mib} MiB on {address}: {why}")
            tell_job(job_id, f"{ADMIN_COMMENT_PREFIX} prolog on {node}: waiting up to {a.room_wait} s for "
                             f"{mib} MiB on {address}, held by tokens issued outside Slurm: {why}")
            told = True
        time.sleep(ROOM_POLL_S)


EXPORTED = ("SALUS_SERVER", "SALUS_TOKEN", "SALUS_PRIORITY")


def cmd_task_prolog(a) -> int:
    try:
        user_file, _ = job_files(a.state_dir, os.environ.get("SLURM_JOB_ID", ""))
    except Failure:
        return 0  # not in a job (config --check-as-user runs it so): nothing to export
    try:
        values = read_vars(user_file)
    except FileNotFoundError:
        return 0  # no salusmem on this node: the task runs without Salus, untouched
    except OSError as e:
        # The prolog reserved memory for this job but its task cannot read the settings: running it without
        # them would put it on the device outside Salus's accounting, so the task fails, saying why.
        raise Failure(f"cannot read this job's Salus settings: {e} (the state directory's modes, "
                      "deploy/slurm/README.md)") from None
    for key in EXPORTED:
        if values.get(key):
            print(f"export {key}={values[key]}")
    return 0


def cmd_epilog(a) -> int:
    user_file, root_file = job_files(a.state_dir, os.environ.get("SLURM_JOB_ID", ""))
    try:
        record = read_vars(root_file)
    except FileNotFoundError:
        user_file.unlink(missing_ok=True)
        return 0  # nothing issued for this job here, or already revoked
    try:
        if record.get("SALUS_TOKEN_ID"):
            revoke(a.salus_server, record["SALUS_SERVER"], record["SALUS_TOKEN_ID"])
    finally:
        user_file.unlink(missing_ok=True)
        root_file.unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="salus_slurm.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("config", help="write gres.conf, slurm.conf lines, node map and wrappers")
    c.add_argument("--node", action="append", type=parse_node, required=True, metavar="NAME=HOST:PORT",
                   help="a Slurm node and the address of its salus-server (started with --memory-capacity) "
                        "that the prolog and the node's jobs use, normally 127.0.0.1:PORT; repeat per node")
    c.add_argument("--capacity", action="append", type=parse_capacity, metavar="NAME=MiB",
                   help="a node's salusmem in MiB (what `salus-server ctl capacity` prints on it), for a node "
                        "whose server this host cannot ask; otherwise config asks HOST:PORT from here")
    c.add_argument("--out", required=True,
                   help="directory to write into (every user must be able to pass through it: the TaskProlog "
                        "runs from it as the job's user, unless --install-dir puts it elsewhere)")
    c.add_argument("--install-dir", help="where the directory will be on every node (default: --out)")
    c.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="per-job files on each node (root, 0711)")
    c.add_argument("--salus-server", help="salus-server binary on the nodes (default: the one on PATH)")
    c.add_argument("--python", metavar="PATH",
                   help="the interpreter the hooks run with on the nodes, the same path on every node. The "
                        "TaskProlog runs as each job's user, so every user must be able to run it, and the "
                        "directories above it must be o+x: config refuses one that is not (the hooks need only "
                        "the standard library). Default: /usr/bin/python3 if it exists, else this interpreter")
    c.add_argument("--check-as-user", metavar="USER",
                   help="also run the generated TaskProlog as USER (an ordinary, unprivileged user; needs root), "
                        "to catch what mode bits cannot show (ACLs, noexec mounts)")
    c.add_argument("--slurm-conf", help="SLURM_CONF for the hooks' scontrol (default: Slurm's own)")
    c.add_argument("--max-priority", type=int, help="highest Salus priority a job may ask (default: any)")
    c.add_argument("--expiry-margin", type=int, default=DEFAULT_EXPIRY_MARGIN_S, metavar="SECONDS",
                   help="a token expires this long after the job's time limit (default %(default)s)")
    c.add_argument("--room-wait", type=int, default=DEFAULT_ROOM_WAIT_S, metavar="SECONDS",
                   help="how long the prolog waits while tokens issued outside Slurm (Ray, Kubernetes, an admin) "
                        "hold the memory the job was allocated, before it fails (default %(default)s; 0: fail "
                        "at once)")

    for name, what in (("prolog", "Slurm Prolog (root)"), ("epilog", "Slurm Epilog (root)"),
                       ("task-prolog", "Slurm TaskProlog (the job's user)")):
        s = sub.add_parser(name, help=what)
        s.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
        if name != "task-prolog":
            s.add_argument("--nodes", required=True, help="the node map written by config")
            s.add_argument("--salus-server", required=True)
            s.add_argument("--max-priority", type=int)
            s.add_argument("--expiry-margin", type=int, default=DEFAULT_EXPIRY_MARGIN_S)
            s.add_argument("--room-wait", type=int, default=DEFAULT_ROOM_WAIT_S)
    a = p.parse_args(argv)
    handler = {"config": cmd_config, "prolog": cmd_prolog, "epilog": cmd_epilog, "task-prolog": cmd_task_prolog}
    try:
        return handler[a.command](a)
    except Failure as e:
        why = str(e)
    except Exception as e:  # noqa: BLE001 - said in slurmd's log, not as a bare traceback
        why = f"unexpected {type(e).__name__}: {e}"
    # stderr: slurmd logs a failed Prolog's or Epilog's output; the TaskProlog's wrapper passes it on.
    log(f"{a.command}: {why}")
    if a.command in ("prolog", "epilog"):
        node = os.environ.get("SLURMD_NODENAME", "")
        tell_job(os.environ.get("SLURM_JOB_ID", ""), f"{ADMIN_COMMENT_PREFIX} {a.command} on {node}: "
                 + " ".join(why.split()))  # one line
    return 1


if __name__ == "__main__":
    sys.exit(main())
