"""ILNPv6 name resolution: an I-LV hosts file and DNS NID/L64 records (RFC 6742).

Theory of operation
-------------------
An ILNP node that starts talking to a correspondent needs its NID and its locator set
with preferences (RFC 6740 §6, RFC 6742 §2). Two sources:

* an **I-LV hosts file**, the ILNP cousin of ``/etc/hosts``. One line per node::

      # I-LV[,PREF[,LIFETIME]] ...                       name [alias ...]
      2001:db8:a:0/0:0:0:a,10  2001:db8:c:0/0:0:0:a,20   alice a.example

  Each I-LV is ``L64/NID`` (:class:`sixlab.wire.ilnp.ILV` notation); every I-LV on a
  line must carry the same NID, and their locators form the node's set. Preference
  defaults to 0 and lifetime to 0xFFFF seconds. Lines naming the same node merge.
* **DNS**: the NID (type 104) and L64 (type 106) records of a name (RFC 6742 §2.1,
  §2.3), fetched with dnspython. A name has one NID (several NID records for one node
  are allowed by RFC 6742 §3, we take the most preferred, i.e. lowest preference) and
  any number of L64 records; an L64 record's preference becomes the locator
  preference and its TTL the locator lifetime (RFC 6742 §3: lower is preferred).

The host daemon asks :meth:`Resolver.by_nid` when an application sends to an
identifier address it has no ILCC entry for; the hosts file is the only source that
can answer a NID lookup (DNS has no NID-to-locators map).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import dns.exception
import dns.rdatatype
import dns.resolver

from sixlab.ilnp._errors import ConfigError, ResolveError
from sixlab.ilnp.config import parse_l64
from sixlab.wire import WireError
from sixlab.wire.ilnp import ILV, LocatorEntry

__all__ = [
    "HostsFile",
    "Resolution",
    "ResolveError",
    "Resolver",
    "parse_hosts",
    "parse_locator_spec",
    "resolve_dns",
]

#: RFC 6742 §2 record types (IANA): NID and L64.
RRTYPE_NID = 104
RRTYPE_L64 = 106
#: Lifetime of a hosts-file locator without one: the largest the Locator Update field
#: can carry (RFC 6743 §2, 16 bits), i.e. "does not expire" in practice.
DEFAULT_LIFETIME = 0xFFFF


@dataclass(frozen=True, slots=True)
class Resolution:
    """A node's NID and locator set, as a resolver found them."""

    name: str
    nid: int
    locators: tuple[LocatorEntry, ...]


def parse_locator_spec(text: str) -> LocatorEntry:
    """``L64[,PREF[,LIFETIME]]``; L64 as :func:`sixlab.ilnp.config.parse_l64` takes it
    (``2001:db8:a::/64``, ``2001:db8:a::`` or ``2001:db8:a:0``)."""
    parts = text.split(",")
    if not 1 <= len(parts) <= 3:
        raise ResolveError(f"locator {text!r} is not L64[,PREF[,LIFETIME]]")
    try:
        locator = parse_l64(parts[0])
        pref = int(parts[1]) if len(parts) > 1 else 0
        life = int(parts[2]) if len(parts) > 2 else DEFAULT_LIFETIME
        return LocatorEntry(locator, pref, life)
    except (ConfigError, WireError, ValueError) as exc:
        raise ResolveError(f"bad locator {text!r}: {exc}") from exc


def _parse_ilv_spec(text: str) -> tuple[int, LocatorEntry]:
    head, _, rest = text.partition(",")
    try:
        ilv = ILV.parse(head)
    except WireError as exc:
        raise ResolveError(f"bad I-LV {head!r}: {exc}") from exc
    quad = ":".join(f"{(ilv.locator >> s) & 0xFFFF:x}" for s in (48, 32, 16, 0))
    entry = parse_locator_spec(quad + ("," + rest if rest else ""))
    return ilv.nid, entry


class HostsFile:
    """Names and NIDs to locator sets, from I-LV hosts file text."""

    def __init__(self, entries: Iterable[Resolution] = ()) -> None:
        self._by_name: dict[str, Resolution] = {}
        self._by_nid: dict[int, Resolution] = {}
        for entry in entries:
            self.add(entry)

    def add(self, entry: Resolution) -> None:
        """Add a node, merging with an earlier line of the same name and NID."""
        old = self._by_name.get(entry.name)
        if old is not None:
            if old.nid != entry.nid:
                raise ResolveError(f"{entry.name!r} names NIDs {old.nid:#x} and {entry.nid:#x}")
            entry = Resolution(entry.name, entry.nid, old.locators + entry.locators)
        self._by_name[entry.name] = entry
        known = self._by_nid.get(entry.nid)
        if known is None or known.name == entry.name:
            self._by_nid[entry.nid] = entry

    def by_name(self, name: str) -> Resolution | None:
        return self._by_name.get(name)

    def by_nid(self, nid: int) -> Resolution | None:
        return self._by_nid.get(nid)

    def entries(self) -> list[Resolution]:
        """Every name, in the order first seen."""
        return list(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_nid)


def parse_hosts(text: str) -> HostsFile:
    """Parse I-LV hosts file text (see the module docstring for the format)."""
    hosts = HostsFile()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        specs = [f for f in fields if "/" in f]
        names = [f for f in fields if "/" not in f]
        if not specs or not names or fields[: len(specs)] != specs:
            raise ResolveError(f"line {number}: want I-LV ... name [alias ...]: {raw!r}")
        parsed = [_parse_ilv_spec(s) for s in specs]
        nids = {nid for nid, _ in parsed}
        if len(nids) != 1:
            raise ResolveError(f"line {number}: I-LVs of one line must share their NID")
        nid = nids.pop()
        locators = tuple(entry for _, entry in parsed)
        for name in names:
            hosts.add(Resolution(name, nid, locators))
    return hosts


def resolve_dns(
    name: str, resolver: dns.resolver.Resolver | None = None, source_port: int = 0
) -> Resolution:
    """Look up the NID and L64 records of ``name`` (RFC 6742), from ``source_port``
    (0: any)."""
    res = resolver if resolver is not None else dns.resolver.Resolver()
    try:
        nid_answer = res.resolve(name, dns.rdatatype.NID, source_port=source_port)
        l64_answer = res.resolve(name, dns.rdatatype.L64, source_port=source_port)
    except dns.exception.DNSException as exc:
        raise ResolveError(f"{name}: {exc}") from exc
    nids = sorted((r.preference, ILV.parse(f"0:0:0:0/{r.nodeid}").nid) for r in nid_answer)
    ttl = min(int(l64_answer.rrset.ttl), DEFAULT_LIFETIME) if l64_answer.rrset else 0
    locators = tuple(
        LocatorEntry(ILV.parse(f"{r.locator64}/0:0:0:0").locator, r.preference, ttl)
        for r in l64_answer
    )
    if not nids or not locators:
        raise ResolveError(f"{name}: no NID or no L64 records")
    return Resolution(name, nids[0][1], locators)


class Resolver:
    """The hosts file first, then DNS (names only)."""

    def __init__(
        self, hosts: HostsFile | None = None, dns_resolver: dns.resolver.Resolver | None = None
    ) -> None:
        self.hosts = hosts if hosts is not None else HostsFile()
        self.dns_resolver = dns_resolver
        #: UDP source port of DNS queries (0: any); the host daemon fixes one.
        self.source_port = 0
        #: DNS servers the links' Router Advertisements gave (RDNSS, RFC 8106): when
        #: there are any, they are asked instead of /etc/resolv.conf's.
        self.learned_servers: Callable[[], list[str]] = list

    @classmethod
    def from_file(cls, path: str | Path | None) -> Resolver:
        """The resolver of the hosts file at ``path``; :class:`ResolveError` names the
        file when it cannot be read or parsed."""
        if path is None:
            return cls()
        try:
            return cls(parse_hosts(Path(path).read_text(encoding="utf-8")))
        except OSError as exc:
            raise ResolveError(f"hosts file {path}: {exc.strerror or exc}") from None
        except (UnicodeDecodeError, ResolveError) as exc:
            raise ResolveError(f"hosts file {path}: {exc}") from None

    def by_nid(self, nid: int) -> Resolution | None:
        return self.hosts.by_nid(nid)

    def by_name(self, name: str, *, use_dns: bool = True) -> Resolution:
        found = self.hosts.by_name(name)
        if found is not None:
            return found
        if not use_dns:
            raise ResolveError(f"{name}: not in the hosts file")
        return resolve_dns(name, self._dns(), self.source_port)

    def _dns(self) -> dns.resolver.Resolver | None:
        if self.dns_resolver is not None:
            return self.dns_resolver
        servers = self.learned_servers()
        if not servers:
            return None  # the system's configuration
        learned = dns.resolver.Resolver(configure=False)
        learned.nameservers = list(servers)
        return learned
