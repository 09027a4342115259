#!/usr/bin/env bash
# What only the tests need from the system, installed by scripts/test.sh (never by scripts/setup.sh, which
# changes nothing outside the checkout): Debian's Prometheus (promtool and server, for
# integration_tests/test_metrics.py), Debian's Slurm (munge, slurmctld, slurmd) and Ray in a venv of its own
# (.venv-ray), for integration_tests/test_slurm.py and test_ray.py. As root it apt-installs packages; as another
# user it says what is missing and the suites that need it skip. Idempotent and quick once done.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# Prometheus' promtool and server, for integration_tests/test_metrics.py (a real Prometheus scrapes
# the server). Debian's package ships both. Its install scripts would start a prometheus daemon:
# a policy-rc.d that refuses service starts keeps them from it (ours is removed afterwards), and a
# daemon started anyway (systemd) is stopped by the PID it wrote. Tests start their own Prometheus.
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    if [[ "$(id -u)" != 0 ]]; then
        echo "setup_test_tools: promtool/prometheus are missing; run as root (apt-get install prometheus) or the metrics test skips" >&2
    else
        echo "setup_test_tools: installing Debian's prometheus package (promtool, prometheus)"
        own_policy=""
        if [[ ! -e /usr/sbin/policy-rc.d ]]; then
            printf '#!/bin/sh\n# Added by salus scripts/setup.sh while installing prometheus.\nexit 101\n' >/usr/sbin/policy-rc.d
            chmod +x /usr/sbin/policy-rc.d
            own_policy=1
        fi
        install_prometheus() {
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
        }
        # A fresh container has no package lists yet: update once, then retry.
        if ! install_prometheus && ! { apt-get update -qq && install_prometheus; }; then
            echo "setup_test_tools: could not install prometheus; the metrics tests that need it skip" >&2
        fi
        if [[ -n "$own_policy" ]]; then
            rm -f /usr/sbin/policy-rc.d
        fi
        if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
            systemctl stop prometheus 2>/dev/null || true
            systemctl disable prometheus 2>/dev/null || true
        fi
        for pidfile in /run/prometheus/prometheus.pid /run/prometheus.pid; do
            [[ -f "$pidfile" ]] && kill "$(cat "$pidfile")" 2>/dev/null || true
        done
    fi
fi

# The cluster engines: Debian's Slurm (apt, as root) and Ray 2.60 in .venv-ray.
bash scripts/setup_slurm.sh
bash scripts/setup_ray.sh

