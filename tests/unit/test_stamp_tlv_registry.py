"""One place per STAMP TLV type: its codec in ``TLV_CODECS`` and its reflector handler.

Adding a TLV type is a ``TlvType`` member, a codec class marked ``@tlv_codec`` and a
handler marked ``@_reflects(Codec)`` in ``sixlab.stamp._tlvs``; these tests fail while any
of the three is missing for a type that has the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

import pytest

from sixlab.stamp._tlvs import TLV_HANDLERS, TlvContext, reflect_tlvs
from sixlab.wire import InvalidFieldError
from sixlab.wire import stamp_tlv as t


def _codecs() -> list[type[t.TlvValue]]:
    return [t.TLV_CODECS.get(name) for name in t.TLV_CODECS.names()]


def test_every_tlv_type_has_one_codec_named_after_it() -> None:
    by_type = {codec.TYPE: codec for codec in _codecs()}
    assert sorted(by_type) == sorted(t.TlvType)
    assert len(by_type) == len(t.TLV_CODECS)
    for tlv_type, codec in by_type.items():
        assert t.TLV_CODECS.get(tlv_type.name.lower().replace("_", "-")) is codec
        assert codec.__name__ in t.__all__


def test_every_codec_has_a_reflector_handler() -> None:
    codecs = set(_codecs())
    missing = sorted(c.__name__ for c in codecs - TLV_HANDLERS.keys())
    assert not missing, f"TLV codecs without a handler in sixlab.stamp._tlvs: {missing}"
    assert set(TLV_HANDLERS) == codecs  # and no handler for a codec that is not entered


def test_parse_value_hands_every_entered_type_to_its_codec() -> None:
    for codec in _codecs():
        try:
            value = t.parse_value(t.Tlv(codec.TYPE, 0, b""))
        except InvalidFieldError:  # the codec's own verdict on an empty value
            continue
        assert isinstance(value, codec)
    assert t.parse_value(t.Tlv(0, 0, b"")) is None  # type 0 is reserved: no codec


def test_a_second_codec_for_a_type_is_refused() -> None:
    @dataclass(frozen=True, slots=True)
    class OtherLocation:
        TYPE: ClassVar[t.TlvType] = t.TlvType.LOCATION

        def to_tlv(self, flags: int = t.TlvFlag.U) -> t.Tlv:
            return t.Tlv(self.TYPE, flags, b"")

        @classmethod
        def from_tlv(cls, tlv: t.Tlv) -> Self:
            del tlv
            return cls()

    with pytest.raises(ValueError, match="'location' is entered already"):
        t.tlv_codec(OtherLocation)
    assert t.TLV_CODECS.get("location") is t.Location
    assert t.parse_value(t.Location().to_tlv()) == t.Location()


def test_a_codec_without_a_handler_is_answered_as_not_understood(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the registry check guards against: without its handler a TLV type the codec
    knows is sent back untouched with U set, as an unknown one would be."""
    area = t.DirectMeasurement(s_txc=7).to_tlv().encode()
    ctx = TlvContext(received=3, transmitted=2)
    (answered,) = t.decode_tlvs(reflect_tlvs(area, ctx).area)
    assert answered.flags == 0
    assert t.DirectMeasurement.from_tlv(answered) == t.DirectMeasurement(7, 3, 2)
    monkeypatch.delitem(TLV_HANDLERS, t.DirectMeasurement)
    assert reflect_tlvs(area, ctx).area == area
