#!/usr/bin/env python3
"""kv_handoff.py — a Python engine hands off KV through libbaton (ctypes binding, baton.py).

    kv_handoff.py prefill tcp|shm        listens on 127.0.0.1, prints "port=N", serves one room
    kv_handoff.py decode tcp|shm PORT    offers one room, verifies every byte, exits 0 if all match

The same hand-off as examples/c/kv_handoff.c, with a different pattern per byte.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baton  # noqa: E402

N_LAYERS, N_PAGES, PAGE_LEN = 3, 5, 48 * 1024
ROOM_ID = 0xC0FFEE
FIRST_TOKEN = 7


def expected():
    """The room's bytes, layer-major: every page different, every byte position different."""
    out = bytearray(N_LAYERS * N_PAGES * PAGE_LEN)
    for j in range(N_LAYERS * N_PAGES):
        seed = bytes((j * 37 + i * 11 + 5) & 0xFF for i in range(256))
        out[j * PAGE_LEN:(j + 1) * PAGE_LEN] = seed * (PAGE_LEN // 256)
    return bytes(out)


def log(role):
    return lambda level, msg: print(f"[{role}] libbaton {level}: {msg}", file=sys.stderr,
                                    flush=True)


def prefill(transport):
    state = {"status": None}

    def on_written(room, status):
        if status == 0:
            room.complete(0, FIRST_TOKEN, b"from python prefill")

    def on_room(room):
        if (room.id, room.layers, room.pages_per_layer) != (ROOM_ID, N_LAYERS, N_PAGES):
            room.abort()
            return
        srcs = [(src.addr + j * PAGE_LEN, room.page_len(j // N_PAGES, j % N_PAGES))
                for j in range(N_LAYERS * N_PAGES)]
        room.write_room(srcs, on_written)

    def on_room_closed(room, status):
        state["status"] = status

    eng = baton.Engine("py-prefill", listen_host="127.0.0.1", transports=(transport,),
                       on_room=on_room, on_room_closed=on_room_closed, log=log("prefill"))
    src = eng.mem_alloc(N_LAYERS * N_PAGES * PAGE_LEN)
    src.view()[:] = expected()
    print(f"port={eng.listen_port}", flush=True)
    eng.run_until(lambda: state["status"] is not None, timeout=60)
    eng.mem_deregister(src)
    eng.close()
    print(f"prefill room status={baton.err_name(state['status'])}")
    return 0 if state["status"] == 0 else 1


def decode(transport, port):
    state = {}
    eng = baton.Engine("py-decode", transports=(transport,), log=log("decode"))
    dst = eng.mem_alloc(N_LAYERS * N_PAGES * PAGE_LEN)
    pages = [(dst.addr + j * PAGE_LEN, PAGE_LEN) for j in range(N_LAYERS * N_PAGES)]

    def on_done(room_id, status, done):
        state["status"], state["done"] = status, done

    eng.offer("127.0.0.1", port, ROOM_ID, pages, N_LAYERS, on_done)
    eng.run_until(lambda: "status" in state, timeout=60)
    ok = False
    if state["status"] == 0:
        got = bytes(dst.view())
        want = expected()
        bad = sum(1 for a, b in zip(got, want) if a != b)
        status, first_token, payload = state["done"]
        print(f"decode room done: first_token={first_token} payload={payload!r} "
              f"bad_bytes={bad} of {len(want)}")
        ok = bad == 0 and len(got) == len(want) and status == 0 and first_token == FIRST_TOKEN
    else:
        print(f"decode room failed: {baton.err_name(state['status'])}")
    eng.mem_deregister(dst)
    eng.close()
    return 0 if ok else 1


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "prefill":
        return prefill(sys.argv[2])
    if len(sys.argv) == 4 and sys.argv[1] == "decode":
        return decode(sys.argv[2], int(sys.argv[3]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
