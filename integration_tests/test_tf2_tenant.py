"""The tenant boundary for TF2 jobs of a tenant running with permissions not its own (`--auth off`: the anonymous
tenant, whose executor runs as nobody): an unmodified TF2 script's reads, writes and listings of the server's files
are refused (eagerly and inside a tf.function) with PERMISSION_DENIED while the job goes on; tf.train.Checkpoint
writes land in the job's checkpoint directory on the server, a path outside it fails, and restoring from that
directory (same machine) gives the saved values back. A refused op without outputs (a file write, a lookup
table's file initialiser) raises its own PERMISSION_DENIED at the next call that reads a value or waits; a
tf.py_function inside a tf.function and a pipeline that calls Python run, their Python in the script.
"""

from __future__ import annotations

import json
import shutil
import subprocess

from conftest import WORKLOADS, SalusProcess, last_json_line, reachable_tmpdir, venv_python
from tf2_common import SERVER_JOB, tf2_env


def test_tf2_script_cannot_touch_server_files_and_checkpoints_are_confined(tmp_path):
    # The anonymous tenant's executor runs as nobody and must reach the per-job checkpoint directories.
    workdir = reachable_tmpdir("salus-tf2-tenant-")
    server = SalusProcess(tmp_path / "server.log", ("--auth", "off"), cwd=workdir)
    try:
        job_dir = workdir / "salus-checkpoints" / "tf2-tenant"
        proc = subprocess.run([venv_python(), str(WORKLOADS / "tf2_tenant.py"), str(job_dir)],
                              env=tf2_env(SALUS_SERVER=server.address, SALUS_JOB_NAME="tf2-tenant"),
                              capture_output=True, text=True, timeout=240, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-4000:]
        result = last_json_line(proc.stdout)
        o = result["outcomes"]
        print(json.dumps(o, indent=1))  # shown in full when an assertion below fails
        for attempt in ("read_eager", "write_eager", "list_eager", "read_function", "list_function"):  # eagerly, in tf.function
            assert o[attempt] == "PermissionDeniedError", (attempt, o)
        assert "ReadFile" in o["read_eager_message"] and "MatchingFiles" in o["list_function_message"], o
        assert o["still_works"] == "ok", o
        assert not (tmp_path / "salus-tenant-test").exists()
        assert o["save_relative"] == "ok", o
        assert any(job_dir.joinpath("ckpt").glob("model.index")), list(job_dir.rglob("*"))
        assert o["save_outside"] == "InvalidArgumentError" and "outside" in o["save_outside_message"], o
        assert not (tmp_path.parent / "salus-escape").exists()
        assert o["restore"] == "ok", o
        assert result["restored"] == [1.0, 2.0, 3.0] and result["device"].startswith(SERVER_JOB), result
        # Errors where they happen: the refused op's own error, at its call or at the latest the next one.
        assert o["late_write"][:2] == ["next", "PermissionDeniedError"] and "WriteFile" in o["late_write"][2], o
        assert o["late_table"][0] in ("first", "next") and o["late_table"][1] == "PermissionDeniedError", o
        assert "InitializeTableFromTextFile" in o["late_table"][2], o
        assert o["py_function_in_function"] == "ok" and o["py_function_in_function_value"] == 3.0, o
        assert "salus: error: an op of this script failed" in proc.stderr and "WriteFile" in proc.stderr, \
            proc.stderr[-3000:]
        assert o["python_pipeline"] == "ok" and o["python_pipeline_values"] == [0, 2, 4, 6], o
        assert server.proc.poll() is None, "the server died"
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
