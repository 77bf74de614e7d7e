"""UDP echo over ILNPv6 through the host daemon, on the two-node bench, at generator rates.

Theory of operation
-------------------
Topology (``two_node_bench()``, reflect mode)::

    gen eth0 fd00:0:10::1 ──veth── sut eth0 fd00:0:10::2
    I-LV fd00:0:10:0/0:0:0:1        I-LV fd00:0:10:0/0:0:0:2
    stampgen (CPU 0)                ``sixlab ilnp host`` + udpecho on [fd00:2ff::2]:7 (CPU 1)

The bench's addresses are read as I-LVs (RFC 6740 §3.1): the upper 64 bits are the
locator both ends share, the lower 64 the NIDs 1 (gen) and 2 (SUT). The SUT runs the
ILNP host daemon (:mod:`sixlab.ilnp.daemon`, nonce in every packet) and ``udpecho.c``,
an ordinary batched UDP echo server (RFC 862) bound to the SUT's identifier address
port 7: it knows nothing of ILNP. The generator runs no daemon: it is the C generator
of :mod:`sixlab.bench.generator`, fed a whole ILNPv6 frame (:func:`ilnp_echo_frame`)::

    Ethernet 14 | IPv6 40: gen I-LV → SUT I-LV, Next Header 60
                | Destination Options 8: Next Header 17, Hdr Ext Len 0, option 0x8B,
                |   length 4, the generator's 32-bit nonce (fixed, RFC 6744 §2)
                | UDP 8: GEN_PORT → 7, checksum over the NID-only pseudo-header
                |   (RFC 6740 §6.3)
                | payload: sequence (4, rewritten per frame) | trial tag (2) | zeros

The generator rewrites the sequence number of each frame and updates the UDP checksum
incrementally (RFC 1624), which is valid for any pseudo-header, the NID-only one too.

One echo: the SUT's daemon reads the frame from its packet ring, checks nonce and
locator (the first frame of the run adopts the generator's NID under policy ``none``,
or answers it through the reply table under ``socket``), writes the packet with
identifier addresses to its TUN device; the kernel delivers it to udpecho (the
identifier prefix sums to one's-complement zero, so the NID-only checksum verifies
unchanged); udpecho sends the datagram back to ``[fd00:2ff::1]:GEN_PORT``, which the
kernel routes into the TUN device; the daemon adds its own nonce and sends the ILNPv6
packet from its raw socket. At the generator an nftables ``netdev ingress`` rule
counts and drops it (:meth:`IlnpEchoTrialRunner.reply_matches`): IPv6 from the SUT's
I-LV, a Destination Options header with the nonce option, UDP from port 7, and the
trial's tag at payload byte 4. The count is the number of echoes that made the whole
round trip; the PDR search of :mod:`sixlab.bench.pdr` runs on it like on STAMP replies.

:func:`preflight` offers one frame and fails loudly unless exactly one echo comes back,
so a bench that measures nothing (wrong checksum, nonce refused, no route back) never
reports a PDR of 0 as a result.

The daemon's fast path (``sixlab ilnp host --fastpath``) is passed through when the
installed daemon has that option; ``off`` works with any daemon.
"""

from __future__ import annotations

import contextlib
import json
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sixlab.bench.generator import (
    GEN_PORT,
    FrameTrialRunner,
    GeneratorError,
    TrialResult,
    build_program,
)
from sixlab.ilnp.daemon import control_request, format_locator
from sixlab.testbed import BenchTestbed, ClosingContext
from sixlab.wire.ilnp import (
    DSTOPTS_NEXT_HEADER,
    ILNP_NONCE_OPTION,
    ILV,
    IPV6_HEADER_SIZE,
    IlnpPacket,
    Nonce,
    encode_packet,
    identifier_address,
    nid_checksum,
)

__all__ = [
    "DEFAULT_PAYLOAD",
    "ECHO_PORT",
    "GEN_NONCE",
    "PREFLIGHT_ATTEMPTS",
    "IlnpEchoSut",
    "IlnpEchoTrialRunner",
    "build_udpecho",
    "daemon_has_fastpath",
    "ilnp_echo_frame",
    "preflight",
]

#: The echo service's port (RFC 862).
ECHO_PORT = 7
#: The generator's nonce toward the SUT: any fixed 32-bit value (RFC 6744 §2); the SUT
#: learns it from the first frame and then requires it on every one (``--nonce always``).
GEN_NONCE = Nonce(bytes.fromhex("6a09e667"))
#: UDP payload bytes: the same 64 as ``benchmarks/bench_ilnp.py daemon`` sends.
DEFAULT_PAYLOAD = 64
#: Where the trial tag sits in the payload: after the 4-byte sequence number.
_TAG_OFFSET = 4
_UDP = struct.Struct("!HHHH")
_IPPROTO_UDP = 17
_SOURCE = Path(__file__).with_name("udpecho.c")
#: The daemon's TUN device (``sixlab ilnp host --tun``, left at its default).
_TUN = "ilnp0"
_UDP6_COUNTERS = frozenset(
    {"Udp6InDatagrams", "Udp6OutDatagrams", "Udp6RcvbufErrors", "Udp6SndbufErrors",
     "Udp6InCsumErrors"}
)  # fmt: skip
#: A daemon or echo server not ready by then has failed (the daemon's start, TUN and
#: nft table included, takes well under a second here).
_START_TIMEOUT_S = 20.0


def build_udpecho(cache: Path | None = None) -> Path:
    """Compile ``udpecho.c`` (cached like the generator, :func:`build_program`)."""
    return build_program(_SOURCE, cache)


def ilnp_echo_frame(
    src_mac: bytes,
    dst_mac: bytes,
    src: ILV,
    dst: ILV,
    *,
    tag: int,
    nonce: Nonce = GEN_NONCE,
    sport: int = GEN_PORT,
    payload_size: int = DEFAULT_PAYLOAD,
) -> bytes:
    """An Ethernet frame with an ILNPv6 UDP echo request (module doc, the layout).

    The payload is a zero sequence number, ``tag`` (16 bits) and zeros up to
    ``payload_size``; the UDP checksum is the NID-only one (RFC 6740 §6.3), 0 sent as
    0xFFFF (RFC 768).
    """
    if payload_size < _TAG_OFFSET + 2:
        raise ValueError(f"payload of {payload_size} bytes cannot hold sequence and tag")
    payload = bytes(_TAG_OFFSET) + tag.to_bytes(2, "big") + bytes(payload_size - _TAG_OFFSET - 2)
    length = _UDP.size + len(payload)
    udp = _UDP.pack(sport, ECHO_PORT, length, 0) + payload
    checksum = nid_checksum(src.nid, dst.nid, _IPPROTO_UDP, udp) or 0xFFFF
    udp = udp[:6] + checksum.to_bytes(2, "big") + udp[8:]
    packet = encode_packet(IlnpPacket(src, dst, _IPPROTO_UDP, udp, nonce))
    return dst_mac + src_mac + b"\x86\xdd" + packet


class IlnpEchoTrialRunner(FrameTrialRunner):
    """Trials of ILNPv6 UDP echo requests; the answers counted are the echoes."""

    def __init__(
        self, tb: BenchTestbed, *, payload_size: int = DEFAULT_PAYLOAD, **kwargs: Any
    ) -> None:
        super().__init__(tb, **kwargs)
        self.gen_ilv = ILV.from_address(tb.gen_addr)
        self.sut_ilv = ILV.from_address(tb.sut_addr)
        self.payload_size = payload_size

    def frame(self, tag: int) -> bytes:
        return ilnp_echo_frame(
            self._src_mac,
            self._dst_mac,
            self.gen_ilv,
            self.sut_ilv,
            tag=tag,
            payload_size=self.payload_size,
        )

    def reply_matches(self, tag: int | None) -> list[str]:
        # Raw offsets from the IPv6 header (why not ``udp sport``: see StampTrialRunner):
        # Next Header 60 at byte 6; the Destination Options header at 40 with Next Header
        # 17, Hdr Ext Len 0 (32-bit nonce, 8 bytes) or 1 (96-bit, 16 bytes) and the nonce
        # option first (RFC 6744 §2); then UDP, source port 7, the tag at payload + 4.
        matches = []
        for hdr_ext_len in (0, 1):
            udp = IPV6_HEADER_SIZE + (hdr_ext_len + 1) * 8
            match = (
                f"ip6 saddr {self.sut_ilv.address} @nh,48,8 {DSTOPTS_NEXT_HEADER} "
                f"@nh,320,8 {_IPPROTO_UDP} @nh,328,8 {hdr_ext_len} "
                f"@nh,336,8 {ILNP_NONCE_OPTION} @nh,{udp * 8},16 {ECHO_PORT}"
            )
            if tag is not None:
                match += f" @nh,{(udp + 8 + _TAG_OFFSET) * 8},16 {tag}"
            matches.append(match)
        return matches


def daemon_has_fastpath() -> bool:
    """Whether the ``sixlab ilnp host`` this interpreter runs has ``--fastpath``."""
    out = subprocess.run(
        [sys.executable, "-m", "sixlab.cli.ilnp", "host", "--help"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return "--fastpath" in out


class IlnpEchoSut(ClosingContext):
    """The SUT side: the ILNP host daemon and udpecho, both pinned to ``cpu``.

    A context manager; :meth:`status` asks the daemon, :meth:`stop` ends both and keeps
    the daemon's last status (``final_status``) and udpecho's counters (``echo``).
    """

    def __init__(
        self,
        tb: BenchTestbed,
        *,
        policy: str = "none",
        store: str = "hash",
        fastpath: str = "off",
        cpu: int = 1,
        batch: int = 64,
    ) -> None:
        self.tb = tb
        self.gen_ilv = ILV.from_address(tb.gen_addr)
        self.sut_ilv = ILV.from_address(tb.sut_addr)
        self.fastpath_passed = daemon_has_fastpath()
        if fastpath != "off" and not self.fastpath_passed:
            raise GeneratorError(
                f"bench: --fastpath {fastpath} asked, but this `sixlab ilnp host` has no "
                "--fastpath option (only 'off' works with it)"
            )
        self.final_status: dict[str, Any] | None = None
        self.echo: dict[str, Any] | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix="sixlab-ilnp-echo-"))
        self.control = str(self._tmp / "sut.sock")
        hosts = self._tmp / "hosts"
        hosts.write_text(f"{self.gen_ilv} gen\n{self.sut_ilv} sut\n")
        argv = [sys.executable, "-m", "sixlab.cli.ilnp", "host"]
        argv += ["--nid", format_locator(self.sut_ilv.nid)]
        argv += ["--locator", format_locator(self.sut_ilv.locator)]
        argv += ["--interface", tb.sut_if, "--policy", policy, "--store", store]
        argv += ["--nonce", "always"]
        argv += ["--control", self.control, "--hosts", str(hosts), "--tun", _TUN]
        if self.fastpath_passed:
            argv += ["--fastpath", fastpath]
        self.daemon_argv = argv
        self._daemon: subprocess.Popen[bytes] | None = None
        self._echo: subprocess.Popen[bytes] | None = None
        try:
            # Standard error goes to files: an unread pipe that fills would stall them.
            with (self._tmp / "daemon.err").open("wb") as err:
                self._daemon = tb.run_pinned(tb.sut, argv, cpu, stdout=subprocess.PIPE, stderr=err)
            _wait_ready(self._daemon, "ilnp host daemon", self._tmp / "daemon.err")
            address = str(identifier_address(self.sut_ilv.nid))
            echo_argv = [str(build_udpecho()), address, str(ECHO_PORT), str(batch)]
            with (self._tmp / "udpecho.err").open("wb") as err:
                self._echo = tb.run_pinned(
                    tb.sut, echo_argv, cpu, stdout=subprocess.PIPE, stderr=err
                )
            _wait_ready(self._echo, "udpecho", self._tmp / "udpecho.err")
        except BaseException:
            self.stop()
            raise

    def status(self) -> dict[str, Any]:
        """The daemon's ``status`` reply (counters, drops, wire, rings, latency, ...)."""
        return control_request(self.control, {"cmd": "status"})

    def kernel_counters(self) -> dict[str, int]:
        """The SUT kernel's view, cumulated since the SUT started: where packets were lost.

        ``tun_tx_dropped``: echoes the kernel could not queue to the daemon's TUN device
        (its queue was full: the daemon did not read fast enough); ``link_rx_dropped``:
        frames the SUT's veth dropped; the UDP counters of ``/proc/net/snmp6``
        (``Udp6InCsumErrors`` stays 0 if the NID-only checksum verifies, RFC 6740 §6.3;
        ``Udp6RcvbufErrors``: udpecho's socket buffer was full).
        """
        testbed = self.tb.testbed
        links = json.loads(testbed.exec_in(self.tb.sut, ["ip", "-j", "-s", "link", "show"]).stdout)
        stats = {link["ifname"]: link.get("stats64", {}) for link in links}
        out: dict[str, int] = {
            "tun_tx_dropped": int(stats.get(_TUN, {}).get("tx", {}).get("dropped", 0)),
            "link_rx_dropped": int(stats.get(self.tb.sut_if, {}).get("rx", {}).get("dropped", 0)),
        }
        snmp6 = testbed.exec_in(self.tb.sut, ["cat", "/proc/net/snmp6"]).stdout
        for line in snmp6.splitlines():
            name, _, value = line.partition(" ")
            if name in _UDP6_COUNTERS:
                out[name] = int(value)
        return out

    def stop(self) -> None:
        """Stop udpecho and the daemon (SIGTERM), keeping what they last reported."""
        if self._daemon is not None and self._daemon.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.final_status = self.status()
        if self._echo is not None:
            out = _terminate(self._echo)
            lines = out.splitlines()
            with contextlib.suppress(ValueError, IndexError):
                self.echo = json.loads(lines[-1])
            self._echo = None
        if self._daemon is not None:
            _terminate(self._daemon)
            self._daemon = None
        shutil.rmtree(self._tmp, ignore_errors=True)

    def close(self) -> None:
        """The same as :meth:`stop` (for ``with``)."""
        self.stop()


def _wait_ready(proc: subprocess.Popen[bytes], what: str, stderr: Path) -> None:
    """Wait for the process's first line, ``ready...``; anything else is an error.

    Both programs print that line once they serve and nothing more on standard output
    until they stop, so the pipe never fills.
    """
    assert proc.stdout is not None
    line = b""
    readable, _, _ = select.select([proc.stdout], [], [], _START_TIMEOUT_S)
    if readable:  # a line, or EOF if the process died
        line = proc.stdout.readline()
    if not line.startswith(b"ready"):
        time.sleep(0.1)  # let a dying process finish its message
        err = stderr.read_text(errors="replace")[-2000:]
        raise GeneratorError(f"bench: {what} did not start ({line!r}): {err}")


def _terminate(proc: subprocess.Popen[bytes]) -> str:
    """SIGTERM, then the process's standard output (SIGKILL after 10 s)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out.decode(errors="replace")


#: Preflight trials that offered nothing are run again up to this many times in all.
PREFLIGHT_ATTEMPTS = 5


def preflight(
    runner: IlnpEchoTrialRunner, sut: IlnpEchoSut, *, attempts: int = PREFLIGHT_ATTEMPTS
) -> TrialResult:
    """Offer one echo request; raise unless exactly one echo came back.

    10 frames/s for 0.15 s is one frame (the generator sends floor(rate * elapsed), from
    0.1 s on). A generator that got no CPU from then until its window closed (a loaded
    machine) offered nothing, which says nothing of the bench: such a trial is run again,
    up to ``attempts`` in all. Any other outcome than one frame offered and its echo
    counted fails at once.
    """
    result = runner.trial(10.0, 0.15)
    for _ in range(attempts - 1):
        if result.offered:
            break
        result = runner.trial(10.0, 0.15)
    if result.offered != 1 or result.received != 1 or result.stale != 0:
        status: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            status = sut.status()
        detail = {k: status.get(k) for k in ("counters", "drops", "wire", "events")}
        raise GeneratorError(
            f"bench: preflight: {result.offered} echo request(s) offered, "
            f"{result.received} echo(es) counted, {result.stale} stale; expected 1/1/0. "
            f"Daemon: {json.dumps(detail)}"
        )
    return result
