#!/usr/bin/env bash
# Installs Slurm (Debian bookworm: Slurm 22.05) and munge for deploy/slurm and
# integration_tests/test_slurm.py, which start their own munged, slurmctld and slurmd under a temporary
# directory. Idempotent: does nothing when every command is already there. Called by scripts/setup.sh.
#
# Debian's install scripts would start munge and the Slurm daemons: a policy-rc.d that refuses service
# starts keeps them from it (ours is put in place only if there is none, and removed afterwards), and a
# daemon started anyway is stopped by the PID it wrote. Not root: says why and exits 0 (the tests skip).
set -uo pipefail

packages=(slurm-wlm slurmctld slurmd slurm-client munge libslurm-dev)
commands=(slurmctld slurmd sbatch srun scontrol squeue munged mungekey)

missing=()
for c in "${commands[@]}"; do
    command -v "$c" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$c" >/dev/null 2>&1 || missing+=("$c")
done
# slurm/spank.h comes with libslurm-dev.
[[ -f /usr/include/slurm/spank.h ]] || missing+=("libslurm-dev")
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "setup_slurm: Slurm and munge are installed ($(slurmctld -V 2>/dev/null || echo slurmctld))"
    exit 0
fi

if [[ "$(id -u)" != 0 ]]; then
    echo "setup_slurm: missing ${missing[*]}; run as root (apt-get install ${packages[*]}) or integration_tests/test_slurm.py skips" >&2
    exit 0
fi

echo "setup_slurm: installing Debian's ${packages[*]} (missing: ${missing[*]})"
own_policy=""
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\n# Added by salus scripts/setup_slurm.sh while installing Slurm.\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    own_policy=1
fi
install_slurm() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
}
status=0
# A fresh container has no package lists yet: update once, then retry.
if ! install_slurm && ! { apt-get update -qq && install_slurm; }; then
    echo "setup_slurm: could not install ${packages[*]}; integration_tests/test_slurm.py skips" >&2
    status=1
fi
if [[ -n "$own_policy" ]]; then
    rm -f /usr/sbin/policy-rc.d
fi
# Daemons the install started anyway (systemd present, or a policy-rc.d of someone else's that allowed it).
if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
    for unit in slurmctld slurmd munge; do
        systemctl stop "$unit" 2>/dev/null || true
        systemctl disable "$unit" 2>/dev/null || true
    done
fi
for pidfile in /run/slurmctld.pid /run/slurmd.pid /var/run/slurmctld.pid /var/run/slurmd.pid \
               /run/munge/munged.pid /var/run/munge/munged.pid; do
    if [[ -f "$pidfile" ]]; then
        pid="$(cat "$pidfile" 2>/dev/null)"
        [[ "$pid" =~ ^[0-9]+$ ]] && kill "$pid" 2>/dev/null && echo "setup_slurm: stopped a daemon the install started (pid $pid, $pidfile)"
    fi
done
[[ $status -eq 0 ]] && echo "setup_slurm: installed $(slurmctld -V 2>/dev/null)"
# Failing to install is not this script's caller's failure: the Slurm tests skip, saying so.
exit 0
