"""Count the packets of one data flow in the kernel: an owned nftables table of counters.

The Direct Measurement TLV (RFC 8972 §4.5) carries packet counters of the *data* flow a
STAMP session watches; what that flow is, the RFC leaves to the implementation
(docs/srpm.md, "Direct-mode loss", states sixlab's choice). :class:`FlowCounters` owns
one ``ip6`` table with up to three chains, each holding one counting rule:

- ``tx_out`` (hook ``output``) and ``tx_fwd`` (hook ``forward``): packets this node sends
  or forwards whose destination at that hook is in the *tx* match, summed as "sent";
  locally sent traffic steered into an SRv6 policy by a ``seg6`` encap route passes
  ``output`` before it is encapsulated, so its inner destination is what matches;
- ``rx`` (hook ``prerouting``): packets arriving with a destination in the *rx* match,
  before any SRv6 processing of this node (decapsulation included).

A match is a destination prefix, optionally narrowed to one transport protocol and one
destination port (``udp dport 9000``): a prefix alone counts everything to it, STAMP
test packets included.

Installing runs ``nft -f`` once (milliseconds). Reading asks the kernel for the table's
rules over one netlink socket (``NETLINK_NETFILTER``, an ``NFT_MSG_GETRULE`` dump
limited to the table) and decodes them with pyroute2's ``nft_rule_msg``: tens of
microseconds, fast enough to read at every test packet. The socket is opened in the
network namespace of the thread that installed the table and used under a lock from any
thread; ``nft`` runs of the object (install, remove) enter that namespace first
(``setns(2)``), whichever thread calls. Ownership follows :mod:`sixlab.linux.nftdrop`:
the table's comment names the owner pid; a dead owner's leftover is replaced, a live
owner's refused.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import ipaddress
import itertools
import os
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sixlab.linux.errors import LinuxError
from sixlab.linux.nftdrop import _alive, _nft, _table_owner

__all__ = ["FlowCounters", "FlowCountersError", "FlowMatch"]

#: NFPROTO_IPV6 (<linux/netfilter.h>): the family of ``ip6`` tables.
_NFPROTO_IPV6 = 10
#: <linux/netlink.h>, <linux/netfilter/nfnetlink.h>, <linux/netfilter/nf_tables.h>.
_NETLINK_NETFILTER = 12
_NLM_F_REQUEST = 0x1
_NLM_F_DUMP = 0x300
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_NFNL_SUBSYS_NFTABLES = 10
_NFT_MSG_GETRULE = 7
_NFTA_RULE_TABLE = 1
_NLMSG = struct.Struct("=IHHII")
_NFGEN = struct.Struct("=BBH")
_PROTOCOLS = ("udp", "tcp")
#: <sched.h>
_CLONE_NEWNET = 0x40000000
_THREAD_NS = "/proc/thread-self/ns/net"


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise FlowCountersError(f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def _in_netns(fd: int | None) -> Iterator[None]:
    """The calling thread inside the namespace of ``fd`` for the body (None: stay)."""
    if fd is None or os.fstat(fd).st_ino == Path(_THREAD_NS).stat().st_ino:
        yield
        return
    home = os.open(_THREAD_NS, os.O_RDONLY)
    try:
        _setns(fd)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)


class FlowCountersError(LinuxError):
    """nftables is missing, refused the table, or the counters cannot be read."""


@dataclass(frozen=True, slots=True)
class FlowMatch:
    """Which packets count: destination ``prefix``, optionally one protocol and port."""

    prefix: ipaddress.IPv6Network
    protocol: str | None = None
    port: int | None = None

    def __post_init__(self) -> None:
        if self.protocol is not None and self.protocol not in _PROTOCOLS:
            raise ValueError(f"protocol: {self.protocol!r} is not one of {_PROTOCOLS}")
        if self.port is not None:
            if self.protocol is None:
                raise ValueError("port: a destination port needs a protocol (udp or tcp)")
            if not 0 < self.port <= 0xFFFF:
                raise ValueError(f"port: {self.port} is not a port (1..65535)")

    @classmethod
    def parse(cls, prefix: str, protocol: str = "", port: int = 0) -> FlowMatch:
        """From text (``"fd00:0:2::/64"``); empty protocol and port 0 mean "any"."""
        try:
            network = ipaddress.IPv6Network(prefix, strict=False)
        except ValueError:
            raise ValueError(f"prefix: {prefix!r} is not an IPv6 prefix") from None
        return cls(network, protocol or None, port or None)

    def statement(self) -> str:
        """The nftables match of this flow (before the ``counter``)."""
        match = f"ip6 daddr {self.prefix}"
        if self.protocol is not None:
            match += f" meta l4proto {self.protocol}"
            if self.port is not None:
                match += f" {self.protocol} dport {self.port}"
        return match


class FlowCounters:
    """The ``ip6`` table ``table`` counting one flow sent (``tx``) and received (``rx``)."""

    def __init__(
        self, table: str, *, tx: FlowMatch | None = None, rx: FlowMatch | None = None
    ) -> None:
        if tx is None and rx is None:
            raise ValueError("flow counters need a tx or an rx match")
        self.table = table
        self.tx = tx
        self.rx = rx
        self.installed = False
        self._ns: int | None = None  # the namespace the table lives in (an fd)
        self._nl: socket.socket | None = None  # netlink socket in that namespace
        self._nl_lock = threading.Lock()
        self._seq = itertools.count(1)

    def ruleset(self) -> str:
        """The ``nft -f`` script that creates the table."""
        chains = []
        if self.tx is not None:
            for name, hook in (("tx_out", "output"), ("tx_fwd", "forward")):
                chains.append((name, hook, self.tx))
        if self.rx is not None:
            chains.append(("rx", "prerouting", self.rx))
        body = "".join(
            f"  chain {name} {{\n"
            f"    type filter hook {hook} priority filter; policy accept;\n"
            f"    {match.statement()} counter\n  }}\n"
            for name, hook, match in chains
        )
        return f'table ip6 {self.table} {{\n  comment "sixlab pid={os.getpid()}"\n{body}}}\n'

    def _owner(self) -> int | None:
        return _table_owner(self.table)

    def install(self) -> None:
        """Create the table (counters from 0); replace a dead owner's, refuse a live one's."""
        if self.installed:
            return
        if self._ns is None:
            self._ns = os.open(_THREAD_NS, os.O_RDONLY)
        with _in_netns(self._ns):
            self._install()
            if self._nl is None:
                nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
                nl.bind((0, 0))
                self._nl = nl
        self.installed = True
        atexit.register(self.remove)
        # The first read imports pyroute2's decoder: done now, so that the first test
        # packet's counts are read when it passes, not a hundred milliseconds later.
        self.read()

    def _install(self) -> None:
        try:
            owner = self._owner()
        except LinuxError as exc:
            raise FlowCountersError(str(exc)) from exc
        if owner and owner != os.getpid() and _alive(owner):
            raise FlowCountersError(f"nft table ip6 {self.table} belongs to live process {owner}")
        try:
            if owner is not None:
                _nft("delete", "table", "ip6", self.table, check=False)
            _nft("-f", "-", stdin=self.ruleset())
        except LinuxError as exc:
            raise FlowCountersError(str(exc)) from exc

    def remove(self) -> None:
        """Delete the table if this object installed it; safe to call twice."""
        if not self.installed:
            return
        self.installed = False
        atexit.unregister(self.remove)
        with self._nl_lock:
            if self._nl is not None:
                self._nl.close()
                self._nl = None
        with _in_netns(self._ns):
            if self._owner() == os.getpid():
                _nft("delete", "table", "ip6", self.table, check=False)
        if self._ns is not None:
            os.close(self._ns)
            self._ns = None

    def read(self) -> tuple[int, int]:
        """(packets sent, packets received) so far; 0 for a direction not counted."""
        if not self.installed:
            raise FlowCountersError(f"nft table ip6 {self.table}: not installed")
        sums = {"tx": 0, "rx": 0}
        for rule in self._rules():
            if rule.get_attr("NFTA_RULE_TABLE") != self.table:
                continue
            chain = str(rule.get_attr("NFTA_RULE_CHAIN"))
            packets = _counter_packets(rule)
            if packets is not None:
                sums["rx" if chain == "rx" else "tx"] += packets
        return sums["tx"], sums["rx"]

    def _rules(self) -> list[Any]:
        """The table's rules, decoded (an ``NFT_MSG_GETRULE`` dump of this table)."""
        from pyroute2.netlink.nfnetlink.nftsocket import nft_rule_msg  # noqa: PLC0415

        name = self.table.encode() + b"\0"
        attr = struct.pack("=HH", 4 + len(name), _NFTA_RULE_TABLE) + name
        attr += bytes(-len(attr) % 4)
        body = _NFGEN.pack(_NFPROTO_IPV6, 0, 0) + attr
        kind = (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_GETRULE
        rules: list[Any] = []
        with self._nl_lock:
            nl = self._nl
            if nl is None:
                raise FlowCountersError(f"nft table ip6 {self.table}: not installed")
            seq = next(self._seq)
            try:
                nl.send(_NLMSG.pack(_NLMSG.size + len(body), kind, _NLM_F_REQUEST | _NLM_F_DUMP,
                                    seq, 0) + body)  # fmt: skip
                while True:
                    data = nl.recv(1 << 16)
                    offset = 0
                    while offset + _NLMSG.size <= len(data):
                        length, mtype, _flags, mseq, _pid = _NLMSG.unpack_from(data, offset)
                        if length < _NLMSG.size:
                            raise FlowCountersError(f"nft table ip6 {self.table}: bad reply")
                        if mseq == seq:
                            if mtype == _NLMSG_DONE:
                                return rules
                            if mtype == _NLMSG_ERROR:
                                errno = -struct.unpack_from("=i", data, offset + _NLMSG.size)[0]
                                raise FlowCountersError(
                                    f"nft table ip6 {self.table}: cannot read: {os.strerror(errno)}"
                                )
                            msg = nft_rule_msg(data[offset : offset + length])
                            msg.decode()
                            rules.append(msg)
                        offset += (length + 3) & ~3
            except OSError as exc:
                raise FlowCountersError(f"nft table ip6 {self.table}: cannot read: {exc}") from exc


def _counter_packets(rule: Any) -> int | None:
    """The packet count of the rule's ``counter`` expression, or None if it has none."""
    for expr in rule.get_attr("NFTA_RULE_EXPRESSIONS") or ():
        if expr.get_attr("NFTA_EXPR_NAME") == "counter":
            data = expr.get_attr("NFTA_EXPR_DATA")
            return int(data.get_attr("NFTA_COUNTER_PACKETS"))
    return None
