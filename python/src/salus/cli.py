"""The `salus` command: run scripts on a salus-server and watch it.

    salus run [--server ADDR] [--name N] [--priority P] [--iterations N] [--seconds S] -- python train.py
    salus jobs [--json]
    salus top [--interval S] [--iterations N | --once]
    salus policy [show]            salus policy set srtf
    salus stats [--json]
    salus hints JOB [--priority P] [--iterations N] [--seconds S]
    salus timeline [--seconds S] [--png FILE | --json]

The server defaults to $SALUS_SERVER, else 127.0.0.1:5501.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from . import __version__, _config

PROG = "salus"


class CliError(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


# --- helpers ---------------------------------------------------------------------------------------

def _admin(args):
    from .admin import AdminClient
    try:
        return AdminClient(args.server, timeout=args.timeout)
    except _config.SalusConfigError as e:
        raise CliError(str(e), 2) from None


def _table(header: list[str], rows: list[list[str]], width: int | None = None) -> str:
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells):
        text = "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
        return text[:width] if width else text

    return "\n".join([line(header)] + [line(r) for r in rows]) + "\n"


def _expected(h: dict) -> str:
    n, s = h.get("expected_iterations", 0), h.get("expected_seconds", 0.0)
    fs = f"{s:g}s"
    if not n and not s:
        return "-"
    if not n:
        return fs
    if not s:
        return f"{n} it"
    return f"{n} it/{fs}"


JOB_HEADER = ["ID", "KIND", "NAME", "TENANT", "STATE", "LANE", "ITERS", "ATTAINED_S", "MEAN_MS", "WAIT_S", "QUEUED",
              "PRIO", "EXPECTED", "NOTE"]


def jobs_table(jobs: list[dict]) -> str:
    if not jobs:
        return "no jobs\n"
    rows = []
    for j in jobs:
        h = j.get("hints") or {}
        rows.append([str(j["id"]), j.get("kind") or "graph", j["name"] or "-", j.get("tenant") or "-", j["state"],
                     str(j["lane"]),
                     str(j["iterations"]), f"{j['attained_seconds']:.3f}", f"{j['mean_iteration_ms']:.2f}",
                     f"{j['queue_wait_seconds']:.3f}", str(j["queued"]), str(h.get("priority", 0)),
                     _expected(h), j["note"]])
    return _table(JOB_HEADER, rows)


def _duration(seconds: float) -> str:
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}d " if d else "") + f"{h}:{m:02d}:{s:02d}"


# --- commands --------------------------------------------------------------------------------------

def reservations_text(reservations: list[dict]) -> str:
    lines = []
    for r in reservations:
        expires = ""
        if r.get("expires_unix_seconds"):
            expires = f", expires in {max(0, r['expires_unix_seconds'] - time.time()):.0f} s"
        lines.append(f"reserved for {r['tenant']}: {r.get('reserved_bytes', 0)} bytes "
                     f"({r.get('claimed_bytes', 0)} claimed by its jobs; token {', '.join(r.get('token_ids', []))}"
                     f"{expires})\n")
    return "".join(lines)


def cmd_jobs(args) -> int:
    from .admin import jobs_json
    with _admin(args) as admin:
        jobs, reservations = admin.jobs_and_reservations()
    if args.json:
        sys.stdout.write(json.dumps(jobs_json(jobs, reservations), indent=2) + "\n")
    else:
        sys.stdout.write(jobs_table(jobs) + reservations_text(reservations))
    return 0


def cmd_timeline(args) -> int:
    from . import _timeline
    from .admin import timeline_json
    if not args.seconds >= 0 or args.seconds == float("inf"):
        raise CliError("--seconds must be a finite number >= 0 (0: all the server keeps)", 2)
    with _admin(args) as admin:
        t = timeline_json(admin.timeline(args.seconds), args.seconds)
    if args.json:
        sys.stdout.write(json.dumps(t, indent=2) + "\n")
        return 0
    if args.png:
        try:
            _timeline.draw_png(t, args.png)
        except _timeline.ChartUnavailable as e:
            raise CliError(str(e)) from None
        except OSError as e:
            raise CliError(f"cannot write {args.png}: {e}") from None
        sys.stdout.write(f"{args.png}: {len(t['spans'])} runs in the last {_timeline.window_of(t):.3g} s\n")
        return 0
    sys.stdout.write(_timeline.summary_text(t))
    return 0


def cmd_stats(args) -> int:
    from .admin import stats_json
    with _admin(args) as admin:
        s = admin.stats()
    if args.json:
        sys.stdout.write(json.dumps(stats_json(s), indent=2) + "\n")
        return 0
    lat = s["switch_latency"]
    out = (f"policy           {s['policy']}\n"
           f"iterations       {s['iterations_total']} ({s['iterations_per_second']:.1f}/s over the last minute)\n"
           f"cheap runs       {s['cheap_runs_total']}\n"
           f"queued           {s['queued']}\n"
           f"dropped          {s['dropped_iterations']}\n"
           f"lane holds cut   {s.get('lane_holds_released', 0)}\n"
           f"switch latency   {lat['count']} samples, p50 {lat['p50_us']:.1f} us, p99 {lat['p99_us']:.1f} us, "
           f"max {lat['max_us']:.1f} us\n")
    for q in s["lanes"]:
        out += f"lane {q['lane']:<11} {q['running']} running, {q['queued']} queued\n"
    out += f"shared between   {s['share']}\n"
    total = sum(t["device_seconds"] for t in s["tenants"])
    for t in s["tenants"]:
        percent = 100.0 * t["device_seconds"] / total if total > 0 else 0.0
        out += (f"tenant {t['tenant']}: {t['device_seconds']:.3f} s device time ({percent:.1f}% of the tenants "
                f"shown), weight {t['weight']}, {t['jobs']} jobs, {t['queued']} iterations queued or running\n")
    sys.stdout.write(out)
    return 0


def cmd_policy(args) -> int:
    with _admin(args) as admin:
        if args.action in (None, "show"):
            if args.name:
                raise CliError("usage: salus policy [show] | salus policy set NAME", 2)
            sys.stdout.write(f"policy: {admin.server_info()['policy']}\n")
        elif args.action == "set":
            if not args.name:
                raise CliError("usage: salus policy set NAME (fifo, srtf, pack, fair, rr, priority, las, dlas, gittins)", 2)
            r = admin.set_policy(args.name)
            sys.stdout.write(f"policy: {r['previous']} -> {r['policy']}\n")
        elif args.name is None:  # `salus policy srtf`, as `salus-server ctl policy srtf`
            r = admin.set_policy(args.action)
            sys.stdout.write(f"policy: {r['previous']} -> {r['policy']}\n")
        else:
            raise CliError(f"unknown policy action {args.action!r}; use `salus policy` or "
                           f"`salus policy set NAME`", 2)
    return 0


def cmd_hints(args) -> int:
    try:
        priority = _config.check_priority(args.priority, "--priority") if args.priority is not None else 0
        iterations = _config.check_iterations(args.iterations, "--iterations") if args.iterations else 0
        seconds = _config.check_seconds(args.seconds, "--seconds") if args.seconds else 0.0
    except _config.SalusConfigError as e:
        raise CliError(str(e), 2) from None
    with _admin(args) as admin:
        job = admin.set_job_hints(args.job, priority, iterations, seconds)
    sys.stdout.write(jobs_table([job]))
    return 0


def cmd_run(args) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError("usage: salus run [--server ADDR] [--name N] [--priority P] [--iterations N] "
                       "[--seconds S] -- COMMAND [ARGS...]", 2)
    env = dict(os.environ)
    try:
        # The environment's hints are the base; the options override them.
        base = _config.validated(name=env.get(_config.ENV_NAME), priority=env.get(_config.ENV_PRIORITY),
                                 iterations=env.get(_config.ENV_ITERATIONS), seconds=env.get(_config.ENV_SECONDS),
                                 sources=_config._ENV_SOURCES)
        given = _config.validated(server=args.server, name=args.name, priority=args.priority,
                                  iterations=args.iterations, seconds=args.seconds,
                                  sources={"server": "--server", "name": "--name", "priority": "--priority",
                                           "iterations": "--iterations", "seconds": "--seconds"})
        server = given.server or (_config.normalize_server(env[_config.ENV_SERVER], _config.ENV_SERVER)
                                  if env.get(_config.ENV_SERVER) else _config.DEFAULT_SERVER)
    except _config.SalusConfigError as e:
        raise CliError(str(e), 2) from None
    settings = base.replace(server=server, name=given.name, priority=given.priority,
                            iterations=given.iterations, seconds=given.seconds)
    env.update(_config.to_env(settings))
    if not args.no_check:
        from ._patch import check_reachable
        try:
            check_reachable(server, timeout=args.timeout)
        except ConnectionError as e:
            raise CliError(str(e).removeprefix("salus: ") + " (use --no-check to start the command anyway)") \
                from None
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        raise CliError(f"command not found: {command[0]}", 127) from None
    except PermissionError:
        raise CliError(f"permission denied: {command[0]}", 126) from None
    except OSError as e:
        raise CliError(f"cannot run {command[0]}: {e.strerror or e}", 126) from None
    return 0  # not reached


# --- top -------------------------------------------------------------------------------------------

_STATE_ORDER = {"running": 0, "queued": 1, "idle": 2}


def render_top(address: str, info: dict | None, stats: dict | None, jobs: list[dict] | None,
               prev: dict | None, interval: float, width: int | None = None, error: str | None = None) -> str:
    """One frame of `salus top` as text. prev maps job id -> (iterations, time) of the previous frame."""
    now = time.strftime("%H:%M:%S")
    lines = []
    if info is None:
        lines.append(f"salus top - {address} - {now} - refresh {interval:g}s")
        lines.append(f"connection lost: {error} (retrying)")
        return "\n".join(lines) + "\n"
    lines.append(f"salus top - {address} - {now} - up {_duration(info['uptime_seconds'])} - "
                 f"policy {info['policy']} - refresh {interval:g}s")
    devices = ", ".join(d["name"].rsplit("/device:", 1)[-1] for d in info["devices"]) or "-"
    lines.append(f"server {info['version'] or '?'} (TensorFlow {info['tensorflow_version'] or '?'}) - "
                 f"devices: {devices}")
    lat = stats["switch_latency"]
    lines.append(f"jobs: {len(jobs)} open, {info['sessions_created']} created - runs: {info['runs_completed']} - "
                 f"iterations: {stats['iterations_total']} ({stats['iterations_per_second']:.1f}/s) - "
                 f"queued: {stats['queued']} - dropped: {stats['dropped_iterations']}")
    lines.append(f"switch latency: p50 {lat['p50_us']:.1f} us, p99 {lat['p99_us']:.1f} us, "
                 f"max {lat['max_us']:.1f} us ({lat['count']} switches)")
    lines.append("")
    lane_rows = [[str(q["lane"]), str(q["running"]), str(q["queued"]),
                  " ".join(j["name"] or str(j["id"]) for j in jobs
                           if j["lane"] == q["lane"] and j["state"] == "running") or "-",
                  " ".join(j["name"] or str(j["id"]) for j in jobs
                           if j["lane"] == q["lane"] and j["state"] == "queued") or "-"]
                 for q in stats["lanes"]]
    if lane_rows:
        lines.append(_table(["LANE", "RUNNING", "QUEUED", "RUNNING_JOB", "WAITING_JOBS"], lane_rows,
                            width).rstrip("\n"))
    else:
        lines.append("no lanes")
    lines.append("")
    if not jobs:
        lines.append("no jobs")
    else:
        t = time.monotonic()
        rows = []
        for j in sorted(jobs, key=lambda j: (_STATE_ORDER.get(j["state"], 3), j["id"])):
            h = j.get("hints") or {}
            rate = "-"
            if prev and j["id"] in prev:
                it0, t0 = prev[j["id"]]
                if t > t0:
                    rate = f"{max(0, j['iterations'] - it0) / (t - t0):.1f}"
            n = h.get("expected_iterations", 0)
            progress = f"{min(100.0, 100.0 * j['iterations'] / n):.0f}%" if n else "-"
            rows.append([str(j["id"]), j.get("kind") or "graph", j["name"] or "-", j.get("tenant") or "-", j["state"],
                         str(j["lane"]), str(j["iterations"]), rate,
                         progress, f"{j['mean_iteration_ms']:.2f}", f"{j['attained_seconds']:.2f}",
                         f"{j['queue_wait_seconds']:.2f}", str(j["queued"]), str(h.get("priority", 0)),
                         _duration(j["age_seconds"]), j["note"]])
        lines.append(_table(["ID", "KIND", "NAME", "TENANT", "STATE", "LANE", "ITERS", "IT/S", "DONE", "MEAN_MS",
                             "ATTAINED_S", "WAIT_S", "QUEUED", "PRIO", "AGE", "NOTE"], rows, width).rstrip("\n"))
    if width:
        lines = [ln[:width] for ln in lines]
    return "\n".join(lines) + "\n"


def cmd_top(args) -> int:
    from .admin import AdminError, ServerUnreachable
    frames = 1 if args.once else args.iterations
    if frames is not None and frames < 1:
        raise CliError("--iterations must be at least 1", 2)
    if args.interval <= 0:
        raise CliError("--interval must be positive", 2)
    tty = sys.stdout.isatty() and not args.no_clear
    admin = _admin(args)
    prev: dict = {}
    shown = 0
    try:
        if tty:
            sys.stdout.write("\x1b[?25l")  # hide the cursor
        while True:
            error = None
            try:
                info, stats, jobs = admin.server_info(), admin.stats(), admin.list_jobs()
            except ServerUnreachable as e:
                if shown == 0:
                    raise
                info = stats = jobs = None
                error = str(e)
            except AdminError:
                raise
            width = None
            if tty:
                import shutil
                width = shutil.get_terminal_size().columns
            frame = render_top(admin.address, info, stats, jobs, prev, args.interval, width, error)
            if jobs is not None:
                t = time.monotonic()
                prev = {j["id"]: (j["iterations"], t) for j in jobs}
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J" + frame)
            else:
                if shown:
                    sys.stdout.write("\n")
                sys.stdout.write(frame)
            sys.stdout.flush()
            shown += 1
            if frames is not None and shown >= frames:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        if tty:
            sys.stdout.write("\x1b[?25h\n")
            sys.stdout.flush()
        admin.close()


# --- argument parsing ------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Run TensorFlow scripts on a shared salus-server and watch it.",
        epilog="The server defaults to $SALUS_SERVER, else 127.0.0.1:5501.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", metavar="ADDR", default=argparse.SUPPRESS,
                        help="salus-server address, HOST:PORT or grpc://HOST:PORT (default: $SALUS_SERVER, "
                             "else 127.0.0.1:5501)")
    common.add_argument("--timeout", type=float, default=argparse.SUPPRESS, metavar="S",
                        help="seconds to wait for the server (default 5)")
    p.add_argument("--server", metavar="ADDR", default=None, help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=5.0, help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command_name", metavar="COMMAND")

    r = sub.add_parser("run", parents=[common], help="run a command with its TensorFlow sessions on the server",
                       description="Sets SALUS_SERVER and the job hints in the environment and executes "
                                   "COMMAND (its exit code is salus's). TensorFlow graph sessions of Python "
                                   "processes with salus-tf installed go to the server.",
                       usage="salus run [--server ADDR] [--name N] [--priority P] [--iterations N] "
                             "[--seconds S] -- COMMAND [ARGS...]")
    r.add_argument("--name", help="job name (default: the script's file name)")
    r.add_argument("--priority", help="priority hint (integer, higher runs first under the priority policy)")
    r.add_argument("--iterations", help="expected main iterations of the job")
    r.add_argument("--seconds", help="expected device seconds of the job")
    r.add_argument("--no-check", action="store_true", help="do not check that the server is reachable first")
    r.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    r.set_defaults(func=cmd_run)

    j = sub.add_parser("jobs", parents=[common],
                       help="list the server's jobs and the memory issued tokens reserve")
    j.add_argument("--json", action="store_true", help="JSON: {\"jobs\": [...], \"reservations\": [...]}, the keys of `salus-server ctl jobs --json`")
    j.set_defaults(func=cmd_jobs)

    t = sub.add_parser("top", parents=[common], help="live view of lanes, jobs and queues")
    t.add_argument("-d", "--interval", "--delay", type=float, default=1.0, metavar="S",
                   help="seconds between refreshes (default 1)")
    t.add_argument("-n", "--iterations", type=int, default=None, metavar="N",
                   help="stop after N frames (default: until Ctrl-C)")
    t.add_argument("--once", action="store_true", help="print one frame and exit")
    t.add_argument("--no-clear", action="store_true",
                   help="append frames instead of redrawing the screen (the default when not on a terminal)")
    t.set_defaults(func=cmd_top)

    po = sub.add_parser("policy", parents=[common], help="show or set the scheduling policy",
                        usage="salus policy [show] | salus policy set NAME")
    po.add_argument("action", nargs="?", help="show (default) or set")
    po.add_argument("name", nargs="?", help="fifo, srtf, pack, fair, rr, priority, las, dlas or gittins")
    po.set_defaults(func=cmd_policy)

    s = sub.add_parser("stats", parents=[common], help="scheduler statistics")
    s.add_argument("--json", action="store_true",
                   help="JSON, with the keys of `salus-server ctl stats --json` (without its server_counters)")
    s.set_defaults(func=cmd_stats)

    h = sub.add_parser("hints", parents=[common], help="replace a job's hints (job id, handle or name)")
    h.add_argument("job")
    h.add_argument("--priority", type=str, default=None)
    h.add_argument("--iterations", type=str, default=None)
    h.add_argument("--seconds", type=str, default=None)
    h.set_defaults(func=cmd_hints)

    tl = sub.add_parser("timeline", parents=[common], help="recent iterations per lane: summary, PNG chart or JSON",
                        description="The server's recent main iterations and cheap runs (it keeps "
                                    "--timeline-capacity of them). Without --png or --json: per lane, each "
                                    "job's runs and busy time.")
    tl.add_argument("--seconds", type=float, default=10.0, metavar="S",
                    help="runs that ended in the last S seconds (default 10; 0: all the server keeps)")
    out = tl.add_mutually_exclusive_group()
    out.add_argument("--png", metavar="FILE",
                     help="draw a Gantt chart: a row per lane, a colour per job (needs matplotlib)")
    out.add_argument("--json", action="store_true",
                     help="every run, with the keys of `salus-server ctl timeline --json` (times in seconds "
                          "before the server's now)")
    tl.set_defaults(func=cmd_timeline)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    from .admin import AdminError
    try:
        return args.func(args)
    except CliError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return e.code
    except AdminError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 1
    except BrokenPipeError:
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 1


if __name__ == "__main__":
    sys.exit(main())
