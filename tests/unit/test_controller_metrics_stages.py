"""The collection-stage histogram of the controller's metrics, and scraping it alone."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from sixlab.controller.metrics import LAG_BUCKETS_S, STAGES, ControllerMetrics, Totals

S = 1_000_000_000


def test_stages_add_up_to_the_total_per_result() -> None:
    m = ControllerMetrics()
    # Two messages: records with T4 at 1.0 and 1.2 s came at 1.3 s, one at 1.5 s came at
    # 1.6 s; the transaction began at 1.7 s and committed at 1.75 s.
    m.collection_stages([(1_300_000_000, [S, 1_200_000_000]), (1_600_000_000, [1_500_000_000])],
                        1_700_000_000, 1_750_000_000)  # fmt: skip
    m.collection_stages([(S, [])], S, S)  # a message without records: nothing
    reg = m.registry

    def value(what: str, stage: str) -> float | None:
        return reg.get_sample_value(f"sixlab_collection_stage_seconds_{what}", {"stage": stage})

    assert [value("count", s) for s in STAGES] == [3.0, 3.0, 3.0, 3.0]
    assert value("sum", "agent") == pytest.approx(0.3 + 0.1 + 0.1)
    assert value("sum", "queued") == pytest.approx(0.4 + 0.4 + 0.1)
    assert value("sum", "transaction") == pytest.approx(3 * 0.05)
    assert value("sum", "total") == pytest.approx(0.75 + 0.55 + 0.25)
    # The total of 0.75 s lies in the (0.7, 0.75] bucket: two results up to 0.7 s.
    le = {"stage": "total"}
    assert reg.get_sample_value("sixlab_collection_stage_seconds_bucket", {**le, "le": "0.7"}) == 2
    assert reg.get_sample_value("sixlab_collection_stage_seconds_bucket", {**le, "le": "0.75"}) == 3
    assert {0.7, 0.75} <= set(LAG_BUCKETS_S)
    # The transactions, and how long they took together (the commit slot's busy time).
    assert reg.get_sample_value("sixlab_collection_transactions_total") == 2
    assert reg.get_sample_value("sixlab_collection_transaction_seconds_total") == pytest.approx(
        0.05
    )


def test_a_scrape_of_the_stages_alone_does_not_read_the_store() -> None:
    m = ControllerMetrics()
    reads = []

    def totals() -> Totals:
        reads.append(1)
        return Totals()

    m.bind(totals)
    m.collection_stages([(2 * S, [S])], 2 * S, 2 * S)
    names = ["sixlab_collection_stage_seconds_count", "sixlab_collection_stage_seconds_sum"]
    text = generate_latest(m.registry.restricted_registry(names)).decode()
    assert 'sixlab_collection_stage_seconds_count{stage="total"} 1.0' in text
    assert "sixlab_stamp_packets" not in text
    assert reads == []
    full = generate_latest(m.registry).decode()  # a whole scrape reads it, once
    assert reads == [1]
    assert "sixlab_stamp_packets" in full
    assert 'sixlab_collection_stage_seconds_count{stage="total"} 1.0' in full
