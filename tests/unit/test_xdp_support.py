"""The XDP plane's user-space parts: build cache, libbpf errors, map layouts, records.

No program is attached here; the tests that load objects into the kernel need root and
carry the marker.
"""

from __future__ import annotations

import ctypes
import errno
import re
import struct
import time
from ipaddress import IPv6Address
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.dataplane.base import DataplaneConfig, DataplaneError, available, create
from sixlab.dataplane.xdp_plane import (
    MAX_RETURN_SEGMENTS,
    Reason,
    XdpDataplane,
    measure_tai_offset_ns,
    pack_config,
    pack_session,
    record_to_received,
    session_key,
)
from sixlab.linux import LinuxError, bpfbuild, libbpf
from sixlab.stamp.reflector import ReflectorMode, ReflectorSessionConfig
from sixlab.wire import stamp as wire
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat

RECORD = struct.Struct("<QQQQIIHHHBBHHI16s16s")
u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
u16 = st.integers(0, 0xFFFF)


# ---------------------------------------------------------------------------- build


def test_missing_tool_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(bpfbuild, "_EXTRA_PATH", ())
    with pytest.raises(bpfbuild.BuildError, match="apt-get install clang"):
        bpfbuild.find_tool("clang")
    with pytest.raises(bpfbuild.BuildError, match="apt-get install bpftool"):
        bpfbuild.find_tool("bpftool")


def test_missing_btf_is_explained(tmp_path: Path) -> None:
    with pytest.raises(bpfbuild.BuildError, match="CONFIG_DEBUG_INFO_BTF"):
        bpfbuild.build_objects(tmp_path, btf=tmp_path / "nope")


def test_cache_key_follows_the_kernel_btf(tmp_path: Path) -> None:
    clang = bpfbuild.find_tool("clang")
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"kernel one")
    b.write_bytes(b"kernel two")
    assert bpfbuild.cache_key(clang, a) == bpfbuild.cache_key(clang, a)
    assert bpfbuild.cache_key(clang, a) != bpfbuild.cache_key(clang, b)


def test_cache_root_honours_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIXLAB_BPF_CACHE", "/x/y")
    assert bpfbuild.cache_root() == Path("/x/y")
    monkeypatch.delenv("SIXLAB_BPF_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "/c")
    assert bpfbuild.cache_root() == Path("/c/sixlab/bpf")


def test_build_compiles_once_then_uses_the_cache(tmp_path: Path) -> None:
    first = bpfbuild.build_objects(tmp_path)
    assert set(first) == set(bpfbuild.PROGRAMS)
    stamps = {name: path.stat().st_mtime_ns for name, path in first.items()}
    assert all(path.read_bytes()[:4] == b"\x7fELF" for path in first.values())
    assert (next(iter(first.values())).parent / "vmlinux.h").stat().st_size > 0
    second = bpfbuild.build_objects(tmp_path)
    assert second == first
    assert {name: path.stat().st_mtime_ns for name, path in second.items()} == stamps


# --------------------------------------------------------------------------- libbpf


def test_missing_libbpf_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_lib(*_args: object, **_kwargs: object) -> ctypes.CDLL:
        raise OSError("libbpf.so.1: cannot open shared object file")

    monkeypatch.setattr(libbpf, "_LIB", None)
    monkeypatch.setattr(ctypes, "CDLL", no_lib)
    with pytest.raises(LinuxError, match="apt-get install libbpf1"):
        libbpf.library()


def test_libbpf_error_messages() -> None:
    err = libbpf.LibbpfError("bpf_xdp_attach(ifindex 3)", errno.EPERM)
    assert err.errno == errno.EPERM
    assert "bpf_xdp_attach(ifindex 3) failed: EPERM" in str(err)
    assert "root" in str(err)
    assert isinstance(err, LinuxError)
    busy = libbpf.LibbpfError("x", errno.EBUSY, "log tail")
    assert str(busy).endswith("\nlog tail")


def test_opening_a_missing_object_raises() -> None:
    with pytest.raises(libbpf.LibbpfError) as info:
        libbpf.BpfObject("/nonexistent/x.bpf.o")
    assert info.value.errno == errno.ENOENT


@pytest.mark.root
def test_loaded_object_maps_and_program_info() -> None:
    obj = libbpf.BpfObject(bpfbuild.build_objects()["stamp_reflector"])
    try:
        obj.load()
        sessions = obj.map("stamp_sessions")
        assert (sessions.key_size, sessions.value_size) == (4, 152)
        assert not sessions.percpu
        key = session_key(5)
        assert sessions.lookup(key) is None
        value = pack_session(ReflectorSessionConfig(ssid=5))
        sessions.update(key, value)
        assert sessions.lookup(key) == value
        assert list(sessions.iter_keys()) == [key]
        assert sessions.delete(key)
        assert not sessions.delete(key)
        with pytest.raises(ValueError, match="key of 2 bytes"):
            sessions.lookup(b"\0\0")
        counters = obj.map("stamp_counters")
        assert counters.percpu
        counters.update(struct.pack("<II", 1, 2), struct.pack("<Q", 3))
        slots = counters.lookup_percpu(struct.pack("<II", 1, 2))
        assert slots is not None
        assert len(slots) == libbpf.num_possible_cpus()
        assert {struct.unpack("<Q", s)[0] for s in slots} == {3}
        info = obj.program("stamp_reflector").info()
        assert info.name == "stamp_reflector"
        assert info.id > 0
        assert libbpf.prog_info_by_id(info.id) == info
        with pytest.raises(LinuxError, match="no map 'nope'"):
            obj.map("nope")
    finally:
        obj.close()
    with pytest.raises(LinuxError, match="closed"):
        obj.program("stamp_reflector")


# ---------------------------------------------------------------------- map layouts


def test_session_layout() -> None:
    ret = (IPv6Address("fc00::1"), IPv6Address("fc00::2"))
    ee = ErrorEstimate(synchronized=True, fmt=TimestampFormat.PTP, scale=3, multiplier=9)
    cfg = ReflectorSessionConfig(
        ssid=4,
        mode=ReflectorMode.STATEFUL,
        fmt=TimestampFormat.PTP,
        error_estimate=ee,
        return_segments=ret,
        tai_utc_offset_ns=36_000_000_000,
    )
    raw = pack_session(cfg)
    assert len(raw) == 152
    assert raw[:4] == bytes([1, 1, 0, 2])
    assert struct.unpack_from("<H", raw, 4)[0] == ee.to_int()
    assert struct.unpack_from("<I", raw, 8)[0] == 0  # stateful Seq starts at 0
    assert struct.unpack_from("<q", raw, 16)[0] == 36_000_000_000
    # Wire order: the last segment to visit first.
    assert raw[24:56] == ret[1].packed + ret[0].packed
    assert raw[56:] == bytes(96)


def test_sessions_left_to_user_space() -> None:
    auth = pack_session(ReflectorSessionConfig(ssid=1, key=b"k"))
    assert auth[2] == 1
    long = tuple(IPv6Address(f"fc00::{i + 1}") for i in range(MAX_RETURN_SEGMENTS + 1))
    assert pack_session(ReflectorSessionConfig(ssid=1, return_segments=long))[2:4] == b"\x01\x00"
    default_ee = ErrorEstimate.for_error_ns(1000).to_int()
    assert struct.unpack_from("<H", pack_session(ReflectorSessionConfig(ssid=None)), 4)[0] == (
        default_ee
    )


def test_reasons_mirror_the_c_enum() -> None:
    """``Reason`` has the values of ``enum stamp_reason`` (stamp_common.h), R_MAX aside."""
    header = (bpfbuild.source_dir() / "stamp_common.h").read_text()
    body = header[header.index("enum stamp_reason {") :]
    body = body[: body.index("};")]
    c = {name: int(v) for name, v in re.findall(r"\bR_(\w+) = (\d+),", body)}
    assert c.pop("MAX") == len(Reason)
    assert sorted(c.values()) == [r.value for r in Reason]
    assert c["PASS_BAD_CSUM"] == Reason.PASS_BAD_CHECKSUM
    assert c["PASS_CSUM"] == Reason.PASS_CHECKSUM_ZERO


def test_keys_and_config() -> None:
    assert session_key(None) == struct.pack("<I", 0x10000)
    assert session_key(0xFFFF) == struct.pack("<I", 0xFFFF)
    assert pack_config(862, 64, -37) == struct.pack("<HBBIq", 862, 64, 0, 0, -37)


def test_tai_offset_is_whole_seconds_and_matches_the_clocks() -> None:
    off = measure_tai_offset_ns()
    assert off % 1_000_000_000 == 0
    diff = time.clock_gettime_ns(time.CLOCK_TAI) - time.clock_gettime_ns(time.CLOCK_REALTIME)
    assert abs(diff - off) < 100_000_000


@settings(max_examples=200, deadline=None)
@given(
    t4=u64,
    t1=u64,
    t2=u64,
    t3=u64,
    seq=u32,
    rseq=u32,
    ssid=u16,
    see=u16,
    ree=u16,
    ttl=st.integers(0, 255),
    hop=st.integers(0, 255),
    ports=st.tuples(u16, u16),
    addrs=st.tuples(st.binary(min_size=16, max_size=16), st.binary(min_size=16, max_size=16)),
    offset=st.integers(0, 40_000_000_000),
)
def test_record_is_the_reflector_packet_reencoded(
    t4: int,
    t1: int,
    t2: int,
    t3: int,
    seq: int,
    rseq: int,
    ssid: int,
    see: int,
    ree: int,
    ttl: int,
    hop: int,
    ports: tuple[int, int],
    addrs: tuple[bytes, bytes],
    offset: int,
) -> None:
    rec = RECORD.pack(t4, t1, t2, t3, seq, rseq, ssid, see, ree, ttl, hop, *ports, 0, *addrs)
    rx = record_to_received(rec, offset)
    pkt = wire.ReflectorPacket(
        rseq,
        t3,
        ErrorEstimate.from_int(ree),
        ssid,
        t2,
        seq,
        t1,
        ErrorEstimate.from_int(see),
        ttl,
    )
    assert rx.payload == wire.encode_reflector(pkt)
    assert wire.decode_reflector(rx.payload) == pkt
    assert (rx.src, rx.dst, rx.src_port, rx.dst_port, rx.hop_limit) == (*addrs, *ports, hop)
    assert rx.rx_ns == t4 - offset


# ------------------------------------------------------------------------- the plane


def test_plane_is_registered_and_needs_an_interface() -> None:
    assert "xdp" in available()
    plane = create("xdp", DataplaneConfig(862))
    assert isinstance(plane, XdpDataplane)
    with pytest.raises(DataplaneError, match="needs an interface"):
        plane.open()
    with pytest.raises(DataplaneError, match="no interface"):
        XdpDataplane(DataplaneConfig(862, interface="sixlab-nope0")).open()
    with pytest.raises(DataplaneError, match="not open"):
        plane.counters()
    with pytest.raises(DataplaneError, match="not open"):
        plane.fileno()
    with pytest.raises(DataplaneError, match="hop_limit"):
        XdpDataplane(DataplaneConfig(862), hop_limit=0)
    plane.close()  # closing a plane never opened is fine
