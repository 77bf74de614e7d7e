"""Which links the kernel took down, from the link watcher's netlink events
(sixlab.ilnp.links.downed_indexes, no kernel)."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from sixlab.ilnp.links import downed_indexes

_RTM_NEWLINK, _RTM_DELLINK, _RTM_NEWADDR = 16, 17, 20
_IFF_UP, _IFF_RUNNING = 0x1, 0x40


def _link(kind: int, index: int, flags: int) -> bytes:
    body = struct.pack("=BxHiII", 0, 1, index, flags, 0)
    body += struct.pack("=HH", 8, 3) + b"eth0"  # IFLA_IFNAME, as the kernel sends it
    return struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body


def test_a_link_without_iff_up_and_a_deleted_one_are_down() -> None:
    data = (
        _link(_RTM_NEWLINK, 3, _IFF_UP | _IFF_RUNNING)  # up: not down
        + _link(_RTM_NEWLINK, 4, 0)  # ip link set down
        + _link(_RTM_NEWADDR, 5, 0)  # not a link message
        + _link(_RTM_DELLINK, 6, _IFF_UP)  # deleted
    )
    assert list(downed_indexes(data)) == [4, 6]


@given(st.integers(0, 35))  # the message is 36 bytes
def test_a_cut_message_is_not_read(cut: int) -> None:
    assert list(downed_indexes(_link(_RTM_NEWLINK, 4, 0)[:cut])) == []


@given(st.binary(max_size=300))
def test_downed_indexes_never_raises(data: bytes) -> None:
    for index in downed_indexes(data):
        assert isinstance(index, int)
