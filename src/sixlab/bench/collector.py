"""The system under test in the collector role: a Session-Sender whose replies it collects.

``python -m sixlab.bench.collector --plane xdp --interface in0 --peer fd00:0:10::1``
opens the plane on the interface (UDP port 862 unless ``--port``), runs a
:class:`~sixlab.dataplane.engine.SenderEngine` (the agent's engine), prints ``ready`` and
then obeys one command per line of its standard input:

* ``session SSID COUNT T1_NS``: forget the previous session, create session ``SSID``
  towards ``--peer`` and *prime* it (below) with ``COUNT`` test packets, the packet of
  Seq k with T1 = ``T1_NS`` + k seconds; answers ``ok``.
* ``records SSID``: one JSON line with what the engine holds for the session: ``records``
  (reflected packets matched to a test packet: the records the collector stored in its
  FIFO, ``SessionCounters.received`` of GetCounters), ``dropped`` by reason, ``queued``,
  ``overflow`` and the engine's and plane's counters.

When its standard input closes it prints the final counters as one JSON line and exits.

Why prime. The sender core (``sixlab.stamp.sender``) stores a record only for a
Session-Reflector packet that answers a test packet it sent: the Seq must be
outstanding and the echoed T1 must be the one it sent (RFC 8762 §4.2: the sender
matches the reflected Session-Sender Sequence Number and Timestamp); anything else is
counted as dropped (``unknown-seq``, ``bad-timestamp``), never stored. A tester that
offers Session-Reflector packets at line rate (the STAMP paper, "High Performance Delay
Monitoring for SRv6 Based SD-WANs", §VIII, collector case) must therefore answer test
packets the session really has outstanding. Priming runs the session's own send path
(``start`` and ``handle_timer``, the public sans-I/O API) on a schedule that ends just
behind the engine's monotonic clock, with the wall time of Seq k set to T1_NS + k s,
so the generator can write both fields with a counter (``stampgen.c``: ``24:0`` and
``28:<NTP seconds>``); the datagrams it produces are discarded, not sent, and the loss
timeout is set beyond the run. The work
per reply that the trials measure is then the collector's real path, unchanged: the
plane's receive, the engine's session lookup, the core's decode, match and T4, the
record into the FIFO. Priming reaches into the engine for the session object
(``SenderEngine._entries``): the engine has no API to start a session at a given time
without sending.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from ipaddress import IPv6Address

from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.dataplane.engine import SenderEngine, SenderSessionSpec
from sixlab.stamp.sender import NS_PER_S, SenderConfig, State
from sixlab.testbed import BenchTestbed
from sixlab.wire.stamp import STAMP_PORT

__all__ = ["CollectorProcess", "main", "prime_session", "run"]

#: Records the engine may queue per session: more than any trial stores, so that the
#: FIFO never overflows during a trial (the bench reads counters, not records).
FIFO_CAPACITY = 1 << 24
#: The primed packets' loss deadlines lie at least this far after priming.
_SLACK_S = 3600
#: The primed schedule's step on the engine's monotonic clock (T1 steps by a second).
_PRIME_INTERVAL_NS = 1000


def prime_session(engine: SenderEngine, spec: SenderSessionSpec, count: int, t1_ns: int) -> None:
    """Add session ``spec`` to ``engine`` with ``count`` test packets outstanding.

    Seq k has T1 = ``t1_ns`` + k s (the wall clock the core puts on the wire); the
    schedule runs on the engine's monotonic clock, one ``spec.config.interval_ns`` per
    packet, ending in the past, so the engine finds the count reached and sends nothing.
    The session stores a record for each matching reply. ``count`` 0 adds it idle.
    """
    config = spec.config
    if config.count != count:
        raise ValueError("the session's count must be the number primed")
    if config.loss_timeout_ns <= count * config.interval_ns:
        raise ValueError("the loss timeout must outlast the primed schedule")
    engine.add_session(spec)
    if count == 0:
        return
    with engine.lock:
        session = engine._entries[config.ssid].session  # module doc: no API for this
        now = engine.monotonic() - (count + 1) * config.interval_ns
        session.start(now, t1_ns)
        for k in range(1, count):
            session.handle_timer(now + k * config.interval_ns, t1_ns + k * NS_PER_S)
        session.datagrams_to_send()  # primed, not sent
        while session.next_event() is not None:  # PacketSent of each: not records
            pass
        if session.state is not State.RUNNING:
            raise RuntimeError(f"primed session ended early ({session.state.name})")


def _spec(ssid: int, count: int, peer: IPv6Address) -> SenderSessionSpec:
    # The primed schedule (count x 1 µs) lies just behind the engine's clock; every
    # packet's loss deadline lies an hour past priming.
    timeout = _SLACK_S * NS_PER_S + count * _PRIME_INTERVAL_NS
    config = SenderConfig(ssid=ssid, interval_ns=_PRIME_INTERVAL_NS, count=count,
                          loss_timeout_ns=timeout)  # fmt: skip
    return SenderSessionSpec(config=config, reflector=peer, reflector_port=STAMP_PORT)


def _records(engine: SenderEngine, ssid: int | None) -> dict[str, object]:
    out: dict[str, object] = {
        "engine": {
            "received": engine.counters.received,
            "no_session": engine.counters.no_session,
            "send_failed": engine.counters.send_failed,
        },
        "plane": engine.dataplane.counters(),
    }
    if ssid is not None and ssid in engine.sessions():
        snap = engine.snapshot(ssid)
        out.update(
            records=snap.counters.received,
            sent=snap.counters.sent,
            duplicates=snap.counters.duplicates,
            dropped={reason.value: n for reason, n in snap.counters.dropped.items()},
            queued=snap.fifo_len,
            overflow=snap.overflow,
            state=snap.state.name,
        )
    return out


def run(plane: str, interface: str | None, peer: IPv6Address, port: int = STAMP_PORT) -> None:
    """Collect until standard input closes (module doc)."""
    dp = create(plane, DataplaneConfig(port=port, interface=interface))
    dp.open()
    try:
        engine = SenderEngine(dp, fifo_capacity=FIFO_CAPACITY)
        engine.start()
        current: int | None = None
        print("ready", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "session" and len(words) == 4:
                ssid, count, t1_ns = (int(w) for w in words[1:])
                if current is not None:
                    engine.remove_session(current)
                    current = None
                prime_session(engine, _spec(ssid, count, peer), count, t1_ns)
                current = ssid
                print("ok", flush=True)
            elif words[0] == "records" and len(words) == 2:
                print(json.dumps(_records(engine, int(words[1]))), flush=True)
            else:
                print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
        engine.shutdown()
        if engine.error is not None:
            raise engine.error
        print(json.dumps(_records(engine, current)), flush=True)
    finally:
        dp.close()


class CollectorProcess:
    """A collector started by this module in the bench's SUT, pinned to ``cpu``."""

    def __init__(
        self,
        tb: BenchTestbed,
        plane: str,
        *,
        peer: str,
        cpu: int = 1,
        interface: str | None = None,
        port: int = STAMP_PORT,
    ) -> None:
        self.plane = plane
        argv = [sys.executable, "-m", "sixlab.bench.collector", "--plane", plane, "--interface",
                interface or tb.sut_if, "--peer", peer, "--port", str(port)]  # fmt: skip
        self.proc = tb.run_pinned(tb.sut, argv, cpu, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        line = self._line()
        if line != "ready":
            self.proc.kill()
            raise RuntimeError(f"{plane}: collector did not start ({line!r})")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().decode().strip()

    def _command(self, text: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{text}\n".encode())
        self.proc.stdin.flush()
        line = self._line()
        if not line:
            raise RuntimeError(f"{self.plane}: collector exited ({self.proc.wait()})")
        return line

    def session(self, ssid: int, count: int, t1_ns: int) -> None:
        """A new primed session (module doc); the previous one is removed."""
        answer = self._command(f"session {ssid} {count} {t1_ns}")
        if answer != "ok":
            raise RuntimeError(f"{self.plane}: collector refused the session: {answer}")

    def records(self, ssid: int) -> dict[str, object]:
        """What the engine holds for session ``ssid`` (module doc)."""
        result: dict[str, object] = json.loads(self._command(f"records {ssid}"))
        if "error" in result:
            raise RuntimeError(f"{self.plane}: {result['error']}")
        return result

    def finish(self, timeout: float = 60.0) -> dict[str, object]:
        """Stop it (close its standard input); its final counters."""
        out, _ = self.proc.communicate(None, timeout=timeout)
        if self.proc.returncode != 0:
            raise RuntimeError(f"{self.plane}: collector exited with {self.proc.returncode}")
        result: dict[str, object] = json.loads(out.splitlines()[-1])
        return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plane", required=True)
    parser.add_argument("--interface")
    parser.add_argument("--peer", required=True, type=IPv6Address, help="the reflector's address")
    parser.add_argument("--port", type=int, default=STAMP_PORT)
    args = parser.parse_args(argv)
    run(args.plane, args.interface, args.peer, args.port)


if __name__ == "__main__":
    main()
