"""The release wheel (issue 54), installed as an operator would: scripts/build_release.sh packs the binaries the
suite runs (no cargo build: SALUS_BIN_DIR is their directory) into a release wheel (in a temporary directory, not
dist/), which goes into a fresh venv with tensorflow-cpu==2.21.0 (`salus-tf[cpu]`: from PyPI, or pip's cache where
it keeps one; about 260 MB), and from a directory
outside the checkout, with no checkout path in the environment nor in a binary's search path, `salus-server
--version` says the workspace's version, the server starts (--isolation tenant: the supervisor and an executor
from the wheel, whose Hello carries the same version) and trains the TF1 demo (scripts/demo.py) and the Keras 3
demo (scripts/demo_tf2.py) through it, each comparing its numbers with the same code run in-process in that venv.
A second venv with the wheel and no TensorFlow shows the launcher's error naming both TensorFlow wheels, and the
launcher finding a TensorFlow outside the venv (LD_LIBRARY_PATH) where the binary's relative rpath cannot, and
refusing another TensorFlow release.

Costs 95-185 s on 2 shared cores (measured alone: the wheel ~20-40 s, pip installing tensorflow-cpu into the fresh
venv ~30-90 s, the two demos ~20-30 s), beside the other files under scripts/test.sh.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import LISTEN_RE, REPO, START_TIMEOUT_S, server_bin

VERSION = re.search(r'^\[workspace\.package\]\s*$.*?^version = "([^"]+)"', (REPO / "Cargo.toml").read_text(),
                    re.M | re.S).group(1)
# The wheel's spelling of it (PEP 440: Cargo's 0.3.0-rc.1 is 0.3.0rc1; python/hatch_build.py).
PY_VERSION = re.sub(r"-(alpha|beta|rc)\.?(\d+)$",
                    lambda m: {"alpha": "a", "beta": "b", "rc": "rc"}[m.group(1)] + m.group(2), VERSION)
TF_RELEASE = "2.21.0"
INSTALL_LIMIT_S = 20 * 60
DEMO_LIMIT_S = 10 * 60


def clean_env(venv: Path, home: Path) -> dict:
    """An operator's shell with only `venv` activated: nothing of the checkout, nor of the suite's settings."""
    env = {k: v for k, v in os.environ.items()
           if k in ("LANG", "LC_ALL", "TERM", "TMPDIR", "PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_FIND_LINKS",
                    "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
                    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")}
    env.update(PATH=f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", HOME=os.environ.get("HOME", str(home)),
               VIRTUAL_ENV=str(venv), TF_CPP_MIN_LOG_LEVEL="2", PIP_DISABLE_PIP_VERSION_CHECK="1")
    leaked = {k: v for k, v in env.items() if str(REPO) in v}
    assert not leaked, f"the checkout's path leaks into the operator's environment: {leaked}"
    return env


def run(cmd: list, env: dict, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def search_paths(binary: Path) -> str:
    """The RPATH/RUNPATH entries of an ELF file ("" when it has none)."""
    out = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
    return ":".join(re.findall(r"\((?:RPATH|RUNPATH)\).*\[(.*)\]", out))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, SALUS_BIN_DIR=str(server_bin().resolve().parent))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build_release.sh"), "--no-build", "--out", str(out)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=INSTALL_LIMIT_S,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"build_release.sh failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    print(proc.stdout.strip().splitlines()[-2])
    wheels = list(out.glob(f"salus_tf-{PY_VERSION}-py3-none-manylinux_*.whl"))
    assert len(wheels) == 1, f"expected one manylinux wheel of {VERSION} in {out}: {os.listdir(out)}\n{proc.stdout}"
    return wheels[0]


@pytest.fixture(scope="module")
def operator(tmp_path_factory, wheel):
    """A fresh venv with the wheel and TensorFlow (CPU), and a working directory outside the checkout."""
    home = tmp_path_factory.mktemp("operator")
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = clean_env(venv, home)
    proc = run([venv / "bin" / "pip", "install", "--quiet", f"{wheel}[cpu]"], env, home, INSTALL_LIMIT_S)
    assert proc.returncode == 0, f"pip install {wheel.name}[cpu] failed:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
    return venv, env, home


def test_the_wheel_carries_the_binaries_with_no_path_of_this_machine(operator):
    venv, env, home = operator
    site = site_packages(venv, env, home)
    bin_dir = site / "salus" / "_bin"
    for name in ("salus-server", "salus-supervisor", "salus", "salus-device-plugin", "libsalus_tf.so"):
        path = bin_dir / name
        assert path.is_file(), f"the wheel installed no {path}"
        paths = search_paths(path)
        assert paths in ("", "$ORIGIN/../../tensorflow"), f"{name} searches {paths}"
    # The loader finds TensorFlow's libraries in the venv's own tensorflow package, through the relative rpath.
    ldd = run(["ldd", bin_dir / "salus-server"], env, home, 60).stdout
    tf_lines = [line for line in ldd.splitlines() if "libtensorflow" in line]
    assert len(tf_lines) == 2 and all(f"{site}/salus/_bin/../../tensorflow/" in line for line in tf_lines), ldd
    assert "not found" not in ldd and str(REPO) not in ldd, ldd
    # The CLI links no TensorFlow; its man pages and shell completions come with it.
    cli_ldd = run(["ldd", bin_dir / "salus"], env, home, 60).stdout
    assert "libtensorflow" not in cli_ldd and "not found" not in cli_ldd, cli_ldd
    prefix = venv  # the wheel's data files go under the install's prefix
    for path in ("share/man/man1/salus.1", "share/man/man1/salus-jobs.1", "share/bash-completion/completions/salus",
                 "share/zsh/site-functions/_salus", "share/fish/vendor_completions.d/salus.fish"):
        assert (prefix / path).is_file(), f"the wheel installed no {path}"


def test_the_wheel_installs_the_systemd_units_and_their_stop_script(operator):
    venv, env, home = operator
    units = venv / "share" / "salus" / "systemd"
    for name in ("salus-server.service", "salus-server@.service", "salus-server.socket",
                 "salus-server.env.example"):
        assert (units / name).read_bytes() == (REPO / "deploy" / "systemd" / name).read_bytes(), name
    stop = venv / "bin" / "salus-server-stop"
    assert os.access(stop, os.X_OK) and stop.read_bytes() == (REPO / "deploy" / "systemd" /
                                                              "salus-server-stop").read_bytes()


def test_the_deploy_files_name_this_versions_image():
    tags = {}
    for path in sorted((REPO / "deploy" / "k8s").glob("*.yaml")):
        for tag in re.findall(r"localhost/salus:([\w.-]+)", path.read_text()):
            tags.setdefault(path.name, set()).add(tag)
    assert tags.keys() >= {"daemonset.yaml", "training-pod.yaml"}, tags
    stale = {name: found - {VERSION, f"{VERSION}-gpu"} for name, found in tags.items()
             if found - {VERSION, f"{VERSION}-gpu"}}
    assert not stale, f"deploy/k8s names images of another version than Cargo.toml's {VERSION}: {stale}"


def test_the_sdist_builds_a_wheel_of_the_same_version(tmp_path, wheel):
    """An sdist of python/ carries Cargo.toml's version and admin.proto, and builds a (pure) wheel elsewhere."""
    tools = REPO / ".venv-release" / "bin"  # build_release.sh made it (hatchling, grpcio-tools)
    sdist_dir, wheel_dir = tmp_path / "sdist", tmp_path / "wheel"
    proc = subprocess.run([str(tools / "python"), "-m", "hatchling", "build", "-t", "sdist", "-d", str(sdist_dir)],
                          cwd=REPO / "python", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (sdist,) = sdist_dir.glob(f"salus_tf-{PY_VERSION}.tar.gz")
    subprocess.run(["tar", "xzf", str(sdist), "-C", str(tmp_path)], check=True, timeout=60)
    proc = subprocess.run([str(tools / "pip"), "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "--wheel-dir", str(wheel_dir), "."], cwd=tmp_path / f"salus_tf-{PY_VERSION}",
                          capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "SALUS_RELEASE_BIN_DIR"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [p.name for p in wheel_dir.iterdir()] == [f"salus_tf-{PY_VERSION}-py3-none-any.whl"]


def test_one_version_everywhere(operator):
    venv, env, home = operator
    assert run([venv / "bin" / "salus-server", "--version"], env, home, 60).stdout.strip() == f"salus-server {VERSION}"
    # The supervisor (it links no TensorFlow, so it runs directly) parses the server's flags and says the same.
    supervisor = site_packages(venv, env, home) / "salus" / "_bin" / "salus-supervisor"
    assert run([supervisor, "--version"], env, home, 60).stdout.strip() == f"salus-server {VERSION}"
    assert run([venv / "bin" / "salus", "--version"], env, home, 60).stdout.strip() == f"salus {VERSION}"
    probe = ("import importlib.metadata as m, salus; "
             "print(salus.__version__, m.version('salus-tf'), m.version('tensorflow-cpu'))")
    assert run([venv / "bin" / "python", "-c", probe], env, home, 60).stdout.split() == [PY_VERSION, PY_VERSION,
                                                                                         TF_RELEASE]


def test_the_server_from_the_wheel_trains_both_demos_as_in_process(operator):
    venv, env, home = operator
    demos = home / "demos"
    demos.mkdir()
    for name in ("demo.py", "demo_tf2.py"):
        shutil.copy2(REPO / "scripts" / name, demos / name)
    log = open(home / "server.log", "ab")
    # The launcher execs the binary: this process is the server (and then the supervisor), stopped by its PID.
    server = subprocess.Popen([str(venv / "bin" / "salus-server"), "--listen", "127.0.0.1:0",
                               "--state-dir", str(home / "state")],
                              env=env, cwd=home, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
    try:
        found: list[str] = []
        ready = threading.Event()

        def reader():
            for raw in server.stdout:  # drains the pipe for the server's whole life
                m = LISTEN_RE.match(raw.decode(errors="replace"))
                if m and not found:
                    found.append(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=reader, daemon=True).start()
        assert ready.wait(START_TIMEOUT_S) and found, \
            f"the wheel's server did not start:\n{(home / 'server.log').read_text()[-4000:]}"
        address = found[0]

        tf1 = run([venv / "bin" / "python", demos / "demo.py", "--target", f"grpc://{address}", "--steps", "300",
                   "--log-every", "300"], env, demos, DEMO_LIMIT_S)
        assert tf1.returncode == 0, f"the TF1 demo failed:\n{tf1.stdout[-3000:]}{tf1.stderr[-3000:]}"
        assert f"demo: trained 300 steps through grpc://{address}" in tf1.stdout, tf1.stdout

        keras = run([venv / "bin" / "python", demos / "demo_tf2.py", "--server", address], env, demos, DEMO_LIMIT_S)
        assert keras.returncode == 0, f"the Keras 3 demo failed:\n{keras.stdout[-3000:]}{keras.stderr[-3000:]}"
        assert "variables on the server: True; numbers equal to in-process: True" in keras.stdout, keras.stdout
        print(tf1.stdout.strip().splitlines()[-1])
        print(keras.stdout.strip().splitlines()[-1])
        # The wheel's CLI talks to the wheel's server; the demos' jobs are gone, the server is healthy.
        info = run([venv / "bin" / "salus", "--server", address, "info", "--json"], env, home, 60)
        assert info.returncode == 0, info.stderr
        assert json.loads(info.stdout)["version"] == VERSION, info.stdout
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        log.close()
    # The executor that ran the jobs came from the wheel and said the same release in its Hello: a release
    # mismatch is refused (node/src/supervisor/executors.rs), so the jobs above could not have run otherwise.
    assert server.returncode == 0, f"the server exited with {server.returncode}:\n" \
                                   f"{(home / 'server.log').read_text()[-4000:]}"


def site_packages(venv: Path, env: dict, cwd: Path) -> Path:
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(run([venv / "bin" / "python", "-c", probe], env, cwd, 60).stdout.strip())


def test_the_launcher_names_both_wheels_or_finds_tensorflow_elsewhere(tmp_path, wheel, operator):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = clean_env(venv, tmp_path)
    proc = run([venv / "bin" / "pip", "install", "--quiet", "--no-deps", wheel], env, tmp_path, 300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # No TensorFlow: the launcher says which wheels to install.
    proc = run([venv / "bin" / "salus-server", "--version"], env, tmp_path, 60)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "has no `tensorflow` package" in proc.stderr, proc.stderr
    assert "tensorflow-cpu==2.21.0" in proc.stderr and "tensorflow[and-cuda]==2.21.0" in proc.stderr, proc.stderr
    # The device plugin links no TensorFlow: its launcher runs it all the same.
    plugin = run([venv / "bin" / "salus-device-plugin", "--version"], env, tmp_path, 60)
    assert plugin.returncode == 0 and VERSION in plugin.stdout, (plugin.stdout, plugin.stderr)

    # TensorFlow in another directory of the interpreter's path (here: the operator venv's, through PYTHONPATH):
    # the relative rpath does not reach it, the launcher finds it and passes it in LD_LIBRARY_PATH.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    operator_site = site_packages(operator[0], operator[1], operator[2])
    (elsewhere / "tensorflow").symlink_to(operator_site / "tensorflow")
    for info in operator_site.glob("tensorflow_cpu-*.dist-info"):
        (elsewhere / info.name).symlink_to(info)
    binary = site_packages(venv, env, tmp_path) / "salus" / "_bin" / "salus-server"
    direct = run([binary, "--version"], env, tmp_path, 60)
    assert direct.returncode != 0 and "libtensorflow" in direct.stderr, (direct.stdout, direct.stderr)
    found = run([venv / "bin" / "salus-server", "--version"], {**env, "PYTHONPATH": str(elsewhere)}, tmp_path, 60)
    assert (found.returncode, found.stdout.strip()) == (0, f"salus-server {VERSION}"), (found.stdout, found.stderr)

    # Another TensorFlow release (its libraries share the soname) is refused before the binary runs.
    other = tmp_path / "other-release"
    other.mkdir()
    (other / "tensorflow").symlink_to(operator_site / "tensorflow")
    info = other / "tensorflow_cpu-2.16.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow-cpu\nVersion: 2.16.2\n")
    refused = run([venv / "bin" / "salus-server", "--version"], {**env, "PYTHONPATH": str(other)}, tmp_path, 60)
    assert refused.returncode == 1 and "built for TensorFlow 2.21 and the installed one is 2.16.2" in refused.stderr, \
        (refused.stdout, refused.stderr)
