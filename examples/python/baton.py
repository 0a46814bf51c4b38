"""baton.py — a small ctypes binding of libbaton (the KV transfer engine) for Python engines.

Standard library only: it loads libbaton.so.0 (found as _find_library says: $BATON_LIBRARY, then
pkg-config's libdir, then the prefix this file was installed into, then the system's), creates engines
in libbaton's own-progress mode (no libuv loop in Python) and runs their callbacks on the thread
that calls Engine.dispatch() / Engine.run_until(), which polls the engine's fd. Callbacks run
with the GIL held, inside dispatch; an exception raised in one is printed by ctypes and lost, so
keep them short and record what happened.

    eng = baton.Engine(listen_host="127.0.0.1", on_room=..., on_room_closed=...)
    mem = eng.mem_alloc(n)              # memfd-backed, shareable with a same-host peer
    mem.view()[:] = data                # a writable memoryview over the region
    eng.offer("127.0.0.1", port, room_id, [(addr, len), ...], n_layers, on_done)
    eng.run_until(lambda: finished, timeout=30)
    eng.close()
"""
import ctypes
import ctypes.util
import glob
import os
import select
import subprocess
import time


def _find_library():
    """libbaton.so.0: $BATON_LIBRARY (a path) wins; else the libdir pkg-config names for `baton`
    (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig, as for a C build); else the prefix this file was
    installed into by `make install` (PREFIX/share/baton/python/baton.py); else the system's."""
    if os.environ.get("BATON_LIBRARY"):
        return os.environ["BATON_LIBRARY"]
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "baton"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        libdir = ""
    if libdir and os.path.exists(os.path.join(libdir, "libbaton.so.0")):
        return os.path.join(libdir, "libbaton.so.0")
    prefix = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                           ".."))
    for pattern in ("lib*/libbaton.so.0", "lib/*/libbaton.so.0"):
        found = sorted(glob.glob(os.path.join(prefix, pattern)))
        if found:
            return found[0]
    return ctypes.util.find_library("baton") or "libbaton.so.0"


_lib_path = _find_library()
lib = ctypes.CDLL(_lib_path)

TRANSPORTS = {"rdma": 1, "tcp": 2, "shm": 3}
MAX_TRANSPORTS = 4
LOG_LEVELS = ("debug", "info", "warn", "error")

c_void_p, c_int, c_uint32, c_uint64, c_char_p = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32,
                                                  ctypes.c_uint64, ctypes.c_char_p)

LOG_CB = ctypes.CFUNCTYPE(None, c_void_p, c_int, c_char_p)


class Config(ctypes.Structure):
    """baton_xfer_config_t, field for field (checked against its size at init)."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("engine_id", c_char_p),
        ("listen_host", c_char_p),
        ("listen_port", c_int),
        ("transports", c_int * MAX_TRANSPORTS),
        ("n_transports", c_int),
        ("heartbeat_interval_ms", c_uint32),
        ("heartbeat_misses", c_uint32),
        ("reconnect_min_ms", c_uint32),
        ("reconnect_max_ms", c_uint32),
        ("connect_timeout_ms", c_uint32),
        ("room_timeout_ms", c_uint32),
        ("slice_size", c_uint32),
        ("lanes", c_uint32),
        ("rdma_devices", c_char_p),
        ("rdma_qps_per_nic", c_uint32),
        ("log_cb", LOG_CB),
        ("log_data", c_void_p),
        ("log_level", c_int),
        ("rdma_traffic_class", c_uint32),
        ("rdma_service_level", c_uint32),
        ("rdma_fork_init", c_uint32),
        ("rdma_hugepages", c_uint32),
        ("rdma_drain_timeout_ms", c_uint32),
        ("secret", c_void_p),
        ("secret_len", ctypes.c_size_t),
        ("max_pending_conns", c_uint32),
        ("max_pending_per_addr", c_uint32),
        ("pending_buffer_bytes", c_uint64),
    ]


class Done(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int32), ("first_token", ctypes.c_int64),
                ("payload", ctypes.POINTER(ctypes.c_uint8)), ("payload_len", ctypes.c_size_t)]


class Iov(ctypes.Structure):
    _fields_ = [("addr", c_void_p), ("len", c_uint64)]


OFFER_CB = ctypes.CFUNCTYPE(None, c_void_p, c_uint64, c_int, ctypes.POINTER(Done))
LAYER_CB = ctypes.CFUNCTYPE(None, c_void_p, c_uint64, c_uint32)
ROOM_CB = ctypes.CFUNCTYPE(None, c_void_p, c_void_p, c_void_p)
ROOM_CLOSED_CB = ctypes.CFUNCTYPE(None, c_void_p, c_void_p, c_int, c_void_p)
PEER_CB = ctypes.CFUNCTYPE(None, c_void_p, c_void_p, c_void_p)
WRITE_CB = ctypes.CFUNCTYPE(None, c_void_p, c_uint32, c_int, c_void_p)
CLOSE_CB = ctypes.CFUNCTYPE(None, c_void_p, c_void_p)


class Offer(ctypes.Structure):
    _fields_ = [("room_id", c_uint64), ("n_layers", c_uint32), ("pages_per_layer", c_uint32),
                ("pages", ctypes.POINTER(Iov)), ("layer_cb", LAYER_CB)]


class Callbacks(ctypes.Structure):
    _fields_ = [("room_cb", ROOM_CB), ("room_closed_cb", ROOM_CLOSED_CB), ("peer_cb", PEER_CB),
                ("data", c_void_p)]


def _sig(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_sig("baton_version", ctypes.c_uint)
_sig("baton_version_string", c_char_p)
_sig("baton_xfer_strerror", c_char_p, c_int)
_sig("baton_xfer_err_name", c_char_p, c_int)
_sig("baton_xfer_config_init", None, ctypes.POINTER(Config))
_sig("baton_xfer_engine_create", c_int, c_void_p, ctypes.POINTER(Config),
     ctypes.POINTER(Callbacks), ctypes.POINTER(c_void_p))
_sig("baton_xfer_engine_fd", c_int, c_void_p)
_sig("baton_xfer_engine_dispatch", c_int, c_void_p)
_sig("baton_xfer_engine_destroy", None, c_void_p, CLOSE_CB, c_void_p)
_sig("baton_xfer_engine_listen_port", c_int, c_void_p)
_sig("baton_xfer_mem_alloc", c_int, c_void_p, ctypes.c_size_t, ctypes.POINTER(c_void_p))
_sig("baton_xfer_mem_addr", c_void_p, c_void_p)
_sig("baton_xfer_mem_len", ctypes.c_size_t, c_void_p)
_sig("baton_xfer_mem_deregister", c_int, c_void_p, c_void_p)
_sig("baton_xfer_offer", c_int, c_void_p, c_char_p, c_int, ctypes.POINTER(Offer), OFFER_CB,
     c_void_p)
_sig("baton_xfer_abort", c_int, c_void_p, c_uint64)
_sig("baton_xfer_room_id", c_uint64, c_void_p)
_sig("baton_xfer_room_layers", c_uint32, c_void_p)
_sig("baton_xfer_room_pages_per_layer", c_uint32, c_void_p)
_sig("baton_xfer_room_page_len", c_uint64, c_void_p, c_uint32, c_uint32)
_sig("baton_xfer_write_room", c_int, c_void_p, ctypes.POINTER(Iov), ctypes.c_size_t, WRITE_CB,
     c_void_p)
_sig("baton_xfer_room_complete", c_int, c_void_p, ctypes.POINTER(Done))
_sig("baton_xfer_room_abort", c_int, c_void_p, c_int)


class BatonError(Exception):
    def __init__(self, what, code):
        self.code = code
        super().__init__(f"{what}: {lib.baton_xfer_err_name(code).decode()} "
                         f"({lib.baton_xfer_strerror(code).decode()})")


def _check(what, rc):
    if rc != 0:
        raise BatonError(what, rc)


def err_name(code):
    return lib.baton_xfer_err_name(code).decode()


class Mem:
    """A registered region (from Engine.mem_alloc)."""

    def __init__(self, handle):
        self.handle = handle
        self.addr = lib.baton_xfer_mem_addr(handle)
        self.len = lib.baton_xfer_mem_len(handle)

    def view(self):
        return memoryview((ctypes.c_ubyte * self.len).from_address(self.addr)).cast("B")


class Room:
    """A room as the prefill side sees it (valid until on_room_closed returns)."""

    def __init__(self, engine, handle):
        self.engine, self.handle = engine, handle
        self.id = lib.baton_xfer_room_id(handle)
        self.layers = lib.baton_xfer_room_layers(handle)
        self.pages_per_layer = lib.baton_xfer_room_pages_per_layer(handle)

    def page_len(self, layer, page):
        return lib.baton_xfer_room_page_len(self.handle, layer, page)

    def write_room(self, sources, on_written):
        """sources: [(addr, len)] layer-major; on_written(room, status) once all landed."""
        iovs = (Iov * len(sources))(*[Iov(a, n) for a, n in sources])
        cb = WRITE_CB(lambda _r, _layer, status, _d: on_written(self, status))
        self.engine._keep[id(cb)] = cb  # called later, from dispatch: keep the thunk alive
        _check("write_room", lib.baton_xfer_write_room(self.handle, iovs, len(sources), cb, None))

    def complete(self, status=0, first_token=-1, payload=b""):
        buf = (ctypes.c_uint8 * max(1, len(payload))).from_buffer_copy(payload or b"\0")
        done = Done(status, first_token, buf, len(payload))
        _check("room_complete", lib.baton_xfer_room_complete(self.handle, ctypes.byref(done)))

    def abort(self, reason=0):
        _check("room_abort", lib.baton_xfer_room_abort(self.handle, reason))


class Engine:
    """One libbaton engine in own-progress mode."""

    def __init__(self, engine_id=None, listen_host=None, transports=("tcp",), on_room=None,
                 on_room_closed=None, log=None, log_level=-1, secret=None):
        cfg = Config()
        lib.baton_xfer_config_init(ctypes.byref(cfg))
        if cfg.size != ctypes.sizeof(Config):
            raise RuntimeError(f"baton.py's Config ({ctypes.sizeof(Config)} bytes) does not match "
                               f"this libbaton's ({cfg.size}): update the binding")
        self._keep = {}  # ctypes thunks libbaton still holds (by id: they are unhashable)
        self._rooms = {}
        self.closed = False
        if engine_id:
            cfg.engine_id = engine_id.encode()
        if listen_host:
            cfg.listen_host = listen_host.encode()
        for i, t in enumerate(transports):
            cfg.transports[i] = TRANSPORTS[t]
        cfg.n_transports = len(transports)
        cfg.log_level = log_level
        if secret is not None:  # bytes shared by the engines allowed to connect (copied by create)
            secret_buf = ctypes.create_string_buffer(bytes(secret), len(secret))
            cfg.secret = ctypes.cast(secret_buf, c_void_p)
            cfg.secret_len = len(secret)
        if log is not None:
            cfg.log_cb = self._log_cb = LOG_CB(
                lambda _d, level, msg: log(LOG_LEVELS[level & 3], msg.decode(errors="replace")))
        self._room_cb = ROOM_CB(lambda _e, r, _d: on_room(self._room(r)) if on_room else None)
        self._closed_cb = ROOM_CLOSED_CB(self._on_room_closed)
        self._on_room_closed_user = on_room_closed
        cbs = Callbacks(self._room_cb, self._closed_cb, PEER_CB(), None)
        handle = c_void_p()
        _check("engine_create", lib.baton_xfer_engine_create(None, ctypes.byref(cfg),
                                                             ctypes.byref(cbs),
                                                             ctypes.byref(handle)))
        self.handle = handle.value
        self.fd = lib.baton_xfer_engine_fd(self.handle)

    def _room(self, handle):
        room = self._rooms.get(handle)
        if room is None:
            room = self._rooms[handle] = Room(self, handle)
        return room

    def _on_room_closed(self, _e, handle, status, _d):
        room = self._rooms.pop(handle, None) or Room(self, handle)
        if self._on_room_closed_user:
            self._on_room_closed_user(room, status)

    @property
    def listen_port(self):
        return lib.baton_xfer_engine_listen_port(self.handle)

    def fileno(self):
        return self.fd

    def dispatch(self):
        """Runs pending callbacks on this thread; returns how many ran."""
        return lib.baton_xfer_engine_dispatch(self.handle)

    def run_until(self, predicate, timeout=30.0):
        end = time.monotonic() + timeout
        while not predicate():
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError("libbaton: condition not reached in time")
            select.select([self.fd], [], [], min(left, 0.5))
            self.dispatch()

    def mem_alloc(self, size):
        h = c_void_p()
        _check("mem_alloc", lib.baton_xfer_mem_alloc(self.handle, size, ctypes.byref(h)))
        return Mem(h.value)

    def mem_deregister(self, mem):
        _check("mem_deregister", lib.baton_xfer_mem_deregister(self.handle, mem.handle))

    def offer(self, host, port, room_id, pages, n_layers, on_done):
        """pages: [(addr, len)] layer-major; on_done(room_id, status, done_or_None) once, where
        done is (status, first_token, payload bytes)."""
        iovs = (Iov * len(pages))(*[Iov(a, n) for a, n in pages])

        def done_cb(_d, rid, status, done):
            d = None
            if status == 0:
                v = done.contents
                d = (v.status, v.first_token, ctypes.string_at(v.payload, v.payload_len))
            self._keep.pop(id(cb), None)
            on_done(rid, status, d)

        cb = OFFER_CB(done_cb)
        self._keep[id(cb)] = cb
        offer = Offer(room_id, n_layers, len(pages) // n_layers, iovs, LAYER_CB())
        _check("offer", lib.baton_xfer_offer(self.handle, host.encode(), port,
                                             ctypes.byref(offer), cb, None))

    def close(self, timeout=30.0):
        """Destroys the engine and runs dispatch until its close callback fired."""
        def on_close(_e, _d):
            self.closed = True

        self._close_cb = CLOSE_CB(on_close)
        lib.baton_xfer_engine_destroy(self.handle, self._close_cb, None)
        self.run_until(lambda: self.closed, timeout)
        self.handle = None
