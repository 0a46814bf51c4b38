#!/bin/sh
# Installs the optional Debian packages the benchmark scenarios use (loadtest/scenarios/), or
# says exactly how to: nginx (the reference proxy of scenario 1), gnuplot-nox (baton-bench
# --plot), iperf3 (a loopback bandwidth baseline), linux-perf and valgrind (profile.py's two
# tools). Nothing here is needed to build or test.
set -eu

want_nginx=1
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
    want_nginx=0
fi

. "$(dirname "$0")/apt-lib.sh"
missing=$(missing_pkgs gnuplot-nox iperf3 linux-perf valgrind)
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

apt_install "optional benchmark packages" "$missing"
# The scenarios start their own nginx on a free loopback port with a generated configuration;
# the distribution's service is not used.
echo "baton: done (the scenarios never use the system nginx service or its port 80)"
