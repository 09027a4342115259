"""The systemd units in deploy/systemd pass `systemd-analyze verify` (no systemd needs to run: it parses the
units, their directives and the executable they start), and the settings file they read starts a real server
whose `ctl capacity` reports the memory an engine's config is sized from. Costs about 2 s.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import SalusProcess, server_bin
from server_ctl import ctl, ctl_json

UNITS = Path(__file__).resolve().parent.parent / "deploy" / "systemd"


def installed(tmp: Path, unit: str, as_name: str) -> Path:
    """The unit as a node would install it (the release wheel in /opt/salus/venv), with the binary and /etc/salus
    pointed into this checkout."""
    text = (UNITS / unit).read_text()
    text = text.replace("/opt/salus/venv/bin/salus-server-stop", str(UNITS / "salus-server-stop"))
    text = text.replace("/opt/salus/venv/bin/salus-server ", str(server_bin().resolve()) + " ")
    text = text.replace("/opt/salus/venv/bin/salus-server\n", str(server_bin().resolve()) + "\n")
    text = text.replace("/etc/salus", str(tmp))
    path = tmp / as_name
    path.write_text(text)
    return path


def verify(*units: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", *map(str, units)], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture(scope="module")
def analyze():
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is missing (Debian: apt-get install systemd)")


def test_units_verify_cleanly(analyze, tmp_path):
    (tmp_path / "salus-server-0.env").write_text("SALUS_LISTEN=127.0.0.1:5601\n")
    units = [installed(tmp_path, "salus-server.service", "salus-server.service"),
             installed(tmp_path, "salus-server@.service", "salus-server@0.service"),
             installed(tmp_path, "salus-server.socket", "salus-server.socket")]
    done = verify(*units)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    # The check can fail: a unit with a directive systemd does not know is reported.
    broken = tmp_path / "broken.service"
    broken.write_text(units[0].read_text().replace("Type=exec", "Type=exec\nRestartAfter=2s"))
    done = verify(broken)
    assert "RestartAfter" in done.stderr, done.stderr


def test_the_settings_file_starts_a_server_that_reports_its_capacity(tmp_path):
    settings = {}
    for line in (UNITS / "salus-server.env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, value = line.split("=", 1)
            settings[name] = value
    assert settings["SALUS_MEMORY_CAPACITY"] == "16GiB", settings
    server = SalusProcess(tmp_path / "salus-server.stderr.log", env=settings)
    try:
        capacity = ctl_json(server.address, "capacity")
        assert capacity["capacity_mib"] == 16384 and capacity["unreserved_mib"] == 16384, capacity
        text = ctl(server.address, "capacity").stdout
        assert "Gres=salusmem:16384" in text and '"salus_mem_mib": 16384' in text, text
        ctl(server.address, "token", "issue", "--tenant", "agent", "--memory", "4GiB")
        assert ctl_json(server.address, "capacity")["unreserved_mib"] == 12288
    finally:
        assert server.stop() == 0, server.stderr_tail()


def test_capacity_without_memory_capacity_says_what_to_set(tmp_path):
    server = SalusProcess(tmp_path / "salus-server.stderr.log")
    try:
        done = ctl(server.address, "capacity", check=False)
        assert done.returncode != 0 and "--memory-capacity" in done.stderr, done.stderr
    finally:
        assert server.stop() == 0, server.stderr_tail()
