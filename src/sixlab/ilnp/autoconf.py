"""Locators learned from Router Advertisements (``sixlab ilnp host`` without ``--locator``).

Theory of operation
-------------------
A host's locators are the /64 prefixes of the subnetworks its links attach to (RFC 6740
§3); on an IPv6 link the router says which they are in the Prefix Information options of
its Router Advertisements (RFC 4861 §4.6.2), with a valid and a preferred lifetime. The
kernel already processes those (RFC 4862 stateless autoconfiguration): with an interface
*token* set (``ip token``, ``IFLA_INET6_TOKEN``) it forms each address as prefix|token
instead of prefix|EUI-64, so with the token set to our NID every autoconfigured address
*is* one of our I-LVs, locator|NID (RFC 6740 §3). The kernel then does everything the
RFCs ask of a prefix: lifetimes counted down, the address deprecated when its preferred
lifetime ends, removed when its valid lifetime ends (with RFC 4862 §5.5.3 e's two-hour
rule against forged short lifetimes), a new prefix added when a router starts
advertising it. The daemon only reads the result over netlink — the kernel's own
addresses, which a dump can list at any time, rather than ``RTM_NEWPREFIX``
notifications, which cannot be dumped (a daemon started after the last RA would wait
for the next one) and would make us redo the lifetime rules. Choice and reasons:
``docs/ilnp-field.md``, "Locators from Router Advertisements".

What is learned, per usable address whose interface identifier is our NID, that the
kernel made (not ``IFA_F_PERMANENT``) and that passed duplicate address detection:

* locator: the address's /64;
* preference: the interface's position among ``--interface`` × 10, plus
  :data:`DEPRECATED_PENALTY` when the address is deprecated (RFC 4862 §5.5.4: keep it for
  what is under way, prefer the others), so correspondents move off a prefix being
  renumbered away while packets still in flight to it arrive;
* lifetime: the remaining valid lifetime, at most 0xFFFF s (the Locator Update field,
  RFC 6743 §2).

The set is advertised again (a Locator Update) when it changes, and also when the
router has extended a locator's lifetime well beyond what correspondents were told (less
than half of the kernel's remaining valid lifetime left of the advertised one):
otherwise a correspondent would let our locator expire while the router still offers it.

DNS servers come with the RAs too (the RDNSS option, RFC 8106 §5.1): the kernel hands
each RA's options it does not process itself to user space (``RTM_NEWNDUSEROPT`` on the
``RTNLGRP_ND_USEROPT`` netlink group), where :meth:`RouterAdvertisements.dns_servers`
collects them with their lifetimes; the daemon resolves names with them
(:mod:`sixlab.ilnp.resolve`). The group is joined before the token is set, so the
answer to the solicitation is not missed.

While the daemon runs it sets on each link the token and, if they are off, ``accept_ra``
(2 on a forwarding link, where 1 ignores RAs) and ``autoconf``; setting the token makes
the kernel send a Router Solicitation at once. At exit it puts back the old values: the
kernel then drops the tokenized addresses.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sixlab.ilnp._errors import ConfigError
from sixlab.wire.ilnp import LocatorEntry

__all__ = [
    "DEPRECATED_PENALTY",
    "LearnedPrefix",
    "RouterAdvertisements",
    "learned_entries",
    "needs_readvertising",
    "parse_rdnss",
    "read_learned",
]

#: Preference added to a deprecated locator (RFC 6743 §2: lower is preferred).
DEPRECATED_PENALTY = 1000
_INTERFACE_STEP = 10
_MAX_LIFETIME = 0xFFFF
_INFINITE = 0xFFFFFFFF
# <linux/if_addr.h>
_IFA_F_DADFAILED = 0x08
_IFA_F_DEPRECATED = 0x20
_IFA_F_TENTATIVE = 0x40
_IFA_F_PERMANENT = 0x80
_RT_SCOPE_UNIVERSE = 0
_U64 = (1 << 64) - 1
_SYSCTL = "/proc/sys/net/ipv6/conf/{}/{}"
# <linux/rtnetlink.h>, <net/ndisc.h>: RA options for user space, and RDNSS (RFC 8106).
_RTNLGRP_ND_USEROPT = 20
_RTM_NEWNDUSEROPT = 68
_ND_OPT_RDNSS = 25
_NLMSG = struct.Struct("=IHHII")
_NDUSEROPT = struct.Struct("=BBHiBBHI")


@dataclass(frozen=True, slots=True)
class LearnedPrefix:
    """One autoconfigured locator|NID address as the kernel holds it."""

    locator: int
    interface: str
    deprecated: bool
    #: Remaining valid lifetime in seconds; None: infinite.
    valid: int | None

    def json(self) -> dict[str, object]:
        return {
            "locator": ":".join(f"{(self.locator >> s) & 0xFFFF:x}" for s in (48, 32, 16, 0)),
            "interface": self.interface,
            "deprecated": self.deprecated,
            "valid": self.valid,
        }


def learned_entries(
    learned: Iterable[LearnedPrefix], interfaces: Sequence[str]
) -> tuple[LocatorEntry, ...]:
    """Our locator set from what the kernel learned (module doc), most preferred first.

    A locator held on two links counts once, with its better preference.
    """
    best: dict[int, LocatorEntry] = {}
    for prefix in learned:
        position = interfaces.index(prefix.interface) if prefix.interface in interfaces else 0
        preference = position * _INTERFACE_STEP + (DEPRECATED_PENALTY if prefix.deprecated else 0)
        lifetime = _MAX_LIFETIME if prefix.valid is None else min(prefix.valid, _MAX_LIFETIME)
        entry = LocatorEntry(prefix.locator, preference, lifetime)
        old = best.get(prefix.locator)
        if old is None or (entry.preference, -entry.lifetime) < (old.preference, -old.lifetime):
            best[prefix.locator] = entry
    return tuple(sorted(best.values(), key=lambda e: (e.preference, e.locator)))


def _key(entries: Iterable[LocatorEntry]) -> frozenset[tuple[int, int]]:
    return frozenset((e.locator, e.preference) for e in entries)


def needs_readvertising(
    advertised: Sequence[LocatorEntry], elapsed: float, now_entries: Sequence[LocatorEntry]
) -> bool:
    """Whether ``now_entries`` must be advertised, ``advertised`` having gone out
    ``elapsed`` seconds ago: the set or a preference changed, or a locator's lifetime
    left at correspondents is under half of what the kernel gives it now."""
    if _key(advertised) != _key(now_entries):
        return True
    told = {e.locator: e.lifetime - elapsed for e in advertised}
    return any(told[e.locator] < e.lifetime / 2 for e in now_entries)


def read_learned(nid: int, interfaces: Iterable[str]) -> list[LearnedPrefix]:
    """The kernel's autoconfigured locator|NID addresses on ``interfaces`` (module doc)."""
    from pyroute2 import IPRoute  # noqa: PLC0415 - netlink only in the daemon

    names: dict[int, str] = {}
    out: list[LearnedPrefix] = []
    with IPRoute() as ipr:
        for wanted in interfaces:
            found = ipr.link_lookup(ifname=wanted)
            if found:
                names[found[0]] = wanted
        for addr in ipr.get_addr(family=socket.AF_INET6):
            name = names.get(addr["index"])
            flags = addr.get("IFA_FLAGS") or addr["flags"]
            if (
                name is None
                or addr["scope"] != _RT_SCOPE_UNIVERSE
                or flags & (_IFA_F_PERMANENT | _IFA_F_TENTATIVE | _IFA_F_DADFAILED)
            ):
                continue
            value = int(ipaddress.IPv6Address(addr.get("IFA_ADDRESS")))
            if value & _U64 != nid:
                continue
            info = addr.get("IFA_CACHEINFO") or {}
            valid = info.get("ifa_valid", _INFINITE)
            preferred = info.get("ifa_preferred", _INFINITE)
            out.append(
                LearnedPrefix(
                    value >> 64,
                    name,
                    deprecated=bool(flags & _IFA_F_DEPRECATED) or preferred == 0,
                    valid=None if valid == _INFINITE else int(valid),
                )
            )
    return out


def parse_rdnss(data: bytes, ifindexes: Iterable[int]) -> list[tuple[str, int]]:
    """The RDNSS servers in netlink ``RTM_NEWNDUSEROPT`` messages about one of
    ``ifindexes``, as (address, lifetime in seconds; 0: withdrawn); the rest, and
    anything malformed, skipped."""
    wanted = set(ifindexes)
    found: list[tuple[str, int]] = []
    offset = 0
    while offset + _NLMSG.size <= len(data):
        length, kind = _NLMSG.unpack_from(data, offset)[:2]
        if length < _NLMSG.size or offset + length > len(data):
            break
        body = data[offset + _NLMSG.size : offset + length]
        offset += (length + 3) & ~3
        if kind != _RTM_NEWNDUSEROPT or len(body) < _NDUSEROPT.size:
            continue
        family, _pad, opts_len, ifindex, icmp_type = _NDUSEROPT.unpack_from(body)[:5]
        if family != socket.AF_INET6 or ifindex not in wanted or icmp_type != 134:
            continue
        options = body[_NDUSEROPT.size : _NDUSEROPT.size + opts_len]
        at = 0
        while at + 8 <= len(options):
            kind_opt, units = options[at], options[at + 1]
            if units == 0:
                break
            option = options[at : at + units * 8]
            at += units * 8
            if kind_opt != _ND_OPT_RDNSS or len(option) < 24:
                continue
            (lifetime,) = struct.unpack_from("!I", option, 4)
            for start in range(8, len(option) - 15, 16):
                address = ipaddress.IPv6Address(option[start : start + 16])
                found.append((str(address), lifetime))
    return found


class RouterAdvertisements:
    """The links set up for learning, and the learned set (module doc).

    :meth:`open` sets tokens and sysctls, :meth:`wait` waits for the first locator,
    :meth:`poll` says when the set must be advertised, :meth:`close` undoes
    :meth:`open` (safe twice).
    """

    def __init__(
        self,
        nid: int,
        interfaces: Sequence[str],
        *,
        read: Callable[[], list[LearnedPrefix]] | None = None,
    ) -> None:
        self.nid = nid
        self.interfaces = tuple(interfaces)
        self.read = read if read is not None else lambda: read_learned(nid, self.interfaces)
        self.learned: list[LearnedPrefix] = []
        self.advertised: tuple[LocatorEntry, ...] = ()
        self._advertised_at = 0.0
        self._tokens: dict[str, str] = {}
        self._sysctls: dict[Path, str] = {}
        self.read_errors = 0
        #: RDNSS servers learned, in order, to when their lifetime ends (monotonic).
        self._dns: dict[str, float] = {}
        self._useropts: socket.socket | None = None

    def open(self) -> None:
        """Let each link take RAs and form locator|NID addresses (module doc)."""
        token = str(ipaddress.IPv6Address(self.nid))
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
            self._useropts = sock
            sock.bind((0, 1 << (_RTNLGRP_ND_USEROPT - 1)))
            sock.setblocking(False)
            for name in self.interfaces:
                forwarding = self._sysctl(name, "forwarding").read_text().strip() == "1"
                self._ensure(name, "accept_ra", "2" if forwarding else "1")
                self._ensure(name, "autoconf", "1")
                old = _token(name)
                # Our own token already: a killed daemon's, to be cleared at exit.
                self._tokens[name] = "::" if old == token else old
                _ip("token", "set", token, "dev", name)
        except BaseException:
            self.close()
            raise

    def _sysctl(self, name: str, key: str) -> Path:
        return Path(_SYSCTL.format(name, key))

    def _ensure(self, name: str, key: str, value: str) -> None:
        path = self._sysctl(name, key)
        old = path.read_text().strip()
        if old == "0" or (key == "accept_ra" and value == "2" and old != "2"):
            path.write_text(f"{value}\n")
            self._sysctls[path] = old

    def close(self) -> None:
        if self._useropts is not None:
            self._useropts.close()
            self._useropts = None
        for name, old in self._tokens.items():
            with contextlib.suppress(ConfigError):  # the link is gone: nothing to undo
                _ip("token", "set", old, "dev", name)
        self._tokens.clear()
        for path, old in self._sysctls.items():
            with contextlib.suppress(OSError):
                path.write_text(f"{old}\n")
        self._sysctls.clear()

    def wait(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        """Until a locator is learned; :class:`ConfigError` after ``timeout`` seconds."""
        deadline = clock() + timeout
        while not self._read():
            if clock() >= deadline:
                raise ConfigError(
                    f"no Router Advertisement gave a prefix on {', '.join(self.interfaces)} "
                    f"in {timeout:g} s: give --locator, or check the router"
                )
            time.sleep(0.05)

    def _read(self) -> list[LearnedPrefix]:
        try:
            self.learned = self.read()
        except OSError:
            self.read_errors += 1
        self._read_useropts(time.monotonic())
        return self.learned

    def _read_useropts(self, now: float) -> None:
        sock = self._useropts
        if sock is None:
            return
        indexes = set()
        for name in self.interfaces:
            with contextlib.suppress(OSError):
                indexes.add(socket.if_nametoindex(name))
        while True:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                return
            except OSError:  # ENOBUFS: some RAs lost; the next ones come
                self.read_errors += 1
                continue
            if not data:
                return
            for server, lifetime in parse_rdnss(data, indexes):
                self._dns.pop(server, None)  # re-learned: to the end of the order
                if lifetime:
                    self._dns[server] = now + (math.inf if lifetime == _INFINITE else lifetime)

    def dns_servers(self, now: float | None = None) -> list[str]:
        """DNS servers of the links' RAs (RDNSS), live at ``now``, first learned first."""
        at = time.monotonic() if now is None else now
        return [server for server, until in self._dns.items() if until > at]

    def entries(self) -> tuple[LocatorEntry, ...]:
        """The set the last read gives."""
        return learned_entries(self.learned, self.interfaces)

    def take(self, now: float) -> tuple[LocatorEntry, ...]:
        """The current set, noted as advertised at ``now``."""
        self.advertised = self.entries()
        self._advertised_at = now
        return self.advertised

    def poll(self, now: float) -> tuple[LocatorEntry, ...] | None:
        """Read again; the set to advertise now, or None (no change, or nothing learned:
        with no prefix left the last set stays, as with every link down)."""
        self._read()
        current = self.entries()
        if not current or not needs_readvertising(
            self.advertised, now - self._advertised_at, current
        ):
            return None
        return self.take(now)

    def json(self) -> dict[str, object]:
        return {"prefixes": [p.json() for p in self.learned], "dns_servers": self.dns_servers()}


def _ip(*argv: str) -> str:
    try:
        done = subprocess.run(
            ["ip", "-6", *argv], capture_output=True, text=True, check=False, timeout=10
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"ip {' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        raise ConfigError(f"ip {' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _token(name: str) -> str:
    """The interface's token now (``::`` when none)."""
    fields = _ip("token", "get", "dev", name).split()
    return fields[1] if len(fields) > 1 and fields[0] == "token" else "::"
