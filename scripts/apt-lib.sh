# apt-lib.sh — sourced by the install scripts: which Debian packages are missing, and installing
# them (as root) or printing the exact apt-get line to run.

# missing_pkgs PKG...: prints those not installed, each preceded by a space ("" when none).
missing_pkgs() {
    m=""
    for p in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
            m="$m $p"
        fi
    done
    printf '%s' "$m"
}

# apt_install WHAT MISSING: installs MISSING (as printed by missing_pkgs) when root; otherwise
# names them ("baton: missing WHAT: ...") with the line to run, and exits 1.
apt_install() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "baton: missing $1:$2" >&2
        echo "baton: run as root, then retry:" >&2
        echo "    apt-get update && apt-get install -y$2" >&2
        exit 1
    fi
    echo "baton: installing:$2"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $2
}
