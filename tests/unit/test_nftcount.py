"""The data-flow counters' nftables table: what it matches, and what it refuses."""

from __future__ import annotations

import pytest

from sixlab.linux.nftcount import FlowCounters, FlowCountersError, FlowMatch


def test_a_match_narrows_to_protocol_and_port() -> None:
    assert FlowMatch.parse("fd00:0:2::2").statement() == "ip6 daddr fd00:0:2::2/128"
    match = FlowMatch.parse("fd00:0:2::/64", "udp", 9999)
    assert match.statement() == "ip6 daddr fd00:0:2::/64 meta l4proto udp udp dport 9999"
    assert FlowMatch.parse("fd00::1/64", "tcp").statement() == (
        "ip6 daddr fd00::/64 meta l4proto tcp"
    )


@pytest.mark.parametrize(
    ("prefix", "protocol", "port", "what"),
    [
        ("10.0.0.1", "", 0, "prefix"),
        ("fd00::/64", "sctp", 0, "protocol"),
        ("fd00::/64", "", 80, "port"),
        ("fd00::/64", "udp", 70000, "port"),
    ],
)
def test_a_bad_match_is_refused_by_name(prefix: str, protocol: str, port: int, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        FlowMatch.parse(prefix, protocol, port)


def test_the_table_counts_sent_at_output_and_forward_and_received_at_prerouting() -> None:
    tx = FlowMatch.parse("fc00:0:1::a")
    rx = FlowMatch.parse("fd00:0:1::1", "udp", 9)
    script = FlowCounters("sixlab_dm_x", tx=tx, rx=rx).ruleset()
    assert script.startswith('table ip6 sixlab_dm_x {\n  comment "sixlab pid=')
    for chain, hook, match in (("tx_out", "output", tx), ("tx_fwd", "forward", tx),
                               ("rx", "prerouting", rx)):  # fmt: skip
        head = f"chain {chain} {{\n    type filter hook {hook} priority filter; policy accept;\n"
        assert f"{head}    {match.statement()} counter\n" in script
    assert script.count("ip6 daddr fc00:0:1::a/128 counter") == 2
    assert script.count("udp dport 9 counter") == 1
    only_rx = FlowCounters("t", rx=rx).ruleset()
    assert "tx_out" not in only_rx


def test_counters_need_a_direction_and_an_installed_table() -> None:
    with pytest.raises(ValueError, match="tx or an rx"):
        FlowCounters("t")
    with pytest.raises(FlowCountersError, match="not installed"):
        FlowCounters("t", tx=FlowMatch.parse("::1")).read()
