#!/usr/bin/env python3
"""chaos_migration.py — streams that survive a dead decode: many streams (chat, completions,
generate; n = 1 and n > 1) through Baton while a random decode (PD) or regular worker is killed
-9 and restarted on its port every 0.1-0.4 s; every stream must complete and equal its
uninterrupted twin (the same request to a worker nobody kills), event for event but for ids.
The same run as test_migration's chaos smoke (tests/integration/migration_ref.py), at full size.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(HERE, "..", "..", "build"))
    ap.add_argument("--streams", type=int, default=200, help="streams per mode (200)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--decode-us-per-token", type=int, default=6000)
    ap.add_argument("--smoke", action="store_true", help="20 streams per mode")
    args = ap.parse_args()
    if args.smoke:
        args.streams = 20
    os.environ["BATON_BUILD_DIR"] = os.path.abspath(args.build_dir)
    import harness  # noqa: E402  (reads BATON_BUILD_DIR)
    import migration_ref as mref  # noqa: E402

    wargs = ("--prefill-us-per-token", "100", "--decode-us-per-token",
             str(args.decode_us_per_token))
    print("== chaos: kill -9 a worker at random points of many streams ==")
    print(f"{args.streams} streams per mode, {args.concurrency} at a time, seed {args.seed}, "
          f"decode {args.decode_us_per_token} us/token, 3 workers (PD: + 1 prefill); "
          f"vllm-nixl: chat and completions")
    print("\n### streams against their uninterrupted twins\n")
    print("| mode | streams | equal to twin | migrations started | completed | finished "
          "([DONE] only) | failed | limit | no_worker | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    bad = 0
    for mode in ("regular", "pd", "vllm-nixl"):
        with harness.Cluster(f"chaos-migration-{mode}") as c:
            t0 = time.monotonic()
            failures, m = mref.chaos_run(c, mode, args.streams, args.concurrency, args.seed,
                                         wargs)
            wall = time.monotonic() - t0
        bad += len(failures)
        cells = [mref.migrations(m, o) for o in ("started", "completed", "finished", "failed",
                                                 "limit", "no_worker")]
        print(f"| {mode} | {args.streams} | {args.streams - len(failures)} | "
              + " | ".join(str(x) for x in cells) + f" | {wall:.1f} |")
        for f in failures[:5]:
            print(f"FAILED stream {f[0]} ({f[1]}): {f[3][:600]}", file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
