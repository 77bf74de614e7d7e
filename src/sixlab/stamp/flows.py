"""ECMP coverage: test packets spread over IPv6 flow labels, statistics per label.

One SRv6 path between two SIDs can be several physical paths: a router with equal-cost
next hops picks one by a hash of the packet, and SRv6 nodes hash on the outer header's
source, destination and Flow Label (RFC 8986 §7; RFC 6437 §3 is the label's use for
load balancing; Linux's ``fib_multipath_hash_policy=0``). A session that sends every
test packet with one label measures one of those paths. Given ``flow_labels``, a
Session-Sender sends test packet Seq ``n`` with label ``flow_labels[n % len]``: the
labels take turns, each covers the same share of the session, and which label a packet
had follows from its Seq alone (a controller places lost packets without being told).

Label values are 1..0x7FFFF: 0 means "no label" (RFC 6437 §2) and Linux replaces it
with its own, and Linux keeps 0x80000..0xFFFFF for the labels it makes itself while
``net.ipv6.flowlabel_state_ranges`` is 1 (its default), so a socket may not lease them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace

from sixlab.stamp._events import SessionConfigError, StampResult
from sixlab.stamp.stats import PathStats, path_stats

__all__ = [
    "MAX_FLOWS",
    "MAX_FLOW_LABEL",
    "check_flow_labels",
    "flow_label_for",
    "per_flow_stats",
    "spread_labels",
]

#: Largest label a sender sets (module docstring: Linux's stateless range begins above).
MAX_FLOW_LABEL = 0x7FFFF
#: Labels per session: enough to cover any ECMP fan-out with room to spare, few enough
#: that a session of a few hundred packets still gives each label a sample.
MAX_FLOWS = 256


def check_flow_labels(labels: Iterable[int]) -> tuple[int, ...]:
    """The labels as a tuple, or ``SessionConfigError`` naming what is wrong."""
    out = tuple(labels)
    if len(out) > MAX_FLOWS:
        raise SessionConfigError(f"flow_labels: {len(out)} labels, at most {MAX_FLOWS}")
    for label in out:
        if not 1 <= label <= MAX_FLOW_LABEL:
            raise SessionConfigError(
                f"flow_labels: {label:#x} is not in 0x1..{MAX_FLOW_LABEL:#x} (docs/srpm.md)"
            )
    if len(set(out)) != len(out):
        raise SessionConfigError("flow_labels: a label is given twice")
    return out


def spread_labels(count: int, first: int = 1) -> tuple[int, ...]:
    """``count`` consecutive labels from ``first`` (the usual way to ask for N flows)."""
    return check_flow_labels(range(first, first + count))


def flow_label_for(labels: Sequence[int], seq: int) -> int | None:
    """The label test packet ``seq`` carries (None for a session without labels)."""
    return labels[seq % len(labels)] if labels else None


def per_flow_stats(
    records: Iterable[StampResult],
    labels: Sequence[int],
    lost_seqs: Iterable[int] = (),
) -> dict[int, PathStats]:
    """Delay, jitter and loss of each flow label of a session (every label, even one
    with no record). Records carry their label; a lost Seq is placed by
    :func:`flow_label_for`. Jitter pairs consecutive packets *of one label* (the label's
    own Seq sequence), so it is a property of one path."""
    by_label: dict[int, list[StampResult]] = defaultdict(list)
    for record in records:
        label = record.flow_label
        if label is None:
            label = flow_label_for(labels, record.seq)
        if label is not None:
            by_label[label].append(record)
    lost: dict[int, int] = defaultdict(int)
    for seq in lost_seqs:
        label = flow_label_for(labels, seq)
        if label is not None:
            lost[label] += 1
    n = len(labels)
    out = {}
    for label in labels:
        # Consecutive Seqs of one label differ by n: renumber so that IPDV pairs them.
        recs = by_label.get(label, [])
        renumbered = [replace(r, seq=r.seq // n) for r in recs] if n > 1 else recs
        out[label] = path_stats(renumbered, lost=lost.get(label, 0))
    return out
