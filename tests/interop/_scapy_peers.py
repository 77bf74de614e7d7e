"""Independent STAMP peers built on scapy's ``scapy.contrib.stamp`` layers, for interop tests.

``ScapyReflector`` answers like a Session-Reflector that implements RFC 8762 but not
RFC 8972: the SSID field of its replies is MBZ (zero), whatever follows the base packet
is copied back unread (RFC 8762 §4.3: symmetric size), Seq is the sender's (stateless),
T1, its Error Estimate and Seq are echoed byte for byte, Ses-Sender TTL is the received
Hop Limit / TTL. Every packet it parses and every reply it builds goes through scapy's
layers, not sixlab's codecs.

``ScapyReflector(..., echo_ssid=True)`` answers like an RFC 8972 Session-Reflector
instead: the SSID comes back as the Session-Sender sent it (RFC 8972 §3). ``drop`` and
``duplicate`` pick sender Seqs whose reply is not sent, or sent twice, so that loss and
duplicates are known in advance; ``stray`` picks those whose reply is preceded by a copy
with SSID 0, what anyone who sees the packet could forge from the reflector's address.

scapy's layers have no authenticated layout, and building a PTP timestamp through them
fails (the ``ts`` field picks its NTP form while building), so PTP timestamps are put in
as raw bytes (``RawVal``); parsing PTP works.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from scapy.contrib import stamp as sc
from scapy.fields import RawVal

NTP_UNIX_OFFSET_S = 2_208_988_800
IP_RECVTTL = getattr(socket, "IP_RECVTTL", 12)  # linux/in.h
TAI_UTC_S = 37


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def ptp_raw(unix_ns: int) -> bytes:
    tai = unix_ns + TAI_UTC_S * 1_000_000_000
    return struct.pack("!II", tai // 1_000_000_000, tai % 1_000_000_000)


def ntp_seconds(unix_ns: int) -> float:
    """Seconds since 1900, the form scapy's NTP ``TimeStampField`` takes."""
    return unix_ns / 1e9 + NTP_UNIX_OFFSET_S


class ScapyReflector:
    """An RFC 8762-only Session-Reflector on a UDP socket, in a thread (module doc)."""

    def __init__(
        self,
        address: str,
        *,
        ptp: bool = False,
        echo_ssid: bool = False,
        drop: Callable[[int], bool] | None = None,
        duplicate: Callable[[int], bool] | None = None,
        stray: Callable[[int], bool] | None = None,
    ) -> None:
        family = _family(address)
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        if family == socket.AF_INET6:
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVHOPLIMIT, 1)
        else:
            self.sock.setsockopt(socket.IPPROTO_IP, IP_RECVTTL, 1)
        self.sock.bind((address, 0))
        self.port: int = self.sock.getsockname()[1]
        self.ptp = ptp
        self.echo_ssid = echo_ssid
        self.drop = drop
        self.duplicate = duplicate
        self.stray = stray
        self.answered = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ScapyReflector:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not select.select([self.sock], [], [], 0.1)[0]:
                continue
            data, anc, _, peer = self.sock.recvmsg(9000, socket.CMSG_SPACE(4))
            t2 = time.time_ns()
            ttl = next((struct.unpack("@i", v)[0] for _, _, v in anc), 255)
            seq = struct.unpack_from("!I", data)[0] if len(data) >= 4 else -1
            if self.drop is not None and self.drop(seq):
                continue
            try:
                reply = self.reply(data, t2, ttl)
                if self.stray is not None and self.stray(seq):
                    self.sock.sendto(reply[:14] + bytes(2) + reply[16:], peer)
                self.sock.sendto(reply, peer)
                self.answered += 1
                if self.duplicate is not None and self.duplicate(seq):
                    self.sock.sendto(reply, peer)
            except Exception as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(repr(exc))

    def reply(self, data: bytes, t2_ns: int, ttl: int) -> bytes:
        got = sc.STAMPSessionSenderTestUnauthenticated(data)
        ee = sc.ErrorEstimate(S=0, Z=int(self.ptp), scale=0, multiplier=1)
        t3_ns = time.time_ns()
        fields: dict[str, Any] = {
            "seq": got.seq,
            "err_estimate": ee,
            "ssid": got.ssid if self.echo_ssid else 0,  # MBZ to an RFC 8762 reflector
            "seq_sender": got.seq,
            "ts_sender": RawVal(data[4:12]),
            "err_estimate_sender": sc.ErrorEstimate(data[12:14]),
            "ttl_sender": ttl,
        }
        if self.ptp:
            fields["ts"] = RawVal(ptp_raw(t3_ns))
            fields["ts_rx"] = RawVal(ptp_raw(t2_ns))
        else:
            fields["ts"] = ntp_seconds(t3_ns)
            fields["ts_rx"] = ntp_seconds(t2_ns)
        base = bytes(sc.STAMPSessionReflectorTestUnauthenticated(**fields))
        return base[:44] + data[44:]  # what follows the base packet, copied unread
