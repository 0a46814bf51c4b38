#!/usr/bin/env python3
"""transfer_pull.py — pull vs push through libbaton (issue 12), the same sizes on each side: a
holder process (baton-xfer-pull --hold) either EXPORTS its keys (pull mode: its engine serves
each pull) or, with --push, has its application write each offered key (the write path used by
the SGLang flow); the same puller process fetches them and verifies every byte after the clock
stops. Rounds alternate pull and push; the figures are medians. Goal: pull within 10% of push.
"""

import statistics
import subprocess
import sys

import scenlib


def one(lab, tp, mode, args):
    extra = ["--push"] if mode == "push" else []
    shape = ["--keys", args.keys, "--layers", args.layers, "--ppl", args.ppl, "--page",
             args.page, "--transport", tp]
    # libbaton logs "bootstrap_listening addr=H:P" once the holder listens
    h = lab.start(f"hold-{tp}-{mode}", [lab.bin("baton-xfer-pull"), "--hold", *extra,
                                        *[str(x) for x in shape]], keys=("bootstrap",))
    port = h.ports["bootstrap"]
    r = subprocess.run([lab.bin("baton-xfer-pull"), "--pull", f"{scenlib.HOST}:{port}",
                        *[str(x) for x in shape]], capture_output=True, text=True, timeout=300)
    h.stop()
    done = [ln for ln in r.stdout.splitlines() if ln.startswith("done ")]
    if r.returncode != 0 or not done or "failures=0" not in done[0]:
        raise RuntimeError(f"puller failed ({r.returncode}): {r.stdout[-400:]}")
    return float(done[0].split("gbps=")[1])


def main():
    ap = scenlib.arg_parser(__doc__.split("\n")[0])
    ap.add_argument("--transports", default="tcp,shm")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--keys", type=int, default=16)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--ppl", type=int, default=16)
    ap.add_argument("--page", type=int, default=65536)
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.keys, args.layers, args.ppl = 1, 2, 4, 4
    print("== libbaton pull vs push (same sizes) ==")
    print(scenlib.machine_line())
    size = args.keys * args.layers * args.ppl * args.page
    print(f"{args.keys} keys of {args.layers} layers x {args.ppl} pages x {args.page} B "
          f"({size >> 20} MiB) per run, {args.rounds} rounds, pull and push alternating")
    rows, figures = [], {"config": vars(args), "gbps": {}}
    for tp in args.transports.split(","):
        got = {"pull": [], "push": []}
        with scenlib.Lab(args, f"pull-{tp}") as lab:
            for _ in range(args.rounds):
                for mode in ("pull", "push"):
                    got[mode].append(one(lab, tp, mode, args))
        pl, pu = statistics.median(got["pull"]), statistics.median(got["push"])
        figures["gbps"][tp] = got
        rows.append([tp, pl, min(got["pull"]), max(got["pull"]), pu, min(got["push"]),
                     max(got["push"]), scenlib.ratio(pl, pu)])
    scenlib.print_table("pull vs push", ["transport", "pull Gbit/s", "min", "max",
                                         "push Gbit/s", "min", "max", "pull/push"], rows,
                        note="medians over the rounds; every byte verified by the puller")
    scenlib.write_json(args.json, figures)
    print(f"\ntransfer_pull done; {scenlib.load_now()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
