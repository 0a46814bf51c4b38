#!/bin/sh
# Installs the optional Debian packages the benchmark scenarios use (loadtest/scenarios/), or
# says exactly how to: nginx (the reference proxy of scenario 1), gnuplot-nox (baton-bench
# --plot), iperf3 (a loopback bandwidth baseline). Nothing here is needed to build or test.
set -eu

want_nginx=1
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
    want_nginx=0
fi

missing=""
for p in gnuplot-nox iperf3; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
if [ "$want_nginx" -eq 1 ]; then
    # nginx-light is the smallest build with the proxy and upstream keep-alive modules.
    if apt-cache show nginx-light >/dev/null 2>&1; then
        missing="$missing nginx-light"
    else
        missing="$missing nginx"
    fi
fi

if [ -z "$missing" ]; then
    echo "baton: benchmark packages already installed"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "baton: missing optional benchmark packages:$missing" >&2
    echo "baton: run as root, then retry:" >&2
    echo "    apt-get update && apt-get install -y$missing" >&2
    exit 1
fi

echo "baton: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $missing
# The scenarios start their own nginx on a free loopback port with a generated configuration;
# the distribution's service is not used.
echo "baton: done (the scenarios never use the system nginx service or its port 80)"
