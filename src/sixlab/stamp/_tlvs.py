"""What a Session-Reflector does with the TLV area of a sender packet (RFC 8972 §4).

The reflected area has the received size (symmetric packets, RFC 8762 §4.3): every TLV
is copied back in place, then

- U is cleared on each TLV this reflector acts on; TLVs it does not know, or knows but
  cannot act on here, keep U (RFC 8972 §4: the reflector sets U on the ones it does
  not recognise, which a conforming sender already set);
- a known TLV whose value does not parse gets M; a TLV whose Length runs past the end
  of the packet gets M and everything from it on is copied unread (``mark_malformed``);
- Location (§4.2): the ports and the address sub-TLVs are filled in from the packet as
  it arrived (sub-TLVs whose size does not match the address family are left alone);
- Timestamp Information (§4.3): the reflector's sync source and timestamping method,
  in and out;
- Class of Service (§4.4): DSCP2 and ECN are the received DSCP and ECN, and the reply
  carries DSCP1 (``TlvReflection.tclass``), or RP = 1 when the data plane cannot set
  it; without the received Traffic Class (a plane that cannot read it) U stays set;
- Direct Measurement (§4.5): R_RxC and R_TxC, the flow's counts of test packets
  received and replies sent, each including the packet that carries it;
- Follow-Up Telemetry (§4.7): the Seq and actual transmit time (with its timestamping
  method) of the flow's previous reply, when the data plane reported one; else U stays;
- HMAC (§4.8): in an authenticated session it is verified first, over the whole area:
  missing (with TLVs other than Extra Padding), misplaced (followed by anything but
  Extra Padding), repeated or wrong, every TLV is returned untouched with I set and
  nothing any TLV asks is done. Recomputed over the reply once its Sequence Number is
  known (``resign_hmac_tlv``). In an unauthenticated session it cannot be verified: I;
- Access Report (§4.6) and Micro-session ID (RFC 9534): parsed, not acted on: U stays;
- Destination Node Address (RFC 9503 §3): understood when it names the address the
  packet arrived on, else U stays set;
- Return Path (RFC 9503 §4): its SRv6 Segment List sub-TLV replaces the configured
  return SID list, its Return Address sub-TLV the reply's destination; a Control Code
  with the Reply Request flag clear asks for no reply (one-way measurement).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sixlab.wire import WireError
from sixlab.wire import stamp_tlv as t
from sixlab.wire.stamp_auth import hmac16

__all__ = ["TLV_HANDLERS", "TlvContext", "TlvReflection", "reflect_tlvs", "resign_hmac_tlv"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_L = t.LocationSubType
#: Location sub-TLV type -> (which address, generic type, IPv4 type, IPv6 type). The Sender
#: asks with the generic type or a specific one; the Reflector answers with the specific
#: type of the address family it fills in (RFC 8972 §4.2).
_ADDRESS_SUBS = {
    **dict.fromkeys((_L.DST_IP, _L.DST_IPV4, _L.DST_IPV6), ("dst", _L.DST_IPV4, _L.DST_IPV6)),
    **dict.fromkeys((_L.SRC_IP, _L.SRC_IPV4, _L.SRC_IPV6), ("src", _L.SRC_IPV4, _L.SRC_IPV6)),
}


@dataclass(frozen=True, slots=True)
class TlvContext:
    """What the reflector knows of the packet and the session when it handles TLVs."""

    src: IPAddress | None = None
    dst: IPAddress | None = None
    src_port: int = 0
    dst_port: int = 0
    sync_source: int = t.SyncSource.NTP
    timestamp_method: int = t.TimestampMethod.SW_LOCAL
    key: bytes | None = None
    seq_field: bytes = b"\0\0\0\0"  # the received base packet's Sequence Number field
    received: int = 0  # flow packets received, this one included (Direct Measurement)
    transmitted: int = 0  # flow replies sent, this one included
    tclass: int | None = None  # received Traffic Class / TOS byte; None: unknown
    set_tclass: bool = False  # the data plane applies TlvReflection.tclass to the reply
    #: (Seq, transmit timestamp in the session's wire format, timestamping method) of
    #: the flow's previous reply, when known (Follow-Up Telemetry).
    follow_up: tuple[int, int, int] | None = None


@dataclass(frozen=True, slots=True)
class TlvReflection:
    area: bytes
    return_segments: tuple[ipaddress.IPv6Address, ...] | None = None
    return_address: IPAddress | None = None
    reply_requested: bool = True
    #: Traffic Class / TOS byte for the reply (Class of Service DSCP1), None: default.
    tclass: int | None = None
    #: Authenticated session, HMAC TLV failed: nothing above was acted on.
    integrity_failed: bool = False


@dataclass(slots=True)
class _Answer:
    """One ``reflect_tlvs`` call as its handlers see it: the TLV being answered (its
    ``flags`` and ``value`` as they will go back) and what the area asks of the reply."""

    ctx: TlvContext
    flags: int = 0
    value: bytes = b""
    segments: tuple[ipaddress.IPv6Address, ...] | None = None
    address: IPAddress | None = None
    reply: bool = True
    tclass: int | None = None
    cos_done: bool = False


_V = TypeVar("_V", bound=t.TlvValue)
_Handler = Callable[[_V, _Answer], None]

#: What this reflector does with each TLV type it decodes, by codec class. Every codec of
#: ``sixlab.wire.stamp_tlv.TLV_CODECS`` has one (tests/unit/test_stamp_tlv_registry.py);
#: it runs with U already cleared on ``answer.flags``.
TLV_HANDLERS: dict[type[t.TlvValue], _Handler[Any]] = {}


def _reflects(*codecs: type[_V]) -> Callable[[_Handler[_V]], _Handler[_V]]:
    """Enter the decorated function as the handler of the TLVs of ``codecs``."""

    def enter(handler: _Handler[_V]) -> _Handler[_V]:
        for codec in codecs:
            if codec in TLV_HANDLERS:
                raise ValueError(f"{codec.__name__} has a reflector handler already")
            TLV_HANDLERS[codec] = handler
        return handler

    return enter


def reflect_tlvs(area: bytes, ctx: TlvContext) -> TlvReflection:
    """The TLV area to send back for ``area`` and what its TLVs ask for."""
    scan = t.scan_tlvs(area)
    if ctx.key is not None and not _integrity_ok(area, scan, ctx.seq_field, ctx.key):
        return TlvReflection(_mark_all(area, scan, t.TlvFlag.I), integrity_failed=True)
    out: list[bytes] = []
    answer = _Answer(ctx)
    for tlv in scan.tlvs:
        answer.flags, answer.value = tlv.flags, tlv.value
        try:
            parsed = t.parse_value(tlv)
        except WireError:
            parsed = None
            answer.flags |= t.TlvFlag.M
        handler = None if parsed is None else TLV_HANDLERS.get(type(parsed))
        if handler is not None:
            answer.flags &= ~t.TlvFlag.U
            handler(parsed, answer)
        out.append(t.Tlv(tlv.type, answer.flags & 0xFF, answer.value).encode())
    if scan.malformed_at is not None:
        out.append(t.mark_malformed(area[scan.malformed_at :]))
    return TlvReflection(
        b"".join(out), answer.segments, answer.address, answer.reply, answer.tclass
    )


@_reflects(t.ExtraPadding)
def _extra_padding(_parsed: t.ExtraPadding, answer: _Answer) -> None:
    """Understood; returned as received (RFC 8972 §4.1)."""


@_reflects(t.Location)
def _location(parsed: t.Location, answer: _Answer) -> None:
    answer.value = _fill_location(parsed, answer.ctx).to_tlv().value


@_reflects(t.TimestampInfo)
def _timestamp_info(parsed: t.TimestampInfo, answer: _Answer) -> None:
    # In and Out alike; optional sub-TLVs kept, so the size stays symmetric.
    codes = bytes((answer.ctx.sync_source, answer.ctx.timestamp_method) * 2)
    answer.value = codes + parsed.sub_tlvs


@_reflects(t.ClassOfService)
def _class_of_service(parsed: t.ClassOfService, answer: _Answer) -> None:
    ctx = answer.ctx
    if ctx.tclass is None or answer.cos_done:
        answer.flags |= t.TlvFlag.U  # received DSCP unknown (or a second CoS TLV)
        return
    answer.cos_done = True
    if ctx.set_tclass:
        answer.tclass = parsed.dscp1 << 2
    cos = t.ClassOfService(
        dscp1=parsed.dscp1,
        ecn1=parsed.ecn1,
        dscp2=ctx.tclass >> 2 & 0x3F,
        ecn2=ctx.tclass & 0x3,
        rp=0 if ctx.set_tclass else 1,
    )
    answer.value = cos.to_tlv().value


@_reflects(t.DirectMeasurement)
def _direct_measurement(parsed: t.DirectMeasurement, answer: _Answer) -> None:
    ctx = answer.ctx
    counts = t.DirectMeasurement(
        parsed.s_txc, ctx.received & 0xFFFF_FFFF, ctx.transmitted & 0xFFFF_FFFF
    )
    answer.value = counts.to_tlv().value


@_reflects(t.FollowUpTelemetry)
def _follow_up_telemetry(_parsed: t.FollowUpTelemetry, answer: _Answer) -> None:
    if answer.ctx.follow_up is None:
        answer.flags |= t.TlvFlag.U  # no transmit time of a previous reply known
    else:
        answer.value = t.FollowUpTelemetry(*answer.ctx.follow_up).to_tlv().value


@_reflects(t.AccessReport, t.MicroSessionId)
def _not_acted_on(_parsed: t.TlvValue, answer: _Answer) -> None:
    """Parsed, but nothing here acts on them (no access steering, RFC 8972 §4.6; no LAG
    micro-sessions, RFC 9534): not reported as understood."""
    answer.flags |= t.TlvFlag.U


@_reflects(t.HmacTlv)
def _hmac(_parsed: t.HmacTlv, answer: _Answer) -> None:
    """Verified before any TLV is handled when the session has a key (``_integrity_ok``)."""
    if answer.ctx.key is None:
        answer.flags |= t.TlvFlag.I  # no key to verify it with


@_reflects(t.DestinationNodeAddress)
def _destination_node_address(parsed: t.DestinationNodeAddress, answer: _Answer) -> None:
    if answer.ctx.dst is not None and parsed.address != answer.ctx.dst:
        answer.flags |= t.TlvFlag.U


@_reflects(t.ReturnPath)
def _return_path(parsed: t.ReturnPath, answer: _Answer) -> None:
    if parsed.segment_list is not None:
        answer.segments = parsed.segment_list.segments
    if parsed.return_address is not None:
        answer.address = parsed.return_address.address
    if parsed.control_code is not None and not parsed.control_code.reply_request:
        answer.reply = False


def _integrity_ok(area: bytes, scan: t.TlvScan, seq_field: bytes, key: bytes) -> bool:
    """RFC 8972 §4.8 in an authenticated session: the HMAC TLV must be there (unless
    every TLV is Extra Padding), once, after every TLV but Extra Padding, and verify
    over the Sequence Number and the TLVs before it. A malformed area fails."""
    if scan.well_formed and all(x.type == t.TlvType.EXTRA_PADDING for x in scan.tlvs):
        return True
    return t.verify_hmac_tlv(seq_field, area, key)


def _mark_all(area: bytes, scan: t.TlvScan, flag: int) -> bytes:
    """``area`` unchanged but for ``flag`` set on every well-formed TLV, M on a
    malformed tail."""
    out = bytearray(area)
    offset = 0
    for tlv in scan.tlvs:
        out[offset] |= flag
        offset += tlv.size
    if scan.malformed_at is not None:
        out[scan.malformed_at] |= t.TlvFlag.M
    return bytes(out)


def _fill_location(loc: t.Location, ctx: TlvContext) -> t.Location:
    subs = []
    for received in loc.sub_tlvs:
        sub = received
        spec = _ADDRESS_SUBS.get(_L(sub.type)) if sub.type in _ADDRESS_SUBS else None
        addr = None if spec is None else ctx.src if spec[0] == "src" else ctx.dst
        if spec is not None and addr is not None:
            specific = spec[2] if addr.version == 6 else spec[1]
            packed = addr.packed
            generic = sub.type in (_L.DST_IP, _L.SRC_IP)
            if (generic or sub.type == specific) and len(sub.value) >= len(packed):
                value = packed + sub.value[len(packed) :]
                sub = t.LocationSubTlv(specific, value, sub.flags & ~t.TlvFlag.U & 0xFF)
        subs.append(sub)
    return t.Location(ctx.dst_port, ctx.src_port, tuple(subs))


def resign_hmac_tlv(seq_field: bytes, area: bytes, key: bytes) -> bytes:
    """Recompute the HMAC TLV of a reflected area over the reply's Seq (RFC 8972 §4.8).

    An area without a well-formed HMAC TLV is returned unchanged.
    """
    scan = t.scan_tlvs(area)
    offset = 0
    for tlv in scan.tlvs:
        if tlv.type == t.TlvType.HMAC and len(tlv.value) == t.HMAC_TLV_VALUE_SIZE:
            mac = hmac16(key, t.hmac_tlv_input(seq_field, area[:offset]))
            start = offset + t.TLV_HEADER_SIZE
            return area[:start] + mac + area[start + t.HMAC_TLV_VALUE_SIZE :]
        offset += tlv.size
    return area
