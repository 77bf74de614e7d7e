"""The system under test of a PDR run: one STAMP reflector process on one data plane.

``python -m sixlab.bench.reflector --plane mmap --interface eth0`` opens the plane on
the interface (UDP port 862), answers every SSID with a stateless default session
(RFC 8762 §4.3, RFC 8972 §3), prints ``ready`` once it answers, and runs until its
standard input closes; then it prints one JSON line of counters: ``received`` and
``send_failed`` of the engine, ``reflected`` of the core, the plane's own counters
(``plane``) and, for a ring plane, ``ring`` = [packets, drops] the kernel counted.
Run it in the SUT namespace, pinned (``BenchTestbed.run_pinned``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.dataplane.engine import ReflectorEngine
from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig
from sixlab.testbed import BenchTestbed
from sixlab.wire.stamp import STAMP_PORT

__all__ = ["ReflectorProcess", "main", "run"]


class ReflectorProcess:
    """A reflector started by this module in the bench's SUT, pinned to ``cpu``."""

    def __init__(self, tb: BenchTestbed, plane: str, cpu: int = 1) -> None:
        self.plane = plane
        argv = [sys.executable, "-m", "sixlab.bench.reflector", "--plane", plane]
        self.proc = tb.run_pinned(
            tb.sut,
            [*argv, "--interface", tb.sut_if],
            cpu,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != b"ready":
            self.proc.kill()
            raise RuntimeError(f"{plane}: reflector did not start ({line!r})")

    def finish(self, timeout: float = 60.0) -> dict[str, object]:
        """Stop it (close its standard input); its counters."""
        out, _ = self.proc.communicate(b"", timeout=timeout)
        if self.proc.returncode != 0:
            raise RuntimeError(f"{self.plane}: reflector exited with {self.proc.returncode}")
        result: dict[str, object] = json.loads(out.splitlines()[-1])
        return result


def run(plane: str, interface: str | None, port: int = STAMP_PORT) -> dict[str, object]:
    """Reflect until standard input closes; the counters described in the module doc."""
    dp = create(plane, DataplaneConfig(port=port, interface=interface))
    dp.open()
    try:
        reflector = Reflector()
        engine = ReflectorEngine(dp, reflector)
        # Through the engine, so a plane that reflects in the kernel (xdp) gets it too.
        engine.set_default(ReflectorSessionConfig(None))
        engine.start()
        print("ready", flush=True)
        sys.stdin.read()
        engine.shutdown()
        if engine.error is not None:
            raise engine.error
        counters: dict[str, object] = {
            "received": engine.counters.received,
            "reflected": reflector.counters.reflected,
            "send_failed": engine.counters.send_failed,
        }
        counters["plane"] = dp.counters()
        ring = dp.kernel_stats()
        if ring is not None:
            counters["ring"] = list(ring)
        return counters
    finally:
        dp.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plane", required=True)
    parser.add_argument("--interface")
    parser.add_argument("--port", type=int, default=STAMP_PORT)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.plane, args.interface, args.port)), flush=True)


if __name__ == "__main__":
    main()
