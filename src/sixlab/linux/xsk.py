"""AF_XDP sockets through the system libxdp (``libxdp.so.1``), with NumPy views of the rings.

Theory of operation
-------------------
An AF_XDP socket (Documentation/networking/af_xdp.rst in the kernel) moves frames
between a driver and user space through memory both share: the *UMEM*, an area of
equal frames that user space allocates and registers, and four single-producer
single-consumer rings of descriptors:

* **fill** (user space produces): UMEM addresses the kernel may receive into;
* **RX** (kernel produces): ``struct xdp_desc`` {addr, len, options} of received frames;
* **TX** (user space produces): descriptors of frames to send;
* **completion** (kernel produces): addresses of frames the kernel has sent.

An XDP program chooses which frames go to the socket (``bpf_redirect_map`` into an
``XSKMAP``); everything else continues into the kernel. With ``XDP_USE_NEED_WAKEUP``
the kernel says in a ring flag when it needs a system call (``sendto`` to transmit,
``poll``/``recvfrom`` to receive); in copy mode a transmit always takes a ``sendto``,
which sends at most 32 frames per call (``TX_BATCH_SIZE`` in net/xdp/xsk.c) and
returns ``EAGAIN`` while more are queued.

What comes from libxdp, and what is written here by hand:

* ``xsk_umem__create``, ``xsk_socket__create`` (with ``INHIBIT_PROG_LOAD``: the plane
  attaches its own program, sixlab's ``stamp_xsk``, not libxdp's default one),
  ``xsk_socket__fd``, ``xsk_socket__delete``, ``xsk_umem__delete``: libxdp reads the
  kernel's ring offsets (``XDP_MMAP_OFFSETS``), maps the rings, binds the socket.
* The ring operations ``xsk_ring_cons__peek``/``__release`` and
  ``xsk_ring_prod__reserve``/``__submit``: libxdp's own (it exports them besides the
  inline versions of ``xsk.h``), one ctypes call per *batch*: they keep the cached
  indices and the memory barriers the kernel's ring protocol needs.
* By hand: the ctypes mirrors of ``struct xsk_ring_prod``/``xsk_ring_cons``,
  ``xsk_umem_config`` and ``xsk_socket_config`` (libxdp 1.3's ``xsk.h``), and NumPy
  views of the descriptor arrays and of the UMEM, so that a batch's descriptors and
  frame bytes are read and written as arrays, never one ctypes call per packet. The
  UMEM is an anonymous ``mmap`` of this process, so Python owns its lifetime.

A missing ``libxdp.so.1`` raises ``LinuxError`` naming the Debian package.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
from typing import Any

import numpy as np
import numpy.typing as npt

from sixlab.linux.errors import LinuxError, XskError

__all__ = [
    "DESC_DTYPE",
    "LIBXDP_PACKAGE",
    "XDP_COPY",
    "XDP_USE_NEED_WAKEUP",
    "XDP_ZEROCOPY",
    "Ring",
    "Umem",
    "XskError",
    "XskSocket",
    "library",
]

LIBXDP_PACKAGE = "libxdp1"
# <linux/if_xdp.h> bind flags and options.
XDP_COPY = 1 << 1
XDP_ZEROCOPY = 1 << 2
XDP_USE_NEED_WAKEUP = 1 << 3
XDP_RING_NEED_WAKEUP = 1 << 0
SOL_XDP = 283
XDP_OPTIONS = 8
XDP_OPTIONS_ZEROCOPY = 1 << 0
XDP_STATISTICS = 7
_MSG_DONTWAIT = 0x40  # <sys/socket.h>
#: xsk.h: libxdp must not load its own XDP program.
XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD = 1 << 0

#: struct xdp_desc: the descriptor of the RX and TX rings.
DESC_DTYPE = np.dtype([("addr", "<u8"), ("len", "<u4"), ("options", "<u4")])

_c = ctypes
_vp = _c.c_void_p


class _RingStruct(_c.Structure):
    """DEFINE_XSK_RING in xsk.h: struct xsk_ring_prod and xsk_ring_cons alike."""

    _fields_ = (
        ("cached_prod", _c.c_uint32),
        ("cached_cons", _c.c_uint32),
        ("mask", _c.c_uint32),
        ("size", _c.c_uint32),
        ("producer", _c.POINTER(_c.c_uint32)),
        ("consumer", _c.POINTER(_c.c_uint32)),
        ("ring", _vp),
        ("flags", _c.POINTER(_c.c_uint32)),
    )


class _UmemConfig(_c.Structure):
    _fields_ = (
        ("fill_size", _c.c_uint32),
        ("comp_size", _c.c_uint32),
        ("frame_size", _c.c_uint32),
        ("frame_headroom", _c.c_uint32),
        ("flags", _c.c_uint32),
    )


class _SocketConfig(_c.Structure):
    _fields_ = (
        ("rx_size", _c.c_uint32),
        ("tx_size", _c.c_uint32),
        ("libxdp_flags", _c.c_uint32),
        ("xdp_flags", _c.c_uint32),
        ("bind_flags", _c.c_uint16),
    )


_RING_P = _c.POINTER(_RingStruct)
_U32_P = _c.POINTER(_c.c_uint32)
_SIGNATURES: dict[str, tuple[object, tuple[object, ...]]] = {
    "xsk_umem__create": (
        _c.c_int,
        (_c.POINTER(_vp), _vp, _c.c_uint64, _RING_P, _RING_P, _c.POINTER(_UmemConfig)),
    ),
    "xsk_umem__delete": (_c.c_int, (_vp,)),
    "xsk_socket__create": (
        _c.c_int,
        (
            _c.POINTER(_vp),
            _c.c_char_p,
            _c.c_uint32,
            _vp,
            _RING_P,
            _RING_P,
            _c.POINTER(_SocketConfig),
        ),
    ),
    "xsk_socket__delete": (None, (_vp,)),
    "xsk_socket__fd": (_c.c_int, (_vp,)),
    "xsk_ring_cons__peek": (_c.c_uint32, (_RING_P, _c.c_uint32, _U32_P)),
    "xsk_ring_cons__release": (None, (_RING_P, _c.c_uint32)),
    "xsk_ring_prod__reserve": (_c.c_uint32, (_RING_P, _c.c_uint32, _U32_P)),
    "xsk_ring_prod__submit": (None, (_RING_P, _c.c_uint32)),
}

_LIB: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """The system libxdp, loaded once; LinuxError naming the package if missing."""
    global _LIB  # noqa: PLW0603 - one process-wide handle on the shared library
    if _LIB is not None:
        return _LIB
    try:
        lib = ctypes.CDLL("libxdp.so.1", use_errno=True)
    except OSError as exc:
        raise LinuxError(
            f"af_xdp: cannot load libxdp.so.1 ({exc}); install it with "
            f"`apt-get install {LIBXDP_PACKAGE}`"
        ) from exc
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as exc:
            raise LinuxError(
                f"af_xdp: the system libxdp lacks {name}; libxdp 1.2 or newer is needed"
            ) from exc
        fn.restype = restype
        fn.argtypes = argtypes
    _LIB = lib
    return lib


class Ring:
    """One ring: libxdp's struct, and a NumPy view of its entries."""

    def __init__(self, dtype: Any) -> None:
        self.struct = _RingStruct()
        self._ref = _c.byref(self.struct)
        self._dtype = np.dtype(dtype)
        self._idx = _c.c_uint32(0)
        self._idx_ref = _c.byref(self._idx)
        self.entries: npt.NDArray[Any] = np.empty(0, self._dtype)
        self.mask = 0
        self.size = 0

    def attach(self) -> None:
        """Make the NumPy view once libxdp has mapped the ring."""
        s = self.struct
        self.mask, self.size = s.mask, s.size
        buf = (_c.c_char * (self.size * self._dtype.itemsize)).from_address(s.ring)
        self.entries = np.frombuffer(buf, self._dtype)

    def peek(self, n: int) -> tuple[int, int]:
        """Consumer: (entries available up to ``n``, index of the first)."""
        got = library().xsk_ring_cons__peek(self._ref, n, self._idx_ref)
        return got, self._idx.value

    def release(self, n: int) -> None:
        library().xsk_ring_cons__release(self._ref, n)

    def reserve(self, n: int) -> int:
        """Producer: the index of ``n`` reserved entries, or -1 if there is no room."""
        got = library().xsk_ring_prod__reserve(self._ref, n, self._idx_ref)
        return self._idx.value if got == n else -1

    def submit(self, n: int) -> None:
        library().xsk_ring_prod__submit(self._ref, n)

    def needs_wakeup(self) -> bool:
        return bool(self.struct.flags[0] & XDP_RING_NEED_WAKEUP)

    def slots(self, first: int, n: int) -> npt.NDArray[np.intp]:
        """Ring positions of ``n`` entries from index ``first`` (they may wrap)."""
        out: npt.NDArray[np.intp] = (np.arange(first, first + n) & self.mask).astype(np.intp)
        return out


class Umem:
    """``frame_count`` frames of ``frame_size`` bytes, registered with the kernel."""

    def __init__(self, frame_count: int, frame_size: int, ring_size: int) -> None:
        lib = library()
        self.frame_size = frame_size
        self.frame_count = frame_count
        self.area = mmap.mmap(-1, frame_count * frame_size)
        self._anchor = _c.c_char.from_buffer(self.area)
        self.address = _c.addressof(self._anchor)
        self.fill = Ring(np.uint64)
        self.comp = Ring(np.uint64)
        config = _UmemConfig(ring_size, ring_size, frame_size, 0, 0)
        handle = _vp()
        ret = lib.xsk_umem__create(
            _c.byref(handle),
            self.address,
            len(self.area),
            self.fill._ref,
            self.comp._ref,
            _c.byref(config),
        )
        if ret < 0:
            del self._anchor
            self.area.close()
            raise XskError("xsk_umem__create", -ret)
        self.handle: int | None = handle.value
        self.fill.attach()
        self.comp.attach()
        self.frames: npt.NDArray[np.uint8] = np.frombuffer(self.area, np.uint8).reshape(
            frame_count, frame_size
        )

    def close(self) -> None:
        if self.handle is not None:
            library().xsk_umem__delete(self.handle)
            self.handle = None
            self.frames = np.empty((0, self.frame_size), np.uint8)
            del self._anchor
            self.area.close()


class XskSocket:
    """An AF_XDP socket on ``ifname`` queue ``queue``, over ``umem``; no program loaded."""

    def __init__(
        self, ifname: str, queue: int, umem: Umem, *, ring_size: int, bind_flags: int
    ) -> None:
        lib = library()
        self.rx = Ring(DESC_DTYPE)
        self.tx = Ring(DESC_DTYPE)
        config = _SocketConfig(
            ring_size, ring_size, XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD, 0, bind_flags
        )
        handle = _vp()
        assert umem.handle is not None
        ret = lib.xsk_socket__create(
            _c.byref(handle),
            ifname.encode(),
            queue,
            umem.handle,
            self.rx._ref,
            self.tx._ref,
            _c.byref(config),
        )
        if ret < 0:
            raise XskError(f"xsk_socket__create({ifname} queue {queue})", -ret)
        self.handle: int | None = handle.value
        self.fd: int = lib.xsk_socket__fd(self.handle)
        self.rx.attach()
        self.tx.attach()
        #: Bound with ``XDP_USE_NEED_WAKEUP``: the TX ring's flag says when to kick.
        self.need_wakeup = bool(bind_flags & XDP_USE_NEED_WAKEUP)

    def zero_copy(self) -> bool:
        """Whether the kernel bound the socket in zero-copy mode (``XDP_OPTIONS``)."""
        value = _c.c_uint32(0)
        size = _c.c_uint32(4)
        libc = _libc()
        if libc.getsockopt(self.fd, SOL_XDP, XDP_OPTIONS, _c.byref(value), _c.byref(size)):
            raise XskError("getsockopt(XDP_OPTIONS)", _c.get_errno())
        return bool(value.value & XDP_OPTIONS_ZEROCOPY)

    def statistics(self) -> dict[str, int]:
        """``struct xdp_statistics``: what the kernel dropped or found invalid."""
        names = (
            "rx_dropped", "rx_invalid_descs", "tx_invalid_descs",
            "rx_ring_full", "rx_fill_ring_empty_descs", "tx_ring_empty_descs",
        )  # fmt: skip
        values = (_c.c_uint64 * len(names))()
        size = _c.c_uint32(_c.sizeof(values))
        libc = _libc()
        if libc.getsockopt(self.fd, SOL_XDP, XDP_STATISTICS, values, _c.byref(size)):
            raise XskError("getsockopt(XDP_STATISTICS)", _c.get_errno())
        count = size.value // 8
        return {names[i]: int(values[i]) for i in range(count)}

    def kick(self) -> int:
        """``sendto`` with no data: transmit what the TX ring holds. Returns the calls
        made; stops on a refusal other than EAGAIN (the caller counts unsent frames).

        With ``XDP_USE_NEED_WAKEUP`` and the TX ring's flag clear, the driver is
        already working through the ring (zero-copy drivers clear it while their NAPI
        transmits; af_xdp.rst, "XDP_USE_NEED_WAKEUP bind flag") and no call is made.
        Copy mode keeps the flag set, so there every kick is a ``sendto``.
        """
        if self.need_wakeup and not self.tx.needs_wakeup():
            return 0
        libc = _libc()
        calls = 0
        for _ in range(1 + self.tx.size // 32):
            calls += 1
            if libc.sendto(self.fd, None, 0, _MSG_DONTWAIT, None, 0) >= 0:
                return calls
            err = _c.get_errno()
            if err not in (errno.EAGAIN, errno.EBUSY, errno.ENOBUFS):
                raise XskError("sendto", err)
            if err != errno.EAGAIN:
                return calls
        return calls

    def close(self) -> None:
        if self.handle is not None:
            library().xsk_socket__delete(self.handle)
            self.handle = None


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC  # noqa: PLW0603 - one handle, its signatures set once
    if _LIBC is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sendto.argtypes = (_c.c_int, _vp, _c.c_size_t, _c.c_int, _vp, _c.c_uint32)
        libc.sendto.restype = _c.c_ssize_t
        libc.getsockopt.argtypes = (_c.c_int, _c.c_int, _c.c_int, _vp, _c.POINTER(_c.c_uint32))
        libc.getsockopt.restype = _c.c_int
        _LIBC = libc
    return _LIBC
