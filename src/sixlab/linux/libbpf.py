"""A small ctypes layer over the system libbpf (``libbpf.so.1``): just what the XDP plane needs.

Theory of operation
-------------------
There is no maintained Python binding of libbpf, and bcc needs kernel headers this
machine does not have (docs/design-notes.md), so the XDP plane talks to libbpf's C API directly:

* ``BpfObject`` opens a compiled ``.bpf.o`` (``bpf_object__open_file``), loads it into the
  kernel (``bpf_object__load``: CO-RE relocations against /sys/kernel/btf/vmlinux, map
  creation, the verifier) and finds its programs and maps by name *within the object*.
  BPF maps are global, not per network namespace, so nothing is ever looked up by name
  in the kernel: the object's own file descriptors are the handles.
* ``BpfMap`` reads and writes entries as raw ``bytes`` (the caller packs them with
  ``struct`` or ctypes); a per-CPU map's lookup returns one value per possible CPU.
* ``xdp_attach``/``xdp_detach``/``xdp_query_id`` wrap ``bpf_xdp_attach`` and friends;
  ``prog_info`` reads ``struct bpf_prog_info`` (name, id, and the run-time statistics
  ``run_time_ns``/``run_cnt`` that ``kernel.bpf_stats_enabled`` turns on).
* ``tc_attach``/``tc_detach`` wrap ``bpf_tc_hook_create`` and ``bpf_tc_attach``/``detach``
  (a ``clsact`` qdisc and one direct-action ``cls_bpf`` filter at a fixed handle and
  priority, so that the next start after a crash replaces its own leftover).
* ``tc_hook_destroy`` removes a device's ``clsact`` qdisc (``bpf_tc_hook_destroy``).
* libbpf's own messages (``libbpf_set_print``) go to the ``sixlab.linux.libbpf``
  logger at DEBUG level, not to stderr: they are about conditions the callers handle
  (a qdisc that already exists, a filter that is not there to remove); a failure is
  raised as ``LibbpfError`` with the errno and, for a load, the verifier's log, and
  the last few messages are kept in ``recent_messages()``.
* ``RingBuffer`` wraps ``ring_buffer__new`` with a ctypes callback; ``consume`` never
  blocks, ``epoll_fd`` is what a select loop waits on.

Errors: libbpf 1.x returns ``-errno`` from int functions and NULL with ``errno`` set from
pointer functions; both become ``LibbpfError`` (a ``LinuxError``) whose message names
the operation and the errno, and for a failed load carries the tail of the verifier log.
A missing ``libbpf.so.1`` raises ``LinuxError`` naming the Debian package.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sixlab.linux.errors import LinuxError

__all__ = [
    "BPF_ANY",
    "BPF_EXIST",
    "BPF_NOEXIST",
    "XDP_FLAGS_DRV_MODE",
    "XDP_FLAGS_SKB_MODE",
    "XDP_FLAGS_UPDATE_IF_NOEXIST",
    "BpfMap",
    "BpfObject",
    "BpfProgram",
    "LibbpfError",
    "ProgInfo",
    "RingBuffer",
    "TestRun",
    "library",
    "num_possible_cpus",
    "prog_info",
    "prog_info_by_id",
    "recent_messages",
    "tc_attach",
    "tc_detach",
    "tc_hook_destroy",
    "xdp_attach",
    "xdp_detach",
    "xdp_query_id",
]

#: Debian ships libbpf.so.1 in this package (libbpf-dev adds the headers the C needs).
LIBBPF_PACKAGE = "libbpf1"

# bpf_map_update_elem flags (linux/bpf.h).
BPF_ANY = 0
BPF_NOEXIST = 1
BPF_EXIST = 2
# XDP attach flags (linux/if_link.h).
XDP_FLAGS_UPDATE_IF_NOEXIST = 1 << 0
XDP_FLAGS_SKB_MODE = 1 << 1
XDP_FLAGS_DRV_MODE = 1 << 2
# enum bpf_tc_attach_point and bpf_tc_attach flags (libbpf.h).
_BPF_TC_INGRESS = 1 << 0
_BPF_TC_EGRESS = 1 << 1
_BPF_TC_F_REPLACE = 1 << 0
#: Bytes of verifier log kept for an error message (libbpf retries a failed load with
#: log level 1 into this buffer; the end of the log is what names the fault).
_LOG_SIZE = 1 << 20
_LOG_TAIL = 3000

_c = ctypes
_vp = _c.c_void_p


class LibbpfError(LinuxError):
    """A libbpf call failed; ``errno`` is the positive error number."""

    def __init__(self, op: str, err: int, detail: str = "") -> None:
        self.op = op
        self.errno = err
        name = errno.errorcode.get(err, str(err))
        msg = f"libbpf: {op} failed: {name} ({os.strerror(err)})"
        if err == errno.EPERM:
            msg += " - BPF needs root (CAP_BPF and CAP_NET_ADMIN)"
        super().__init__(f"{msg}\n{detail}" if detail else msg)


class _OpenOpts(_c.Structure):
    """struct bpf_object_open_opts (libbpf 1.1, libbpf.h)."""

    _fields_ = (
        ("sz", _c.c_size_t),
        ("object_name", _c.c_char_p),
        ("relaxed_maps", _c.c_bool),
        ("pin_root_path", _c.c_char_p),
        ("_attach_prog_fd", _c.c_uint32),
        ("kconfig", _c.c_char_p),
        ("btf_custom_path", _c.c_char_p),
        ("kernel_log_buf", _vp),
        ("kernel_log_size", _c.c_size_t),
        ("kernel_log_level", _c.c_uint32),
    )


class _TestRunOpts(_c.Structure):
    """struct bpf_test_run_opts (bpf.h)."""

    _fields_ = (
        ("sz", _c.c_size_t),
        ("data_in", _vp),
        ("data_out", _vp),
        ("data_size_in", _c.c_uint32),
        ("data_size_out", _c.c_uint32),
        ("ctx_in", _vp),
        ("ctx_out", _vp),
        ("ctx_size_in", _c.c_uint32),
        ("ctx_size_out", _c.c_uint32),
        ("retval", _c.c_uint32),
        ("repeat", _c.c_int),
        ("duration", _c.c_uint32),
        ("flags", _c.c_uint32),
        ("cpu", _c.c_uint32),
        ("batch_size", _c.c_uint32),
    )


class _TcHook(_c.Structure):
    """struct bpf_tc_hook (libbpf.h)."""

    _fields_ = (
        ("sz", _c.c_size_t),
        ("ifindex", _c.c_int),
        ("attach_point", _c.c_int),
        ("parent", _c.c_uint32),
    )


class _TcOpts(_c.Structure):
    """struct bpf_tc_opts (libbpf.h)."""

    _fields_ = (
        ("sz", _c.c_size_t),
        ("prog_fd", _c.c_int),
        ("flags", _c.c_uint32),
        ("prog_id", _c.c_uint32),
        ("handle", _c.c_uint32),
        ("priority", _c.c_uint32),
    )


class _ProgInfo(_c.Structure):
    """struct bpf_prog_info (linux/bpf.h, as in this kernel's BTF)."""

    _fields_ = (
        ("type", _c.c_uint32),
        ("id", _c.c_uint32),
        ("tag", _c.c_uint8 * 8),
        ("jited_prog_len", _c.c_uint32),
        ("xlated_prog_len", _c.c_uint32),
        ("jited_prog_insns", _c.c_uint64),
        ("xlated_prog_insns", _c.c_uint64),
        ("load_time", _c.c_uint64),
        ("created_by_uid", _c.c_uint32),
        ("nr_map_ids", _c.c_uint32),
        ("map_ids", _c.c_uint64),
        ("name", _c.c_char * 16),
        ("ifindex", _c.c_uint32),
        ("gpl_compatible", _c.c_uint32),
        ("netns_dev", _c.c_uint64),
        ("netns_ino", _c.c_uint64),
        ("nr_jited_ksyms", _c.c_uint32),
        ("nr_jited_func_lens", _c.c_uint32),
        ("jited_ksyms", _c.c_uint64),
        ("jited_func_lens", _c.c_uint64),
        ("btf_id", _c.c_uint32),
        ("func_info_rec_size", _c.c_uint32),
        ("func_info", _c.c_uint64),
        ("nr_func_info", _c.c_uint32),
        ("nr_line_info", _c.c_uint32),
        ("line_info", _c.c_uint64),
        ("jited_line_info", _c.c_uint64),
        ("nr_jited_line_info", _c.c_uint32),
        ("line_info_rec_size", _c.c_uint32),
        ("jited_line_info_rec_size", _c.c_uint32),
        ("nr_prog_tags", _c.c_uint32),
        ("prog_tags", _c.c_uint64),
        ("run_time_ns", _c.c_uint64),
        ("run_cnt", _c.c_uint64),
        ("recursion_misses", _c.c_uint64),
        ("verified_insns", _c.c_uint32),
        ("attach_btf_obj_id", _c.c_uint32),
        ("attach_btf_id", _c.c_uint32),
    )


_SAMPLE_FN = _c.CFUNCTYPE(_c.c_int, _vp, _vp, _c.c_size_t)
#: libbpf_print_fn_t: (enum libbpf_print_level, const char *format, va_list). A va_list
#: argument arrives as a pointer (an array on x86-64; a large struct, passed by
#: reference, on arm64) and goes on to vsnprintf as one.
_PRINT_FN = _c.CFUNCTYPE(_c.c_int, _c.c_int, _c.c_char_p, _vp)

# name -> (restype, argtypes)
_SIGNATURES: dict[str, tuple[object, tuple[object, ...]]] = {
    "bpf_object__open_file": (_vp, (_c.c_char_p, _c.POINTER(_OpenOpts))),
    "bpf_object__load": (_c.c_int, (_vp,)),
    "bpf_object__close": (None, (_vp,)),
    "bpf_object__find_program_by_name": (_vp, (_vp, _c.c_char_p)),
    "bpf_object__find_map_by_name": (_vp, (_vp, _c.c_char_p)),
    "bpf_program__fd": (_c.c_int, (_vp,)),
    "bpf_map__fd": (_c.c_int, (_vp,)),
    "bpf_map__key_size": (_c.c_uint32, (_vp,)),
    "bpf_map__value_size": (_c.c_uint32, (_vp,)),
    "bpf_map__type": (_c.c_int, (_vp,)),
    "bpf_map__max_entries": (_c.c_uint32, (_vp,)),
    "bpf_map_update_elem": (_c.c_int, (_c.c_int, _vp, _vp, _c.c_uint64)),
    "bpf_map_lookup_elem": (_c.c_int, (_c.c_int, _vp, _vp)),
    "bpf_map_delete_elem": (_c.c_int, (_c.c_int, _vp)),
    "bpf_map_get_next_key": (_c.c_int, (_c.c_int, _vp, _vp)),
    "bpf_xdp_attach": (_c.c_int, (_c.c_int, _c.c_int, _c.c_uint32, _vp)),
    "bpf_xdp_detach": (_c.c_int, (_c.c_int, _c.c_uint32, _vp)),
    "bpf_xdp_query_id": (_c.c_int, (_c.c_int, _c.c_int, _c.POINTER(_c.c_uint32))),
    "bpf_tc_hook_create": (_c.c_int, (_c.POINTER(_TcHook),)),
    "bpf_tc_attach": (_c.c_int, (_c.POINTER(_TcHook), _c.POINTER(_TcOpts))),
    "bpf_tc_detach": (_c.c_int, (_c.POINTER(_TcHook), _c.POINTER(_TcOpts))),
    "bpf_tc_hook_destroy": (_c.c_int, (_c.POINTER(_TcHook),)),
    "libbpf_set_print": (_vp, (_PRINT_FN,)),
    "bpf_obj_get_info_by_fd": (_c.c_int, (_c.c_int, _vp, _c.POINTER(_c.c_uint32))),
    "bpf_prog_get_fd_by_id": (_c.c_int, (_c.c_uint32,)),
    "bpf_prog_test_run_opts": (_c.c_int, (_c.c_int, _c.POINTER(_TestRunOpts))),
    "libbpf_num_possible_cpus": (_c.c_int, ()),
    "ring_buffer__new": (_vp, (_c.c_int, _SAMPLE_FN, _vp, _vp)),
    "ring_buffer__consume": (_c.c_int, (_vp,)),
    "ring_buffer__poll": (_c.c_int, (_vp, _c.c_int)),
    "ring_buffer__epoll_fd": (_c.c_int, (_vp,)),
    "ring_buffer__free": (None, (_vp,)),
}

_LIB: ctypes.CDLL | None = None
_log = logging.getLogger("sixlab.linux.libbpf")
_MESSAGES: deque[str] = deque(maxlen=16)
_PRINT_BUFFER = 2048


def _on_print(level: int, fmt: bytes | None, args: int | None) -> int:
    """libbpf's print hook: format the message with the C library, log it at DEBUG."""
    if fmt is None:
        return 0
    buf = _c.create_string_buffer(_PRINT_BUFFER)
    _libc().vsnprintf(buf, _PRINT_BUFFER, fmt, args)
    text = buf.value.decode(errors="replace").rstrip()
    _MESSAGES.append(text)
    _log.debug("libbpf (level %d): %s", level, text)
    return 0


#: Kept for the life of the process: libbpf holds a pointer to it.
_PRINT_HOOK = _PRINT_FN(_on_print)
_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC  # noqa: PLW0603 - one handle on the C library
    if _LIBC is None:
        libc = _c.CDLL(None)
        libc.vsnprintf.restype = _c.c_int
        libc.vsnprintf.argtypes = (_c.c_char_p, _c.c_size_t, _c.c_char_p, _vp)
        _LIBC = libc
    return _LIBC


def recent_messages() -> list[str]:
    """libbpf's last messages (at most 16), oldest first."""
    return list(_MESSAGES)


def library() -> ctypes.CDLL:
    """The system libbpf, loaded once; LinuxError naming the package if missing."""
    global _LIB  # noqa: PLW0603 - one process-wide handle on the shared library
    if _LIB is not None:
        return _LIB
    try:
        lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    except OSError as exc:
        raise LinuxError(
            f"xdp: cannot load libbpf.so.1 ({exc}); install it with "
            f"`apt-get install {LIBBPF_PACKAGE} libbpf-dev`"
        ) from exc
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as exc:
            raise LinuxError(
                f"xdp: the system libbpf lacks {name}; libbpf 1.1 or newer is needed "
                f"(`apt-get install {LIBBPF_PACKAGE}`)"
            ) from exc
        fn.restype = restype
        fn.argtypes = argtypes
    _libc()
    lib.libbpf_set_print(_PRINT_HOOK)
    _LIB = lib
    return lib


def _check(op: str, ret: int, detail: str = "") -> int:
    """libbpf's int convention: negative is -errno."""
    if ret < 0:
        raise LibbpfError(op, -ret, detail)
    return ret


def _check_ptr(op: str, ptr: int | None) -> int:
    """libbpf's pointer convention: NULL with errno set."""
    if not ptr:
        raise LibbpfError(op, _c.get_errno() or errno.EINVAL)
    return ptr


def num_possible_cpus() -> int:
    return _check("libbpf_num_possible_cpus", library().libbpf_num_possible_cpus())


@dataclass(frozen=True, slots=True)
class ProgInfo:
    """What the kernel says about a loaded program (``bpf_prog_info``)."""

    id: int
    name: str
    run_time_ns: int
    run_cnt: int
    verified_insns: int


def prog_info(prog_fd: int) -> ProgInfo:
    info = _ProgInfo()
    size = _c.c_uint32(_c.sizeof(info))
    _check(
        "bpf_obj_get_info_by_fd",
        library().bpf_obj_get_info_by_fd(prog_fd, _c.addressof(info), _c.byref(size)),
    )
    return ProgInfo(
        info.id,
        info.name.decode(errors="replace"),
        info.run_time_ns,
        info.run_cnt,
        info.verified_insns,
    )


def prog_info_by_id(prog_id: int) -> ProgInfo | None:
    """The info of the program with kernel id ``prog_id``, None if it is gone."""
    fd = library().bpf_prog_get_fd_by_id(prog_id)
    if fd < 0:
        if -fd == errno.ENOENT:
            return None
        _check("bpf_prog_get_fd_by_id", fd)
    try:
        return prog_info(fd)
    finally:
        os.close(fd)


def xdp_attach(ifindex: int, prog_fd: int, flags: int = 0) -> None:
    _check(
        f"bpf_xdp_attach(ifindex {ifindex})",
        library().bpf_xdp_attach(ifindex, prog_fd, flags, None),
    )


def xdp_detach(ifindex: int, flags: int = 0) -> None:
    _check(f"bpf_xdp_detach(ifindex {ifindex})", library().bpf_xdp_detach(ifindex, flags, None))


def xdp_query_id(ifindex: int, flags: int = 0) -> int:
    """Id of the XDP program attached to ``ifindex`` (0: none)."""
    prog_id = _c.c_uint32(0)
    _check(
        f"bpf_xdp_query_id(ifindex {ifindex})",
        library().bpf_xdp_query_id(ifindex, flags, _c.byref(prog_id)),
    )
    return prog_id.value


def _tc_hook(ifindex: int, *, egress: bool) -> _TcHook:
    point = _BPF_TC_EGRESS if egress else _BPF_TC_INGRESS
    return _TcHook(sz=_c.sizeof(_TcHook), ifindex=ifindex, attach_point=point)


def tc_attach(ifindex: int, prog_fd: int, *, egress: bool, handle: int, priority: int) -> None:
    """Attach a ``SEC("tc")`` program (direct action) at ``ifindex``'s ingress or egress.

    The ``clsact`` qdisc is created if missing; a filter already at ``handle`` and
    ``priority`` (ours, from a crashed run) is replaced.
    """
    where = f"ifindex {ifindex} {'egress' if egress else 'ingress'}"
    hook = _tc_hook(ifindex, egress=egress)
    ret = library().bpf_tc_hook_create(_c.byref(hook))
    if ret < 0 and -ret != errno.EEXIST:
        _check(f"bpf_tc_hook_create({where})", ret)
    opts = _TcOpts(
        sz=_c.sizeof(_TcOpts),
        prog_fd=prog_fd,
        flags=_BPF_TC_F_REPLACE,
        handle=handle,
        priority=priority,
    )
    _check(f"bpf_tc_attach({where})", library().bpf_tc_attach(_c.byref(hook), _c.byref(opts)))


def tc_detach(ifindex: int, *, egress: bool, handle: int, priority: int) -> bool:
    """Remove the filter at ``handle``/``priority``; False if there was none (or no device)."""
    hook = _tc_hook(ifindex, egress=egress)
    opts = _TcOpts(sz=_c.sizeof(_TcOpts), handle=handle, priority=priority)
    ret = library().bpf_tc_detach(_c.byref(hook), _c.byref(opts))
    if ret < 0 and -ret in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
        return False
    _check(f"bpf_tc_detach(ifindex {ifindex})", ret)
    return True


def tc_hook_destroy(ifindex: int) -> bool:
    """Remove ``ifindex``'s ``clsact`` qdisc with every filter on it; False if it had
    none (or the device is gone)."""
    hook = _TcHook(
        sz=_c.sizeof(_TcHook), ifindex=ifindex, attach_point=_BPF_TC_INGRESS | _BPF_TC_EGRESS
    )
    ret = library().bpf_tc_hook_destroy(_c.byref(hook))
    if ret < 0 and -ret in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
        return False
    _check(f"bpf_tc_hook_destroy(ifindex {ifindex})", ret)
    return True


@dataclass(frozen=True, slots=True)
class TestRun:
    """Result of ``BPF_PROG_TEST_RUN``: the verdict and the packet as the program left it."""

    retval: int
    data: bytes
    duration_ns: int


class BpfProgram:
    """One program of a loaded object (the object owns its file descriptor)."""

    def __init__(self, name: str, fd: int) -> None:
        self.name = name
        self.fd = fd

    def info(self) -> ProgInfo:
        return prog_info(self.fd)

    def test_run(self, data: bytes, *, repeat: int = 1, max_out: int = 4096) -> TestRun:
        """Run the program on ``data`` in the kernel (``bpf_prog_test_run_opts``)."""
        buf_in = _c.create_string_buffer(data, len(data))
        buf_out = _c.create_string_buffer(max_out + 256)
        opts = _TestRunOpts(
            sz=_c.sizeof(_TestRunOpts),
            data_in=_c.addressof(buf_in),
            data_out=_c.addressof(buf_out),
            data_size_in=len(data),
            data_size_out=max_out + 256,
            repeat=repeat,
        )
        _check(
            f"bpf_prog_test_run_opts({self.name})",
            library().bpf_prog_test_run_opts(self.fd, _c.byref(opts)),
        )
        return TestRun(opts.retval, buf_out.raw[: opts.data_size_out], opts.duration)


# BPF map types whose values are per CPU (linux/bpf.h enum bpf_map_type).
_PERCPU_TYPES = frozenset(
    {5, 6, 10, 21}
)  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH, PERCPU_CGROUP_STORAGE


class BpfMap:
    """One map of a loaded object; keys and values are raw bytes."""

    def __init__(self, name: str, ptr: int) -> None:
        lib = library()
        self.name = name
        self.fd = _check(f"bpf_map__fd({name})", lib.bpf_map__fd(ptr))
        self.key_size: int = lib.bpf_map__key_size(ptr)
        self.value_size: int = lib.bpf_map__value_size(ptr)
        self.max_entries: int = lib.bpf_map__max_entries(ptr)
        self.percpu = lib.bpf_map__type(ptr) in _PERCPU_TYPES
        # A per-CPU lookup fills one 8-byte-aligned slot per possible CPU.
        self._slot = (self.value_size + 7) & ~7
        self._ncpu = num_possible_cpus() if self.percpu else 1

    def _key(self, key: bytes) -> ctypes.Array[ctypes.c_char]:
        if len(key) != self.key_size:
            raise ValueError(f"{self.name}: key of {len(key)} bytes, the map's are {self.key_size}")
        return _c.create_string_buffer(key, len(key))

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        """Write ``key``; a per-CPU map given one value writes it on every CPU."""
        if self.percpu and len(value) == self.value_size:
            value = value.ljust(self._slot, b"\0") * self._ncpu
        expected = self._slot * self._ncpu if self.percpu else self.value_size
        if len(value) != expected:
            raise ValueError(f"{self.name}: value of {len(value)} bytes, the map needs {expected}")
        vbuf = _c.create_string_buffer(value, len(value))
        _check(
            f"bpf_map_update_elem({self.name})",
            library().bpf_map_update_elem(self.fd, self._key(key), vbuf, flags),
        )

    def lookup(self, key: bytes) -> bytes | None:
        """The value (for a per-CPU map: all CPUs' slots joined), or None if absent."""
        size = self._slot * self._ncpu if self.percpu else self.value_size
        vbuf = _c.create_string_buffer(size)
        ret = library().bpf_map_lookup_elem(self.fd, self._key(key), vbuf)
        if ret == -errno.ENOENT:
            return None
        _check(f"bpf_map_lookup_elem({self.name})", ret)
        return vbuf.raw

    def lookup_percpu(self, key: bytes) -> list[bytes] | None:
        """A per-CPU map's value, one ``value_size`` slice per possible CPU."""
        raw = self.lookup(key)
        if raw is None:
            return None
        return [raw[i * self._slot : i * self._slot + self.value_size] for i in range(self._ncpu)]

    def delete(self, key: bytes) -> bool:
        """Remove ``key``; False if it was not there."""
        ret = library().bpf_map_delete_elem(self.fd, self._key(key))
        if ret == -errno.ENOENT:
            return False
        _check(f"bpf_map_delete_elem({self.name})", ret)
        return True

    def iter_keys(self) -> Iterator[bytes]:
        """Every key of the map (the kernel order)."""
        lib = library()
        prev: ctypes.Array[ctypes.c_char] | None = None
        nxt = _c.create_string_buffer(self.key_size)
        for _ in range(max(self.max_entries, 1) * 2):  # bound: concurrent updates can restart
            ret = lib.bpf_map_get_next_key(self.fd, prev, nxt)
            if ret == -errno.ENOENT:
                return
            _check(f"bpf_map_get_next_key({self.name})", ret)
            yield nxt.raw
            prev = _c.create_string_buffer(nxt.raw, self.key_size)


class BpfObject:
    """A compiled BPF object file, opened and loaded; ``close`` frees everything."""

    def __init__(self, path: Path | str) -> None:
        lib = library()
        self.path = Path(path)
        self._log = _c.create_string_buffer(_LOG_SIZE)
        self._opts = _OpenOpts(
            sz=_c.sizeof(_OpenOpts),
            kernel_log_buf=_c.addressof(self._log),
            kernel_log_size=_LOG_SIZE,
        )
        _c.set_errno(0)
        ptr = lib.bpf_object__open_file(str(self.path).encode(), _c.byref(self._opts))
        self._obj: int | None = _check_ptr(f"bpf_object__open_file({self.path})", ptr)
        self.loaded = False

    def load(self) -> None:
        ret = library().bpf_object__load(self._handle())
        if ret < 0:
            log = self._log.value.decode(errors="replace")
            tail = log[-_LOG_TAIL:] if log else ""
            raise LibbpfError(f"bpf_object__load({self.path.name})", -ret, tail)
        self.loaded = True

    def _handle(self) -> int:
        if self._obj is None:
            raise LinuxError(f"libbpf: object {self.path.name} is closed")
        return self._obj

    def program(self, name: str) -> BpfProgram:
        lib = library()
        ptr = lib.bpf_object__find_program_by_name(self._handle(), name.encode())
        if not ptr:
            raise LinuxError(f"libbpf: no program {name!r} in {self.path.name}")
        return BpfProgram(name, _check(f"bpf_program__fd({name})", lib.bpf_program__fd(ptr)))

    def map(self, name: str) -> BpfMap:
        ptr = library().bpf_object__find_map_by_name(self._handle(), name.encode())
        if not ptr:
            raise LinuxError(f"libbpf: no map {name!r} in {self.path.name}")
        return BpfMap(name, ptr)

    def close(self) -> None:
        """Free the object: its programs and maps go once nothing else holds them."""
        if self._obj is not None:
            library().bpf_object__close(self._obj)
            self._obj = None

    def __enter__(self) -> BpfObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RingBuffer:
    """A BPF ring buffer consumer; ``callback`` gets each record's bytes."""

    def __init__(self, bpf_map: BpfMap, callback: Callable[[bytes], None]) -> None:
        self._callback = callback
        self.error: BaseException | None = None

        def sample(_ctx: int | None, data: int | None, size: int) -> int:
            try:
                callback(_c.string_at(data or 0, size))
            except BaseException as exc:  # noqa: BLE001 - must not unwind through C
                self.error = exc
                return -1
            return 0

        self._sample = _SAMPLE_FN(sample)  # keep the thunk alive as long as the buffer
        _c.set_errno(0)
        ptr = library().ring_buffer__new(bpf_map.fd, self._sample, None, None)
        self._rb: int | None = _check_ptr(f"ring_buffer__new({bpf_map.name})", ptr)

    def _handle(self) -> int:
        if self._rb is None:
            raise LinuxError("libbpf: ring buffer is freed")
        return self._rb

    def epoll_fd(self) -> int:
        return _check("ring_buffer__epoll_fd", library().ring_buffer__epoll_fd(self._handle()))

    def _raise_callback_error(self) -> None:
        if self.error is not None:
            exc, self.error = self.error, None
            raise exc

    def consume(self) -> int:
        """Hand every record ready now to the callback; never blocks. Returns the count."""
        n = library().ring_buffer__consume(self._handle())
        self._raise_callback_error()
        return _check("ring_buffer__consume", n)

    def poll(self, timeout_ms: int) -> int:
        n = library().ring_buffer__poll(self._handle(), timeout_ms)
        self._raise_callback_error()
        if n == -errno.EINTR:
            return 0
        return _check("ring_buffer__poll", n)

    def free(self) -> None:
        if self._rb is not None:
            library().ring_buffer__free(self._rb)
            self._rb = None
