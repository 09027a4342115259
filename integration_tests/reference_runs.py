"""In-process reference runs, cached between test sessions (issue 38: the suite in 15 minutes).

A workload run in-process (no SALUS_* variable, so the adapter stays out of it) prints the numbers a run through
the server must equal. Its output depends only on what it runs: the workload scripts and the helpers they
import, the Python packages of the interpreter (TensorFlow's version among them), the adapter's source, the
environment variables that steer TensorFlow and Python, and the machine (oneDNN kernels and float results
differ by CPU, thread pools by core count). Those make the key; a successful run's exit code, stdout and stderr
are kept under it in $SALUS_TEST_CACHE (default ~/.cache/salus-tests) and replayed instead of running again.
SALUS_TEST_CACHE=off runs every reference. A run through the server is never cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

from conftest import REPO, TESTS

# The variables that can change what an in-process TensorFlow script computes or prints.
_KEY_PREFIXES = ("TF_", "KERAS", "PYTHONHASHSEED", "OMP_", "MKL_", "KMP_", "CUDA_", "XLA_", "LD_PRELOAD",
                 "LD_LIBRARY_PATH")


def cache_dir() -> Path | None:
    raw = os.environ.get("SALUS_TEST_CACHE", "")
    if raw.lower() in ("off", "0", "no"):
        return None
    return Path(raw) if raw else Path.home() / ".cache" / "salus-tests"


def is_reference(env: dict) -> bool:
    return not any(k.startswith("SALUS_") for k in env)


def run(argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run(argv) with captured text output, replayed from the cache when the same reference ran
    successfully before (argv[0] is the interpreter, argv[1] the script)."""
    root = cache_dir()
    key = _key(argv, env) if root is not None and is_reference(env) else None
    entry = root / "reference-runs" / f"{key}.json" if key else None
    if entry is not None and entry.exists():
        try:
            saved = json.loads(entry.read_text())
            return subprocess.CompletedProcess(argv, saved["returncode"], saved["stdout"], saved["stderr"])
        except (OSError, ValueError, KeyError):
            pass  # a damaged entry: run again and rewrite it
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    if entry is not None and proc.returncode == 0:
        entry.parent.mkdir(parents=True, exist_ok=True)
        partial = entry.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"returncode": proc.returncode, "stdout": proc.stdout,
                                       "stderr": proc.stderr, "argv": argv[1:]}))
        partial.replace(entry)
    return proc


def _key(argv: list[str], env: dict) -> str:
    h = hashlib.sha256()

    def add(label: str, value) -> None:
        h.update(f"{label}={value}\n".encode())

    python = Path(argv[0])
    add("python", _python_version(python))
    add("packages", sorted(p.name for p in _site_packages(python).glob("*.dist-info")))
    # Paths inside this checkout stand for their content, so that another clone shares the entry.
    for arg in argv[1:]:
        path = Path(arg)
        if path.is_file():
            add("file", hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            add("arg", arg)
    helpers = [p for p in TESTS.rglob("*.py") if not p.name.startswith("test_")]
    helpers += list((REPO / "python" / "src").rglob("*.py"))
    for path in sorted(helpers):
        add(path.relative_to(REPO), hashlib.sha256(path.read_bytes()).hexdigest())
    for name in sorted(env):
        if name.startswith(_KEY_PREFIXES):
            add(f"env {name}", env[name])
    add("machine", _machine())
    return h.hexdigest()


def _python_version(python: Path) -> str:
    cfg = python.parent.parent / "pyvenv.cfg"
    if cfg.exists():
        for line in cfg.read_text().splitlines():
            if line.replace(" ", "").startswith("version="):
                return line.split("=", 1)[1].strip()
    return str(python.resolve())


def _site_packages(python: Path) -> Path:
    candidates = sorted((python.parent.parent / "lib").glob("python3*/site-packages"))
    return candidates[0] if candidates else Path(os.devnull)


def _machine() -> str:
    model, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.machine()} {model} {hashlib.sha256(flags.encode()).hexdigest()} cores={os.cpu_count()}"
