#!/bin/sh
# Installs the Debian packages Baton builds against, or says exactly how to.
# --test adds what only the test suite uses (promtool, from the prometheus package; etcd for the
# shared-registry tests; python3-yaml for the deploy/ manifest checks; the openssl CLI, which
# makes the TLS tests' certificates; clang and libFuzzer's runtime for the fuzz harnesses,
# `make fuzz`).
set -eu

PKGS="build-essential cmake pkg-config libuv1-dev node-llhttp libjansson-dev libmbedtls-dev
libcmocka-dev libibverbs-dev python3 curl procps"
if [ "${1:-}" = "--test" ]; then
    PKGS="$PKGS prometheus etcd-server python3-yaml openssl"
    PKGS="$PKGS clang libclang-rt-14-dev"
fi

. "$(dirname "$0")/apt-lib.sh"
# shellcheck disable=SC2086
missing=$(missing_pkgs $PKGS)
if [ -n "$missing" ]; then
    apt_install "Debian packages" "$missing"
fi
