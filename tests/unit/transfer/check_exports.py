#!/usr/bin/env python3
"""check_exports.py LIB.so LIB.a HEADER... — libbaton.so exports exactly the functions its public
headers declare with BATON_API, and libbaton.a defines exactly those as global symbols: anything
else (an internal that lost its hidden visibility, a bundled common/ helper) or anything declared
but missing fails the test."""
import re
import subprocess
import sys


def declared(headers):
    names = set()
    for path in headers:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)  # drop comments (prose names calls)
        text = re.sub(r"^\s*#.*$", " ", text, flags=re.M)  # and the BATON_API definition
        # "BATON_API <return type> name(" — the declaration may wrap after the '('.
        for m in re.finditer(r"\bBATON_API\b[^;(]*?\b([A-Za-z_]\w*)\s*\(", text):
            names.add(m.group(1))
    return names


def exported(nm_args):
    out = subprocess.run(["nm"] + nm_args, check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            names.add(parts[2].split("@")[0])
    return names


def compare(what, have, want):
    extra = sorted(have - want)
    missing = sorted(want - have)
    for n in extra:
        print(f"FAIL: {what}: global but not public:", n)
    for n in missing:
        print(f"FAIL: {what}: declared public but not defined:", n)
    print(f"{what}: {len(have)} global, {len(want)} declared public")
    return not extra and not missing


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    want = declared(sys.argv[3:])
    if not want:
        print("FAIL: no BATON_API declaration found in", sys.argv[3:])
        return 1
    ok = compare("libbaton.so", exported(["-D", "--defined-only", sys.argv[1]]), want)
    ok = compare("libbaton.a", exported(["-g", "--defined-only", sys.argv[2]]), want) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
