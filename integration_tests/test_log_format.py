"""`--log-format json`: every line the server writes to its log is one JSON object, its executors' lines included
(marked with "executor"), and a flag given in its old form is accepted with a warning in that log.

One server (--isolation tenant, the default), one short TF1 client (long_run.py, a fraction of a second of
compute). Costs about 8 s (the client's TensorFlow import and the server's start and stop).
"""

import json
import signal

from conftest import REPO, SalusProcess, run_python

WORKLOADS = REPO / "integration_tests" / "workloads"


def test_json_log_lines_and_old_flag_forms(tmp_path):
    log = tmp_path / "salus-server.stderr.log"
    # --anticipation-us: the flag's old name, with a bare number in its old unit (microseconds).
    server = SalusProcess(log, ("--log-format", "json", "--anticipation-us", "1500", "--idle-timeout", "90s"))
    try:
        done = run_python(WORKLOADS / "long_run.py", "--target", server.target, "--seconds", "0.2")
        assert '"phase": "done"' in done.stdout, done.stdout
    finally:
        server.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=60)
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    assert lines, "the server logged nothing"
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            raise AssertionError(f"a log line is not JSON: {line!r}\nlog:\n" + "\n".join(lines[-30:])) from None
        assert isinstance(record, dict), line
        records.append(record)
    warnings = [r for r in records if r.get("level") == "WARN"]
    bare = [r for r in warnings if "bare number" in r.get("message", "")]
    assert len(bare) == 1 and "executor" not in bare[0], f"said once, by the server, not its executor: {bare}"
    assert any("--anticipation was given a bare number, read as 1500us" in r.get("message", "") for r in warnings), \
        warnings
    assert not any("idle-timeout" in r.get("message", "") for r in warnings), "90s has its unit: no warning"
    assert all("timestamp" in r for r in records if "executor" not in r and r.get("source") != "stderr"), records
    from_executors = [r for r in records if "executor" in r]
    assert from_executors, "no line of the tenant's executor reached the log:\n" + "\n".join(lines[-30:])
    assert all(":" in r["executor"] for r in from_executors), from_executors[:3]
    print(f"{len(records)} JSON lines, {len(from_executors)} from the executor, {len(warnings)} warnings")
