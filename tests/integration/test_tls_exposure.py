"""Agents and the controller on network addresses: mutual TLS, or ``--insecure`` with a
warning, never clear text by accident.

Every process is a real ``sixlab`` subprocess listening on the wildcard address (``[::]``,
reachable from the network); the tests dial it over ``[::1]`` only.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sixlab.southbound.client import AgentClient, ClientTls, SouthboundError
from tests.integration._pki import make_pki
from tests.integration._ports import free_port

pytestmark = pytest.mark.root

SIXLAB = [sys.executable, "-m", "sixlab"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA; a certificate for the agent and the controller servers (localhost, ::1);
    client certificates for the controller (to the agents) and for an operator."""
    return make_pki(
        tmp_path_factory.mktemp("pki"),
        (
            ("server", "subjectAltName=DNS:localhost,IP:::1"),
            ("controller", "extendedKeyUsage=clientAuth"),
            ("operator", "extendedKeyUsage=clientAuth"),
        ),
    )


@contextmanager
def _daemon(argv: list[str], ready: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [*SIXLAB, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line.startswith(ready), line + (proc.stderr.read() if proc.stderr else "")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _tls_flags(pki: Path, name: str, prefix: str = "--tls") -> list[str]:
    return [
        f"{prefix}-cert", str(pki / f"{name}.pem"),
        f"{prefix}-key", str(pki / f"{name}.key"),
        f"{prefix}-ca", str(pki / "ca.pem"),
    ]  # fmt: skip


def test_insecure_agent_serves_with_a_warning() -> None:
    port = free_port("::1", socket.SOCK_STREAM)
    argv = ["stamp", "agent", "--role", "reflector", "--grpc", f"[::]:{port}", "--insecure"]
    with _daemon(argv, "stamp agent: role=reflector") as proc:
        with AgentClient(f"[::1]:{port}") as client:
            assert client.info().role != 0
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        assert proc.stderr is not None
        err = proc.stderr.read()
    assert "serving the southbound API on [::]:" in err
    assert "without TLS (--insecure)" in err


def test_mtls_agents_and_controller_on_network_addresses(pki: Path, tmp_path: Path) -> None:
    """Two agents and the controller on [::] with mutual TLS: the controller drives the
    agents with its client certificate, the operator's CLI drives the controller with
    its own; a client without a certificate gets nowhere."""
    sport, rport, cport = (
        free_port("::1", socket.SOCK_STREAM),
        free_port("::1", socket.SOCK_STREAM),
        free_port("::1", socket.SOCK_STREAM),
    )
    agent_argv = [*_tls_flags(pki, "server"), "--log-format", "json"]
    with (
        _daemon(
            ["stamp", "agent", "--role", "sender", "--grpc", f"[::]:{sport}", *agent_argv],
            "stamp agent: role=sender",
        ),
        _daemon(
            ["stamp", "agent", "--role", "reflector", "--grpc", f"[::]:{rport}", *agent_argv],
            "stamp agent: role=reflector",
        ),
        _daemon(
            [
                "controller", "serve", "--db", str(tmp_path / "c.db"),
                "--grpc", f"[::]:{cport}", "--poll-interval", "0.05",
                *_tls_flags(pki, "server"),
                *_tls_flags(pki, "controller", "--agent-tls"),
            ],
            f"controller: grpc=[::]:{cport}",
        ),
    ):  # fmt: skip
        # Anonymous clients are refused by the agents (TLS without a certificate).
        anonymous = AgentClient(f"[::1]:{sport}", tls=ClientTls(pki / "ca.pem"), timeout=3)
        with anonymous, pytest.raises(SouthboundError):
            anonymous.info()
        ctl = [f"[::1]:{cport}", *_tls_flags(pki, "operator")]

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*SIXLAB, "controller", *args, "--controller", *ctl],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        for name, port, role in (("s", sport, "sender"), ("r", rport, "reflector")):
            out = cli("node", "add", name, f"[::1]:{port}", "--role", role)
            assert out.returncode == 0, out.stderr
            assert "healthy" in out.stdout
        for name in ("s", "r"):
            out = cli("node", "init", name, "--source", "::1", "--port", "0", "--json")
            assert out.returncode == 0, out.stderr
        rport_udp = json.loads(out.stdout)["port"]
        out = cli(
            "session", "create", "p", "--sender", "s", "--reflector", "r",
            "--reflector-address", "::1", "--port", str(rport_udp), "--interval", "0.01",
            "--count", "20",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert cli("session", "start", "p").returncode == 0
        out = cli("session", "wait", "p", "--timeout", "30")
        assert out.stdout.strip() == "session p finished: sent 20, lost 0, stored 20", out.stderr
        # Without a client certificate the CLI is refused, in one line.
        bare = subprocess.run(
            [*SIXLAB, "controller", "node", "list", "--controller", f"[::1]:{cport}",
             "--tls-ca", str(pki / "ca.pem")],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert bare.returncode == 1
        assert bare.stderr.startswith("sixlab controller: UNAVAILABLE: ")
        assert len(bare.stderr.splitlines()) == 1
