#!/bin/sh
# The systemd tools some tests run: systemd-socket-activate, systemd-analyze (Debian's `systemd`
# package; for socket activation and `systemd-analyze verify/security` of the unit files in systemd/)
# and libseccomp (scripts/sandbox-exec.py loads it); and an aarch64 cross compiler with qemu-user
# (tests/native/test_isa_paths.py builds the kernel's panels for aarch64 and runs them). No running
# systemd is needed: the tests never talk to a service manager. pip has none of them.
#
# Never needs root. Does nothing when they are present. As root on a Debian-like system it installs
# them with apt-get (that is CI's root leg; its unprivileged leg then finds them system-wide).
# Otherwise it says what to run and exits 0: the tests that need them are then named in the run's
# summary as ones this host cannot run (a failure only under CI=true; tests/skip_policy.py).
set -eu

missing=""
for tool in systemd-socket-activate systemd-analyze; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
seccomp=""
for lib in /usr/lib/*/libseccomp.so.2 /lib/*/libseccomp.so.2 /usr/lib64/libseccomp.so.2; do
    [ -e "$lib" ] && seccomp=$lib
done
[ -n "$seccomp" ] || missing="$missing libseccomp.so.2"
for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
[ -z "$missing" ] && exit 0

echo "ensure-systemd-tools: missing:$missing" >&2
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends systemd libseccomp2 g++-aarch64-linux-gnu qemu-user >/dev/null
    echo "ensure-systemd-tools: installed systemd, libseccomp2, g++-aarch64-linux-gnu and qemu-user" >&2
else
    echo "ensure-systemd-tools: to run the tests that need them:" \
         "sudo apt-get install systemd libseccomp2 g++-aarch64-linux-gnu qemu-user" >&2
    echo "ensure-systemd-tools: until then they are listed as ones this host cannot run (failures under CI=true)" >&2
fi
