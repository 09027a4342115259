"""The container image (deploy/k8s/Containerfile, built by scripts/build_image.sh from the release wheel as
localhost/salus:<version>) run
for real with podman (runc), as deploy/k8s/README.md describes. Skipped unless the image exists: CI does not
build it (several minutes, needs root and apt); scripts/test_container.sh builds it and runs this file.

Checked:
- the image alone: salus-server started in a container (its own network namespace), and the repository's
  demos (scripts/demo_tf2.py: an unmodified Keras 3 script through the adapter; scripts/demo.py: TF1 graph
  sessions) run with the image's Python against it, each comparing its numbers with the same code in-process;
- a client Pod: deploy/k8s/training-pod.yaml (its ConfigMap's unmodified Keras 3 script, run with the image's
  Python as user 65534) played with `podman kube play`, hostNetwork, with SALUS_SERVER and SALUS_TOKEN in its
  env as the device plugin's Allocate would give them, against a salus-server on the host holding a token of
  tenant pod-1 (512 MiB reserved of 2 GiB): its eager work ran on the server (variables on /job:worker), its
  numbers equal those of the same script run in-process here, and its job showed on `ctl jobs --json` as
  tenant pod-1;
- the node agent: deploy/k8s/daemonset.yaml's pod template (salus-server + salus-device-plugin, its ConfigMap,
  its capabilities) played as a Pod with a stand-in kubelet (test_k8s_device_plugin's) on its device-plugin
  directory: the plugin registers, advertises 16 GiB as 64 healthy units, Allocate of 8 gives SALUS_SERVER and
  SALUS_TOKEN, and training-pod.yaml trains with them (its tenant the plugin's, numbers as in-process).
  podman differs from a kubelet: no status.hostIP and no $(VAR) expansion in args (the node's address is
  loopback here), no port mappings with hostNetwork (dropped); a free port stands for 5501.
Every container and pod started is removed (podman rm -f, podman kube down). About 50 s (three TensorFlow
clients in containers, one in-process).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, SalusProcess, last_json_line
from server_ctl import ctl_json
from test_k8s_device_plugin import StandInKubelet, api  # noqa: F401  (module fixture: the v1beta1 stubs)
from tf2_common import SERVER_JOB, assert_devices, assert_same_numbers, run_workload, salus_lines, tf2_env

VERSION = re.search(r'^\[workspace\.package\]\s*$.*?^version = "([^"]+)"', (REPO / "Cargo.toml").read_text(),
                    re.M | re.S).group(1)
IMAGE = os.environ.get("SALUS_IMAGE", f"localhost/salus:{VERSION}")
# scripts/build_image.sh writes it: runc and ulimits of 1024 (podman's defaults fail on this machine).
CONTAINERS_CONF = "/etc/containers/containers-salus.conf"
POD_YAML = REPO / "deploy" / "k8s" / "training-pod.yaml"
DAEMONSET_YAML = REPO / "deploy" / "k8s" / "daemonset.yaml"
RUN_TIMEOUT = 300


def podman_env() -> dict:
    env = dict(os.environ)
    if "CONTAINERS_CONF" not in env and Path(CONTAINERS_CONF).exists():
        env["CONTAINERS_CONF"] = CONTAINERS_CONF
    return env


def podman(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, env=podman_env(), timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        pytest.fail(f"podman {' '.join(args)} exited with {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                    f"stderr:\n{proc.stderr[-3000:]}")
    return proc


def _skip_reason() -> str | None:
    if shutil.which("podman") is None:
        return f"podman is not installed; scripts/build_image.sh installs it and builds {IMAGE} (not run by CI)"
    if os.geteuid() != 0:
        return "rootful podman needs root (scripts/test_container.sh)"
    try:
        exists = subprocess.run(["podman", "image", "exists", IMAGE], env=podman_env(), timeout=60,
                                capture_output=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"podman does not answer ({e})"
    if not exists:
        return (f"the image {IMAGE} is not built: scripts/build_image.sh builds it (root, several minutes; CI "
                f"does not), scripts/test_container.sh builds it and runs this file")
    return None


SKIP_REASON = _skip_reason()
pytestmark = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


@pytest.fixture(scope="module", autouse=True)
def image_is_current():
    """A warning, not a failure, when the image's salus-server is not this checkout's release (rebuild it)."""
    name = f"salus-test-version-{os.getpid()}"
    try:
        out = podman("run", "--rm", "--name", name, "--network", "none", IMAGE, "salus-server",
                     "--version").stdout.strip()
    finally:
        podman("rm", "-f", "--ignore", name, check=False)
    if out != f"salus-server {VERSION}":
        import warnings
        warnings.warn(f"{IMAGE}'s salus-server says {out!r}, this checkout is {VERSION}: scripts/build_release.sh "
                      "and scripts/build_image.sh rebuild it")


DEMO_IN_CONTAINER = r"""
set -o pipefail
salus-server --listen 127.0.0.1:5501 >/tmp/server.out 2>/tmp/server.err &
for _ in $(seq 300); do grep -q 'listening on' /tmp/server.out && break; sleep 0.1; done
grep 'listening on' /tmp/server.out || { echo 'server did not start'; tail -20 /tmp/server.err; exit 3; }
python /demo/demo_tf2.py --server 127.0.0.1:5501 || exit 4
python /demo/demo.py --target grpc://127.0.0.1:5501 --steps 300 2>&1 | tail -3 || exit 5
echo "STATS $(salus-server ctl --server 127.0.0.1:5501 stats --json | tr -d '\n')"
kill %1 && wait %1
"""


def test_demos_train_through_the_server_inside_the_container():
    name = f"salus-test-demo-{os.getpid()}"
    try:
        proc = podman("run", "--rm", "--name", name, "--network", "none", "-v", f"{REPO / 'scripts'}:/demo:ro",
                      IMAGE, "bash", "-c", DEMO_IN_CONTAINER, check=False, timeout=RUN_TIMEOUT)
    finally:
        podman("rm", "-f", "--ignore", name, check=False)
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert "variables on the server: True; numbers equal to in-process: True" in out, out
    assert "demo: trained 300 steps through grpc://127.0.0.1:5501" in out, out
    stats = json.loads(next(line for line in out.splitlines() if line.startswith("STATS "))[len("STATS "):])
    # Both demos' jobs ran as the container's root (a loopback uid tenant) and used device time.
    assert any(t["tenant"].startswith("root") and t["device_s"] > 0 for t in stats["tenants"]), stats["tenants"]


def pod_yaml(unique: str, address: str, token: str) -> str:
    """training-pod.yaml as the kubelet would run it on a node whose device plugin advertises loopback
    (hostNetwork) and whose Allocate gave SALUS_SERVER and SALUS_TOKEN; named `unique`."""
    text = POD_YAML.read_text()
    for anchor in ("  restartPolicy: Never\n", "      env:\n", "name: keras-train"):
        assert anchor in text, f"{POD_YAML} lost {anchor!r}"
    text = text.replace("  restartPolicy: Never\n", "  restartPolicy: Never\n  hostNetwork: true\n", 1)
    env = (f"      env:\n        - name: SALUS_SERVER\n          value: {json.dumps(address)}\n"
           f"        - name: SALUS_TOKEN\n          value: {json.dumps(token)}\n")
    text = text.replace("      env:\n", env, 1)
    return text.replace("keras-train", unique)


def configmap_script(text: str) -> str:
    """The ConfigMap's train.py (a literal block indented by 4)."""
    lines = text.split("  train.py: |\n", 1)[1].split("\n---\n", 1)[0].split("\n")
    assert all(not line or line.startswith("    ") for line in lines), "train.py is not one literal block"
    return "\n".join(line[4:] for line in lines) + "\n"


@pytest.fixture(scope="module")
def local_result(tmp_path_factory) -> dict:
    """training-pod.yaml's script run in-process here (the numbers every pod must match)."""
    script = tmp_path_factory.mktemp("in-process") / "train.py"
    script.write_text(configmap_script(POD_YAML.read_text()))
    local = last_json_line(run_workload(str(script), tf2_env()).stdout)
    assert_devices(local, "/job:localhost")
    return local


def run_training_pod(tmp_path: Path, unique: str, address: str, token: str):
    """Plays training-pod.yaml (as `unique`) until its script exits; returns its logs, the jobs the server
    listed meanwhile (by name) and the server's stats afterwards. Removes the pod."""
    yaml_path = tmp_path / f"{unique}.yaml"
    container = f"{unique}-train"
    try:
        yaml_path.write_text(pod_yaml(unique, address, token))
        podman("kube", "play", str(yaml_path), timeout=120)
        seen: dict[str, dict] = {}
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:  # the job is listed while the script runs (its context closes seconds after it exits)
            for row in ctl_json(address, "jobs")["jobs"]:
                seen[row["name"]] = row
            state = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container).stdout.split()
            if state[0] in ("exited", "stopped"):
                break
            assert time.monotonic() < deadline, f"the pod ran past {RUN_TIMEOUT}s"
            time.sleep(0.3)
        logs = podman("logs", container)
        assert state[1] == "0", \
            f"the pod's script exited with {state[1]}:\n{logs.stdout[-3000:]}\n{logs.stderr[-6000:]}"
        user = podman("inspect", "--format", "{{.Config.User}}", container).stdout.strip()
        assert user == "65534", user
        stats = ctl_json(address, "stats")
    finally:
        if yaml_path.exists():
            podman("kube", "down", str(yaml_path), check=False, timeout=120)
        podman("pod", "rm", "-f", "--ignore", unique, check=False, timeout=120)
    assert not salus_lines(logs.stderr), f"the adapter warned:\n{logs.stderr[-4000:]}"
    return logs, seen, stats


def check_pod_result(logs, seen: dict, stats: dict, local: dict, unique: str, tenant: str) -> None:
    remote = last_json_line(logs.stdout)
    assert_devices(remote, SERVER_JOB)
    assert_same_numbers(local, remote)
    jobs = [row for row in seen.values() if row["name"].split("?")[0] == unique]
    assert jobs and all(row["tenant"] == tenant and row["kind"] == "eager" for row in jobs), seen
    assert any(t["tenant"] == tenant and t["device_s"] > 0 for t in stats["tenants"]), stats["tenants"]


def test_a_pod_trains_through_the_hosts_server_with_its_token(tmp_path, local_result):
    server = SalusProcess(tmp_path / "salus-server.stderr.log", extra_args=("--memory-capacity", "2GiB"))
    unique = f"salus-test-pod-{os.getpid()}"
    try:
        token = ctl_json(server.address, "token", "issue", "--tenant", "pod-1", "--memory", "512MiB")
        logs, seen, stats = run_training_pod(tmp_path, unique, server.address, token["token"])
    finally:
        server.stop()
    check_pod_result(logs, seen, stats, local_result, unique, "pod-1")


SYSTEM_PYTHON = "/usr/bin/python3"  # with PyYAML (python3-yaml): the venv has none

DAEMONSET_AS_POD = r"""
import sys, yaml
text, name, port, plugins = sys.stdin.read(), sys.argv[1], sys.argv[2], sys.argv[3]
# A free port for the node's 5501; podman expands no $(VAR) in args (Kubernetes does), and has no
# status.hostIP: the node's address is loopback here.
text = text.replace("127.0.0.1:5501", "127.0.0.1:" + port).replace("$(NODE_IP):5501", "127.0.0.1:" + port)
docs = list(yaml.safe_load_all(text))
config = next(d for d in docs if d["kind"] == "ConfigMap")
config["metadata"].pop("namespace", None)
config["data"]["SALUS_LISTEN"] = "127.0.0.1:" + port
template = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]
spec = template["spec"]
for c in spec["containers"]:
    c.pop("ports", None)  # podman refuses port mappings with hostNetwork (Kubernetes ignores them)
    for e in c.get("env", []):
        if e["name"] == "NODE_IP":
            e.pop("valueFrom")
            e["value"] = "127.0.0.1"
for v in spec["volumes"]:
    if v.get("hostPath", {}).get("path") == "/var/lib/kubelet/device-plugins":
        v["hostPath"]["path"] = plugins
pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": template["metadata"]["labels"]},
       "spec": spec}
print(yaml.safe_dump_all([config, pod]))
"""


def test_the_daemonset_pod_serves_a_training_pod_through_its_device_plugin(api, tmp_path, local_result):
    """deploy/k8s/daemonset.yaml's pod (server + device plugin), played as a Pod with a stand-in kubelet on its
    device-plugin directory: the plugin registers and advertises the ConfigMap's 16 GiB as 64 units; the
    kubelet's Allocate of 8 units gives SALUS_SERVER and SALUS_TOKEN; training-pod.yaml trains with them."""
    if not Path(SYSTEM_PYTHON).exists() or subprocess.run([SYSTEM_PYTHON, "-c", "import yaml"]).returncode != 0:
        pytest.skip(f"{SYSTEM_PYTHON} has no PyYAML (apt-get install python3-yaml)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    node = f"salus-test-node-{os.getpid()}"
    node_yaml = tmp_path / "node.yaml"
    node_yaml.write_text(subprocess.run([SYSTEM_PYTHON, "-c", DAEMONSET_AS_POD, node, port, str(plugins)],
                                        input=DAEMONSET_YAML.read_text(), capture_output=True, text=True,
                                        check=True, timeout=60).stdout)
    kubelet = StandInKubelet(api, plugins)
    address = f"127.0.0.1:{port}"
    try:
        podman("kube", "play", str(node_yaml), timeout=120)
        registration = kubelet.registered(timeout=60)
        assert registration.resource_name == "salus.io/gpu-mem", registration
        stub = kubelet.plugin(registration.endpoint)
        pb = kubelet.pb
        deadline = time.monotonic() + 120
        for response in stub.ListAndWatch(pb.Empty(), timeout=120):  # healthy once the server answers
            if len(response.devices) == 64 and all(d.health == "Healthy" for d in response.devices):
                break
            assert time.monotonic() < deadline, "the plugin never advertised 64 healthy units"
        reply = stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(
            devices_ids=[f"salus-mem-{i}" for i in range(8)])]), timeout=30).container_responses[0]
        env = dict(reply.envs)
        assert env["SALUS_SERVER"] == address, env
        tenant = reply.annotations["salus.io/tenant"]
        unique = f"salus-test-k8s-pod-{os.getpid()}"
        logs, seen, stats = run_training_pod(tmp_path, unique, env["SALUS_SERVER"], env["SALUS_TOKEN"])
    finally:
        for container in (f"{node}-salus-server", f"{node}-salus-device-plugin"):  # shown if the test fails
            print(f"--- {container}:\n{podman('logs', container, check=False).stderr[-3000:]}")
        podman("kube", "down", str(node_yaml), check=False, timeout=120)
        podman("pod", "rm", "-f", "--ignore", node, check=False, timeout=120)
        kubelet.stop()
    check_pod_result(logs, seen, stats, local_result, unique, tenant)
