"""What a Session-Reflector does with the TLV area of a sender packet (RFC 8972 §4).

The reflected area has the received size (symmetric packets, RFC 8762 §4.3): every TLV
is copied back in place, then

- U is cleared on each TLV this reflector understands; TLVs it does not know keep U
  (RFC 8972 §4: "the Session-Reflector MUST ... set the U flag" on unrecognised ones,
  which a conforming sender already set);
- a known TLV whose value does not parse gets M; a TLV whose Length runs past the end
  of the packet gets M and everything from it on is copied unread (``mark_malformed``);
- Location (§4.2): the ports and the address sub-TLVs are filled in from the packet as
  it arrived (sub-TLVs whose size does not match the address family are left alone);
- Timestamp Information (§4.3): the reflector's sync source and timestamping method,
  in and out;
- Direct Measurement (§4.5): R_RxC and R_TxC from the session's counters;
- HMAC (§4.8): verified against the session key (I set on failure), recomputed over the
  reply once its Sequence Number is known (``resign_hmac_tlv``);
- Destination Node Address (RFC 9503 §3): understood when it names the address the
  packet arrived on, else U stays set;
- Return Path (RFC 9503 §4): its SRv6 Segment List sub-TLV replaces the configured
  return SID list, its Return Address sub-TLV the reply's destination; a Control Code
  with the Reply Request flag clear asks for no reply (one-way measurement).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from sixlab.wire import WireError
from sixlab.wire import stamp_tlv as t
from sixlab.wire.stamp_auth import hmac16

__all__ = ["TlvContext", "TlvReflection", "reflect_tlvs", "resign_hmac_tlv"]

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
    received: int = 0  # session packets received, this one included (Direct Measurement)
    transmitted: int = 0  # session packets sent before this reply


@dataclass(frozen=True, slots=True)
class TlvReflection:
    area: bytes
    return_segments: tuple[ipaddress.IPv6Address, ...] | None = None
    return_address: IPAddress | None = None
    reply_requested: bool = True


def reflect_tlvs(area: bytes, ctx: TlvContext) -> TlvReflection:
    """The TLV area to send back for ``area`` and what its Return Path asks for."""
    scan = t.scan_tlvs(area)
    out: list[bytes] = []
    segments: tuple[ipaddress.IPv6Address, ...] | None = None
    address: IPAddress | None = None
    reply = True
    offset = 0
    for tlv in scan.tlvs:
        flags, value = tlv.flags, tlv.value
        try:
            parsed = t.parse_value(tlv)
        except WireError:
            parsed = None
            flags |= t.TlvFlag.M
        if parsed is not None:
            flags &= ~t.TlvFlag.U
            if isinstance(parsed, t.Location):
                value = _fill_location(parsed, ctx).to_tlv().value
            elif isinstance(parsed, t.TimestampInfo):
                # In and Out alike; optional sub-TLVs kept, so the size stays symmetric.
                codes = bytes((ctx.sync_source, ctx.timestamp_method) * 2)
                value = codes + parsed.sub_tlvs
            elif isinstance(parsed, t.DirectMeasurement):
                value = (
                    t.DirectMeasurement(
                        parsed.s_txc, ctx.received & 0xFFFF_FFFF, ctx.transmitted & 0xFFFF_FFFF
                    )
                    .to_tlv()
                    .value
                )
            elif isinstance(parsed, t.HmacTlv):
                if ctx.key is None or not t.verify_hmac_tlv(
                    ctx.seq_field, area[: offset + tlv.size], ctx.key
                ):
                    flags |= t.TlvFlag.I
            elif isinstance(parsed, t.DestinationNodeAddress):
                if ctx.dst is not None and parsed.address != ctx.dst:
                    flags |= t.TlvFlag.U
            elif isinstance(parsed, t.ReturnPath):
                if parsed.segment_list is not None:
                    segments = parsed.segment_list.segments
                if parsed.return_address is not None:
                    address = parsed.return_address.address
                if parsed.control_code is not None and not parsed.control_code.reply_request:
                    reply = False
        out.append(t.Tlv(tlv.type, flags & 0xFF, value).encode())
        offset += tlv.size
    if scan.malformed_at is not None:
        out.append(t.mark_malformed(area[scan.malformed_at :]))
    return TlvReflection(b"".join(out), segments, address, reply)


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
