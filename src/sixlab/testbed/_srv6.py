"""The SRv6 two-path testbed of the STAMP experiments.

::

                         link A (emulated)
    sender ── R1 ═══════════════════════════ R2 ── reflector
                 ═══════════════════════════  │
                         link B (emulated)    └──(link F, emulated)── far   (optional)

Addresses (ULA, only inside the namespaces)::

    sender  eth0   fd00:0:1::1/64     R1 to_snd fd00:0:1::2/64
    R1      to_r2a fd00:0:a::1/64     R2 to_r1a fd00:0:a::2/64      (link A)
    R1      to_r2b fd00:0:b::1/64     R2 to_r1b fd00:0:b::2/64      (link B)
    R2      to_rfl fd00:0:2::1/64     reflector eth0 fd00:0:2::2/64

    R2      to_far fd00:0:3::1/64     far eth0 fd00:0:3::2/64         (link F, optional)

SIDs (seg6local)::

    R1  fc00:0:1::1 End   fc00:0:1::a End.X -> link A   fc00:0:1::b End.X -> link B
    R2  fc00:0:2::1 End   fc00:0:2::a End.X -> link A   fc00:0:2::b End.X -> link B
    sender    fc00:0:11::d6 End.DT6 (table local: decapsulated packets are delivered)
    reflector fc00:0:12::d6 End.DT6 (table local)
    far       fc00:0:13::e End      (optional)

Path X (X in A, B) pins link X in both directions with one End.X SID each way:

- forward  ``[R1 End.X X, reflector]``: R1 sends the packet over link X with the
  destination set to the reflector, and R2 forwards it normally.
- return   ``[R2 End.X X, sender]``: the mirror image.

The last segment is the end host itself, so the host receives the datagram with the SRH
still present (Segments Left 0) on an ordinary UDP socket: what an SRv6 STAMP
Session-Reflector expects (the SRH tells it the return path). Plain IPv6 between the
hosts (no SRH) follows link A.

Delays are per link and direction: ``forward`` is R1 → R2 (the sender-to-reflector
direction), ``return`` R2 → R1. Defaults: path A 5 ms / 12 ms, path B 20 ms / 3 ms.

Loopback paths (draft-ietf-spring-stamp-srpm's loopback mode, docs/srpm.md): SID lists
that lead a probe out and back to the sender itself, turned around by End or End.X
alone. ``loopback_paths["A"]``/``["B"]`` turn at R2 (``[R1 End.X X, R2 End.X X,
sender]``). With ``far_ms`` a third host, *far*, hangs off R2 behind its own emulated
link F; it is a router (End forwards, so it needs ``forwarding=1``) and runs no STAMP
agent: ``loopback_paths["F"]`` is ``[R1 End.X B, far End, R2 End.X A, sender]``, out
over link B, around far, back over link A.

ECMP (``ecmp=True``): R1 reaches everything behind R2 (the reflector's and far's
prefixes and SIDs, R2's SIDs) over links A and B as one equal-cost multipath route,
hashed on source, destination and flow label (``fib_multipath_hash_policy=0``, RFC 6437
§3's use of the label). The End.X SIDs still pin a link; plain routing and End SIDs
behind R2 spread by flow label. R2 returns over link A only, so a round trip differs
by the forward link alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from sixlab.testbed import _netns
from sixlab.testbed._closing import ClosingContext
from sixlab.testbed._emulation import DirectionConfig
from sixlab.testbed._topology import EmulatedLink, LinkEmulation, Node, Testbed

__all__ = ["LoopbackPath", "SRv6Path", "SRv6TwoPaths", "srv6_two_paths"]


@dataclass(frozen=True, slots=True)
class SRv6Path:
    """One SRv6 path between the hosts: segment lists in travel order, configured delays."""

    name: str
    forward_segments: tuple[str, ...]
    return_segments: tuple[str, ...]
    forward_delay_ms: float
    return_delay_ms: float

    @property
    def round_trip_delay_ms(self) -> float:
        """Configured round-trip delay of the path (emulated links only)."""
        return self.forward_delay_ms + self.return_delay_ms


@dataclass(frozen=True, slots=True)
class LoopbackPath:
    """A SID list from the sender back to the sender (travel order, last = the sender)
    and the emulated delays its legs cross, in order."""

    name: str
    segments: tuple[str, ...]
    leg_delays_ms: tuple[float, ...]

    @property
    def round_trip_delay_ms(self) -> float:
        """Configured delay of the whole loop (emulated links only)."""
        return sum(self.leg_delays_ms)


class SRv6TwoPaths(ClosingContext):
    """Handle of :func:`srv6_two_paths`: nodes, addresses, SIDs, paths, link emulators."""

    SENDER_ADDR = "fd00:0:1::1"
    REFLECTOR_ADDR = "fd00:0:2::2"

    FAR_ADDR = "fd00:0:3::2"

    def __init__(
        self,
        testbed: Testbed,
        link_a: LinkEmulation,
        link_b: LinkEmulation,
        link_far: LinkEmulation | None = None,
        *,
        ecmp: bool = False,
    ) -> None:
        self.testbed = testbed
        tb = testbed
        self.sender: Node = tb.add_node("snd")
        self.r1: Node = tb.add_node("r1", router=True)
        self.r2: Node = tb.add_node("r2", router=True)
        self.reflector: Node = tb.add_node("rfl")
        self.sender_addr = self.SENDER_ADDR
        self.reflector_addr = self.REFLECTOR_ADDR
        self.sids: dict[str, str] = {
            "r1.end": "fc00:0:1::1",
            "r1.endx_a": "fc00:0:1::a",
            "r1.endx_b": "fc00:0:1::b",
            "r2.end": "fc00:0:2::1",
            "r2.endx_a": "fc00:0:2::a",
            "r2.endx_b": "fc00:0:2::b",
            "sender.dt6": "fc00:0:11::d6",
            "reflector.dt6": "fc00:0:12::d6",
            "far.end": "fc00:0:13::e",
        }
        #: The host behind link F (None without ``far_ms``); it runs no STAMP agent.
        self.far: Node | None = None
        self.far_addr: str | None = None
        s, r1, r2, rf = self.sender, self.r1, self.r2, self.reflector
        tb.add_link(s, r1, if_a="eth0", if_b="to_snd", addr_a="fd00:0:1::1", addr_b="fd00:0:1::2")
        la = tb.add_link(
            r1, r2, if_a="to_r2a", if_b="to_r1a", addr_a="fd00:0:a::1", addr_b="fd00:0:a::2",
            emulation=link_a,
        )  # fmt: skip
        lb = tb.add_link(
            r1, r2, if_a="to_r2b", if_b="to_r1b", addr_a="fd00:0:b::1", addr_b="fd00:0:b::2",
            emulation=link_b,
        )  # fmt: skip
        tb.add_link(r2, rf, if_a="to_rfl", if_b="eth0", addr_a="fd00:0:2::1", addr_b="fd00:0:2::2")
        assert la.emulator is not None
        assert lb.emulator is not None
        self.links: dict[str, EmulatedLink] = {"A": la.emulator, "B": lb.emulator}

        behind_r2 = ["fd00:0:2::/64", "fc00:0:2::/48", "fc00:0:12::/48"]
        if link_far is not None:
            behind_r2 += self._add_far(link_far)
        self._add_routes(behind_r2, ecmp=ecmp)
        self._add_sids()
        self._name_paths(link_a, link_b, link_far)

    def _add_far(self, link_far: LinkEmulation) -> list[str]:
        """The host *far* behind R2 over link F; the prefixes it adds behind R2."""
        tb, r2 = self.testbed, self.r2
        self.far = far = tb.add_node("far", router=True)
        self.far_addr = self.FAR_ADDR
        lf = tb.add_link(
            r2, far, if_a="to_far", if_b="eth0", addr_a="fd00:0:3::1", addr_b=self.FAR_ADDR,
            emulation=link_far,
        )  # fmt: skip
        assert lf.emulator is not None
        self.links["F"] = lf.emulator
        far.add_route("default", via="fd00:0:3::1")
        r2.add_route("fc00:0:13::/48", via=self.FAR_ADDR)
        far.add_seg6local(self.sids["far.end"], "End", dev="eth0")
        return ["fd00:0:3::/64", "fc00:0:13::/48"]

    def _add_routes(self, behind_r2: list[str], *, ecmp: bool) -> None:
        """Plain routes: hosts default to their router; routers reach the far side over A
        (over A and B with ``ecmp``)."""
        s, r1, r2, rf = self.sender, self.r1, self.r2, self.reflector
        s.add_route("default", via="fd00:0:1::2")
        rf.add_route("default", via="fd00:0:2::1")
        if ecmp:
            r1.sysctl({"net.ipv6.fib_multipath_hash_policy": 0})
        for dst in behind_r2:
            if ecmp:
                r1.add_multipath_route(dst, [("fd00:0:a::2", "to_r2a"), ("fd00:0:b::2", "to_r2b")])
            else:
                r1.add_route(dst, via="fd00:0:a::2")
        r1.add_route("fc00:0:11::/48", via="fd00:0:1::1")
        for dst in ("fd00:0:1::/64", "fc00:0:1::/48", "fc00:0:11::/48"):
            r2.add_route(dst, via="fd00:0:a::1")
        r2.add_route("fc00:0:12::/48", via="fd00:0:2::2")

    def _add_sids(self) -> None:
        s, r1, r2, rf = self.sender, self.r1, self.r2, self.reflector
        r1.add_seg6local(self.sids["r1.end"], "End", dev="to_snd")
        r1.add_seg6local(self.sids["r1.endx_a"], "End.X", nh6="fd00:0:a::2", dev="to_r2a")
        r1.add_seg6local(self.sids["r1.endx_b"], "End.X", nh6="fd00:0:b::2", dev="to_r2b")
        r2.add_seg6local(self.sids["r2.end"], "End", dev="to_rfl")
        r2.add_seg6local(self.sids["r2.endx_a"], "End.X", nh6="fd00:0:a::1", dev="to_r1a")
        r2.add_seg6local(self.sids["r2.endx_b"], "End.X", nh6="fd00:0:b::1", dev="to_r1b")
        s.add_seg6local(self.sids["sender.dt6"], "End.DT6", dev="eth0", table=255)
        rf.add_seg6local(self.sids["reflector.dt6"], "End.DT6", dev="eth0", table=255)

    def _name_paths(
        self, link_a: LinkEmulation, link_b: LinkEmulation, link_far: LinkEmulation | None
    ) -> None:
        """The paths over A and B, the loops over A, B and (with *far*) F."""
        self.paths: dict[str, SRv6Path] = {}
        for name, emu in (("A", link_a), ("B", link_b)):
            x = name.lower()
            self.paths[name] = SRv6Path(
                name=name,
                forward_segments=(self.sids[f"r1.endx_{x}"], self.reflector_addr),
                return_segments=(self.sids[f"r2.endx_{x}"], self.sender_addr),
                forward_delay_ms=emu.ab.delay_ms,
                return_delay_ms=emu.ba.delay_ms,
            )
        self.loopback_paths: dict[str, LoopbackPath] = {}
        for name, emu in (("A", link_a), ("B", link_b)):
            x = name.lower()
            self.loopback_paths[name] = LoopbackPath(
                name=name,
                segments=(self.sids[f"r1.endx_{x}"], self.sids[f"r2.endx_{x}"], self.sender_addr),
                leg_delays_ms=(emu.ab.delay_ms, emu.ba.delay_ms),
            )
        if link_far is not None:
            self.loopback_paths["F"] = LoopbackPath(
                name="F",
                segments=(
                    self.sids["r1.endx_b"],
                    self.sids["far.end"],
                    self.sids["r2.endx_a"],
                    self.sender_addr,
                ),
                leg_delays_ms=(
                    link_b.ab.delay_ms,
                    link_far.ab.delay_ms,
                    link_far.ba.delay_ms,
                    link_a.ba.delay_ms,
                ),
            )

    def close(self) -> None:
        """Tear the whole testbed down."""
        self.testbed.close()


def srv6_two_paths(
    *,
    path_a_ms: tuple[float, float] = (5.0, 12.0),
    path_b_ms: tuple[float, float] = (20.0, 3.0),
    jitter_ms: float = 0.0,
    loss: float = 0.0,
    seed: int = 0,
    link_a: LinkEmulation | None = None,
    link_b: LinkEmulation | None = None,
    far_ms: tuple[float, float] | None = None,
    link_far: LinkEmulation | None = None,
    ecmp: bool = False,
    prefix: str = _netns.DEFAULT_PREFIX,
) -> SRv6TwoPaths:
    """Build the two-path SRv6 testbed; use it as a context manager.

    ``path_X_ms`` is (forward, return) delay in ms of link X; ``jitter_ms`` and ``loss``
    apply to every direction of both links. ``link_a``/``link_b`` replace all of that
    for one link (``ab`` is the forward direction R1 → R2). ``far_ms`` (R2 → far,
    far → R2) or ``link_far`` adds the agent-less host *far*; ``ecmp`` makes links A and
    B one equal-cost multipath from R1 (module docstring).
    """
    if link_a is None:
        link_a = LinkEmulation(
            ab=DirectionConfig(path_a_ms[0], jitter_ms, loss),
            ba=DirectionConfig(path_a_ms[1], jitter_ms, loss),
            seed=seed,
        )
    if link_b is None:
        link_b = LinkEmulation(
            ab=DirectionConfig(path_b_ms[0], jitter_ms, loss),
            ba=DirectionConfig(path_b_ms[1], jitter_ms, loss),
            seed=seed + 1,
        )
    if link_far is None and far_ms is not None:
        link_far = LinkEmulation(
            ab=DirectionConfig(far_ms[0], jitter_ms, loss),
            ba=DirectionConfig(far_ms[1], jitter_ms, loss),
            seed=seed + 2,
        )
    testbed = Testbed(prefix)
    try:
        return SRv6TwoPaths(testbed, link_a, link_b, link_far, ecmp=ecmp)
    except BaseException:
        testbed.close()
        raise
