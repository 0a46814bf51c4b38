#!/bin/sh
# Installs the Debian packages Baton builds against, or says exactly how to.
# --test adds what only the test suite uses (promtool, from the prometheus package).
set -eu

PKGS="build-essential cmake pkg-config libuv1-dev node-llhttp libjansson-dev libmbedtls-dev
libcmocka-dev libibverbs-dev python3 curl procps"
if [ "${1:-}" = "--test" ]; then
    PKGS="$PKGS prometheus"
fi

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

if [ -z "$missing" ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "baton: missing Debian packages:$missing" >&2
    echo "baton: run as root, then retry:" >&2
    echo "    apt-get update && apt-get install -y$missing" >&2
    exit 1
fi

echo "baton: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $missing
