#!/bin/sh
# Make sure the systemd tools the tests use are installed: systemd-socket-activate, systemd-analyze
# (Debian's `systemd` package) and libseccomp (a dependency of it; scripts/sandbox-exec.py loads it).
# Idempotent: does nothing when they are present. Installs with apt-get only when running as root on
# a Debian-like system; otherwise prints what to run and exits 0 (the tests that need the tools then fail, saying what to run).
# No running systemd is needed: the tests never talk to a service manager.
set -eu

missing=""
for tool in systemd-socket-activate systemd-analyze; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
if ! ls /usr/lib/*/libseccomp.so.2 /lib/*/libseccomp.so.2 >/dev/null 2>&1; then
    missing="$missing libseccomp.so.2"
fi
[ -z "$missing" ] && exit 0

echo "ensure-systemd-tools: missing:$missing" >&2
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends systemd libseccomp2 >/dev/null
    echo "ensure-systemd-tools: installed systemd and libseccomp2" >&2
else
    echo "ensure-systemd-tools: install them with: sudo apt-get install systemd libseccomp2" >&2
    echo "ensure-systemd-tools: until then the tests that need them fail" >&2
fi
