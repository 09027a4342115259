"""Prometheus metrics (`--metrics-listen`): one server runs a TF1 graph job and a TF2 eager job while a real Prometheus
scrapes it every second. Checks: `promtool check metrics` finds a scrape clean; the series exist with values that
agree with the admin API and with each other; Prometheus' query API answers for them; every metric the Grafana
dashboard (deploy/grafana/salus.json) uses exists in a real scrape.

promtool and prometheus come from Debian's `prometheus` package (scripts/setup_test_tools.sh, which scripts/test.sh runs, installs it as root); without
them only the tests that need them skip.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, WORKLOADS, SalusProcess, child_env, venv_python, wait_until
from server_ctl import ctl_json
from tf2_common import tf2_env

DASHBOARD = REPO / "deploy" / "grafana" / "salus.json"
METRICS_RE = re.compile(r"^salus-server metrics on (127\.0\.0\.1:\d+)\s*$")
SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
GRAPH_JOB, EAGER_JOB = "metrics-graph", "metrics-eager"
# A TF1 run that TensorFlow itself fails (CheckNumerics on a NaN: INVALID_ARGUMENT), three times.
FAILING_RUNS = 3
FAILING_JOB = f"""
import sys, tensorflow as tf
tf.compat.v1.disable_eager_execution()
nan = tf.compat.v1.placeholder(tf.float32, [])
checked = tf.debugging.check_numerics(nan, "not a number")
with tf.compat.v1.Session(sys.argv[1]) as sess:
    for _ in range({FAILING_RUNS}):
        try:
            sess.run(checked, {{nan: float("nan")}})
            sys.exit("the run did not fail")
        except tf.errors.InvalidArgumentError:
            pass
print("failed as expected")
"""
CAPACITY = 4 << 30
JOB_SECONDS = 8  # each job trains this long: several 1 s scrapes see it running


def parse(text: str) -> list[tuple[str, dict, float]]:
    """(name, labels, value) of every sample of a text-format scrape."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_RE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in LABEL_RE.findall(m.group(2) or "")}
        samples.append((m.group(1), labels, float(m.group(3))))
    return samples


def values(samples, name: str, **labels) -> list[float]:
    return [v for n, ls, v in samples if n == name and all(ls.get(k) == w for k, w in labels.items())]


def one(samples, name: str, **labels) -> float:
    found = values(samples, name, **labels)
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus server of our own: temp config and storage, a free port, a 1 s scrape; stopped by its PID."""

    def __init__(self, tmp: Path, target: str):
        config = tmp / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: salus\n    static_configs: [{{targets: ['{target}']}}]\n")
        self.url = f"http://127.0.0.1:{free_port()}"
        self._log = open(tmp / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address={self.url.removeprefix('http://')}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp)
        self.log_path = tmp / "prometheus.log"
        if not wait_until(self._ready, timeout=60, interval=0.2):
            self.stop()
            pytest.fail(f"prometheus did not become ready; log:\n{self.log_path.read_text()[-3000:]}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr, **({"time": f"{at:.3f}"} if at else {})}
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # our own child, by its PID
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


class Workload:
    """A job script as a child; its stdout lines are collected on a thread."""

    def __init__(self, argv: list[str], env: dict):
        self.proc = subprocess.Popen([venv_python(), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, stdin=subprocess.DEVNULL)
        self.lines: list[str] = []
        self.stderr: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def printed(self, key: str) -> bool:
        return any(key in line for line in self.lines)

    def failure(self) -> str:
        return f"exit code {self.proc.poll()}\nstdout:\n{''.join(self.lines)[-2000:]}\nstderr:\n{''.join(self.stderr)[-3000:]}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # our own child, by its Popen handle
            self.proc.wait(10)


@dataclass
class Observed:
    server: SalusProcess
    metrics_url: str
    during: str  # a scrape while both jobs ran
    during_admin: list  # the admin API's jobs right after it
    after: str  # a scrape once the eager job was reclaimed (the graph job still open)
    prometheus: Prometheus | None


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers["Content-Type"]
        return r.read().decode()


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics")
    # One fixed lane of the whole capacity: both jobs are admitted to it and take turns (switches are measured).
    server = SalusProcess(tmp / "server.log", ("--metrics-listen", "127.0.0.1:0", "--memory-capacity", str(CAPACITY),
                                               "--gpu-lanes", "1", "--policy", "fair"))
    prometheus = None
    jobs: list[Workload] = []
    try:
        assert wait_until(lambda: any(METRICS_RE.match(l) for l in server.stdout_lines), timeout=10), \
            server.stdout_lines
        assert LISTEN_FIRST(server.stdout_lines), server.stdout_lines
        address = next(METRICS_RE.match(l).group(1) for l in server.stdout_lines if METRICS_RE.match(l))
        url = f"http://{address}/metrics"
        if shutil.which("prometheus"):
            prometheus = Prometheus(tmp, address)
        graph = Workload([str(WORKLOADS / "sched_job.py"), "--target", server.target, "--name", GRAPH_JOB,
                          "--seconds", str(JOB_SECONDS), "--hold", "--digest-only"], child_env())
        jobs.append(graph)
        eager = Workload([str(WORKLOADS / "tf2_sched_job.py"), "--name", EAGER_JOB, "--seconds", str(JOB_SECONDS),
                          "--no-close", "--digest-only"],
                         tf2_env(SALUS_SERVER=server.address, SALUS_JOB_NAME=EAGER_JOB))
        jobs.append(eager)

        def both_iterating() -> bool:
            samples = parse(scrape(url))
            return all(sum(values(samples, "salus_job_iterations_total", job_name=name)) >= 20
                       for name in (GRAPH_JOB, EAGER_JOB))

        if not wait_until(both_iterating, timeout=180, interval=0.5):
            pytest.fail(f"the jobs did not both iterate:\ngraph: {graph.failure()}\neager: {eager.failure()}")
        timings = []
        for _ in range(5):
            t0 = time.perf_counter()
            during = scrape(url)
            timings.append((time.perf_counter() - t0) * 1e3)
        during_admin = ctl_json(server.address, "jobs")["jobs"]
        print(f"scrape with two jobs running: {len(during)} bytes, median {sorted(timings)[2]:.1f} ms, "
              f"max {max(timings):.1f} ms")
        # Started after that scrape, so it saw exactly the two training jobs.
        failing = Workload(["-c", FAILING_JOB, server.target], child_env())
        jobs.append(failing)
        assert wait_until(lambda: graph.printed('"holding"') or graph.proc.poll() is not None, timeout=120), \
            graph.failure()
        assert graph.printed('"holding"'), graph.failure()
        assert eager.proc.wait(120) == 0, eager.failure()
        assert failing.proc.wait(120) == 0 and failing.printed("failed as expected"), failing.failure()
        # The stock TF2 client leaves its context open; the server reclaims it 3 s after its streams end.
        reclaimed = lambda: one(parse(scrape(url)), "salus_jobs_reclaimed_total", kind="eager") >= 1  # noqa: E731
        assert wait_until(reclaimed, timeout=30, interval=0.5), scrape(url)
        after = scrape(url)
        if prometheus:
            time.sleep(2.5)  # two more scrapes: Prometheus holds the final values
        yield Observed(server, url, during, during_admin, after, prometheus)
    finally:
        for job in jobs:
            job.kill()
        if prometheus:
            prometheus.stop()
        server.stop()


def LISTEN_FIRST(lines: list[str]) -> bool:
    """The gRPC listening line stays the first line; the metrics line comes after it."""
    return bool(lines) and lines[0].startswith("salus-server listening on ")


def test_promtool_finds_the_scrape_clean(observed):
    if not shutil.which("promtool"):
        pytest.skip("promtool missing: scripts/setup_test_tools.sh installs Debian's prometheus package (as root)")
    for text in (observed.during, observed.after):
        proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                              timeout=30)
        assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), \
            (proc.returncode, proc.stdout, proc.stderr)


def test_job_series_agree_with_the_admin_api(observed):
    samples = parse(observed.during)
    admin = {j["name"]: j for j in observed.during_admin}
    for name, kind in ((GRAPH_JOB, "graph"), (EAGER_JOB, "eager")):
        row = admin[name]
        labels = dict(job_id=str(row["id"]), job_name=name, kind=kind)
        iterations = one(samples, "salus_job_iterations_total", **labels)
        # The admin view was read after the scrape: it can only have moved on.
        assert 20 <= iterations <= row["iterations"], (name, iterations, row)
        assert 1 <= one(samples, "salus_job_cheap_runs_total", **labels) <= row["cheap_runs"], row
        assert one(samples, "salus_job_persistent_estimate_bytes", **labels) == row["persistent_estimate_bytes"] > 0
        assert 0 < one(samples, "salus_job_device_seconds_total", **labels) <= row["attained_s"] + 1e-9
    assert sum(values(samples, "salus_jobs")) == 2
    assert sum(values(samples, "salus_jobs", kind="graph")) == 1 and sum(values(samples, "salus_jobs", kind="eager")) == 1
    info = [ls for n, ls, v in samples if n == "salus_server_info" and v == 1]
    assert len(info) == 1 and info[0]["policy"] == "fair" and re.match(r"^2\.\d+\.\d+", info[0]["tensorflow_version"])


def test_scheduler_histograms_count_every_iteration(observed):
    samples = parse(observed.during)
    iterations = one(samples, "salus_iterations_total")
    assert iterations >= 40
    for histogram in ("salus_iteration_duration_seconds", "salus_queue_wait_seconds"):
        buckets = [(float(ls["le"]), v) for n, ls, v in samples if n == f"{histogram}_bucket"]
        counts = [v for _, v in sorted(buckets)]
        assert counts == sorted(counts), (histogram, buckets)  # cumulative
        assert sorted(buckets)[-1] == (math.inf, one(samples, f"{histogram}_count"))
        # Both histograms are fed with the iteration counter, in the same critical section.
        assert one(samples, f"{histogram}_count") == iterations, histogram
    mean = one(samples, "salus_iteration_duration_seconds_sum") / iterations
    assert 1e-4 < mean < 1.0, mean  # mlp_small steps take milliseconds
    switches = one(samples, "salus_switch_latency_seconds_count")
    assert 0 < switches <= iterations  # two jobs share one lane under fair


def test_memory_lanes_and_reclaimed_jobs(observed):
    during, after = parse(observed.during), parse(observed.after)
    assert one(during, "salus_memory_capacity_bytes") == CAPACITY
    used, sizes = values(during, "salus_lane_used_bytes"), values(during, "salus_lane_capacity_bytes")
    assert used and sum(used) > 0 and sum(sizes) <= CAPACITY and all(u <= s for u, s in zip(used, sizes))
    assert sum(values(during, "salus_lane_jobs")) == 2
    assert 0 <= one(during, "salus_memory_free_bytes") <= CAPACITY - sum(used)
    # Once its client exited, the eager job was reclaimed and its series ended; the graph job's stay.
    assert one(after, "salus_jobs_reclaimed_total", kind="eager") == 1
    assert one(after, "salus_jobs_reclaimed_total", kind="graph") == 0
    assert not values(after, "salus_job_iterations_total", job_name=EAGER_JOB)
    assert values(after, "salus_job_iterations_total", job_name=GRAPH_JOB)
    assert sum(values(after, "salus_jobs", kind="eager")) == 0
    assert sum(values(after, "salus_jobs", kind="graph")) == 1  # the failing job closed its session
    assert one(after, "salus_admission_refusals_total") == 0 and one(after, "salus_admission_timeouts_total") == 0
    assert len(values(after, "salus_run_errors_total")) == 16  # every code but OK, zeros included
    # TensorFlow's own failures, counted by code where the run failed (and only there).
    assert one(after, "salus_run_errors_total", code="INVALID_ARGUMENT") == FAILING_RUNS
    assert sum(values(after, "salus_run_errors_total")) == FAILING_RUNS


def test_ctl_stats_shows_the_same_counters(observed):
    """One set of counters, two views: `ctl stats` reads what /metrics shows (nothing changed since `after`)."""
    after = parse(observed.after)
    stats = ctl_json(observed.server.address, "stats")
    counters = stats["server_counters"]
    assert counters["eager_contexts_reclaimed"] == one(after, "salus_jobs_reclaimed_total", kind="eager") == 1
    assert counters["run_errors"]["INVALID_ARGUMENT"] == FAILING_RUNS
    assert counters["admission_waits"] == one(after, "salus_admission_waits_total")
    assert stats["iterations_total"] == one(after, "salus_iterations_total")
    assert stats["iteration_time_us"]["count"] == one(after, "salus_iteration_duration_seconds_count")
    assert stats["queue_wait_us"]["sum"] == pytest.approx(one(after, "salus_queue_wait_seconds_sum") * 1e6)


def test_other_paths_and_methods_are_refused(observed):
    base = observed.metrics_url.removesuffix("/metrics")
    for request, code in ((urllib.request.Request(f"{base}/nope"), 404),
                          (urllib.request.Request(observed.metrics_url, data=b"x", method="POST"), 405)):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10)
        assert err.value.code == code


def test_prometheus_scrapes_and_answers_queries(observed):
    prometheus = observed.prometheus
    if prometheus is None:
        pytest.skip("prometheus missing: scripts/setup_test_tools.sh installs Debian's prometheus package (as root)")
    up = prometheus.query('up{job="salus"}')
    assert [r["value"][1] for r in up] == ["1"], up
    series = prometheus.query("salus_job_iterations_total")
    by_name = {r["metric"]["job_name"]: (r["metric"]["kind"], float(r["value"][1])) for r in series}
    final = one(parse(observed.after), "salus_job_iterations_total", job_name=GRAPH_JOB)
    assert by_name.get(GRAPH_JOB) == ("graph", final), series
    # The eager job's series ended with it; Prometheus kept what it scraped while the job ran.
    ran = prometheus.query(f'last_over_time(salus_job_iterations_total{{job_name="{EAGER_JOB}"}}[5m])')
    assert len(ran) == 1 and ran[0]["metric"]["kind"] == "eager" and float(ran[0]["value"][1]) >= 20, ran
    p50 = prometheus.query("histogram_quantile(0.5, sum by (le) (increase(salus_iteration_duration_seconds_bucket[5m])))")
    assert p50 and 1e-4 < float(p50[0]["value"][1]) < 1.0, p50
    info = prometheus.query("salus_server_info")
    assert info and info[0]["metric"]["policy"] == "fair", info
    reclaimed = prometheus.query('salus_jobs_reclaimed_total{kind="eager"}')
    assert reclaimed and reclaimed[0]["value"][1] == "1", reclaimed


def dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return {m for e in exprs for m in re.findall(r"\bsalus_[a-z0-9_]+", e)}


def test_dashboard_is_importable_and_uses_only_real_series(observed):
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["title"] and dashboard["uid"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panel_ids = [p["id"] for p in dashboard["panels"]]
    assert len(panel_ids) == len(set(panel_ids)) >= 8
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("jobs by state", "queued", "iterations per second by job", "switch latency", "queue wait",
                  "memory per lane"):
        assert topic in titles, topic
    scraped = {n for n, _, _ in parse(observed.during)}
    used = dashboard_metrics()
    assert len(used) >= 10, used
    missing = sorted(m for m in used if m not in scraped)
    assert not missing, f"the dashboard uses series no scrape has: {missing}"
