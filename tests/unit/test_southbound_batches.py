"""How ``AgentClient.call_many`` cuts a batch of requests (``CreateStampSessions``,
``StartStampSessions``) and the deadline each batch gets."""

from __future__ import annotations

from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.southbound.client import (
    BATCH_BYTES,
    BATCH_REQUESTS,
    PIPELINE_WINDOW,
    _chunks,
    _deadlines,
)


def test_batches_hold_at_most_their_count_and_bytes_and_keep_the_order() -> None:
    small = [pb.StartStampSessionRequest(ssid=i % 65536) for i in range(2 * BATCH_REQUESTS + 5)]
    chunks = _chunks(small)
    assert [len(c) for c in chunks] == [BATCH_REQUESTS, BATCH_REQUESTS, 5]
    assert [k for c in chunks for k in c] == list(range(len(small)))
    big = [pb.CreateStampSessionRequest(ssid=i, tlvs=bytes(9000)) for i in range(100)]
    chunks = _chunks(big)
    assert all(sum(big[k].ByteSize() + 4 for k in c) <= BATCH_BYTES for c in chunks)
    assert [k for c in chunks for k in c] == list(range(100))
    # A request larger than a batch's bytes goes alone.
    huge = [pb.CreateStampSessionRequest(ssid=1, tlvs=bytes(BATCH_BYTES)), small[0]]
    assert _chunks(huge) == [[0], [1]]


def test_a_batch_gets_the_time_the_calls_one_by_one_had_up_to_its_end() -> None:
    """The agent carries the batches out one after another: the k-th batch's deadline
    counts every request up to its end, ``timeout`` per window of them."""
    chunks = [list(range(1000)), list(range(1000, 1001)), list(range(1001, 1001 + 255))]
    assert _deadlines(chunks, 10.0) == [
        10.0 * -(-1000 // PIPELINE_WINDOW),
        10.0 * -(-1001 // PIPELINE_WINDOW),
        10.0 * -(-1256 // PIPELINE_WINDOW),
    ]
    assert _deadlines([[0]], 2.5) == [2.5]
