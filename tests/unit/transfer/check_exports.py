#!/usr/bin/env python3
"""check_exports.py LIB HEADER... — libbaton.so exports exactly the functions its public headers
declare with BATON_API: anything else exported (an internal that lost its hidden visibility, a
bundled common/ helper) or anything declared but missing fails the test."""
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


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True, capture_output=True,
                         text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            names.add(parts[2].split("@")[0])
    return names


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    want = declared(sys.argv[2:])
    have = exported(sys.argv[1])
    if not want:
        print("FAIL: no BATON_API declaration found in", sys.argv[2:])
        return 1
    extra = sorted(have - want)
    missing = sorted(want - have)
    for n in extra:
        print("FAIL: exported but not public:", n)
    for n in missing:
        print("FAIL: declared public but not exported:", n)
    print(f"{len(have)} exported, {len(want)} declared public")
    return 1 if extra or missing else 0


if __name__ == "__main__":
    sys.exit(main())
