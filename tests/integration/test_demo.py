"""``sixlab demo`` end to end: the main job, as a user runs it."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sixlab.controller.store import SqliteStore
from sixlab.dataplane.base import available

pytestmark = pytest.mark.root

DEMO = [sys.executable, "-m", "sixlab", "demo"]


def _namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.startswith(prefix)]


def _marked_processes(mark: str) -> list[str]:
    """Processes whose environment carries ``SIXLAB_TEST_RUN=mark``: a demo started with
    it and everything it started (the testbed passes its environment on), and no other
    run's processes on a shared machine."""
    needle = f"SIXLAB_TEST_RUN={mark}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or a kernel thread
            continue
        if needle in environ.split(b"\0"):
            args = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{proc.name} {args}")
    return found


def _marked_env(mark: str, tmp: Path) -> dict[str, str]:
    """The environment of one demo run: its processes carry ``mark``, and its temporary
    files (the testbed's and the agents' socket folders) go under ``tmp``, this run's
    alone, so that what it leaves behind is seen whatever else runs on the machine."""
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "SIXLAB_TEST_RUN": mark, "TMPDIR": str(tmp)}


def _assert_left_nothing(pid: int, mark: str, tmp: Path) -> None:
    """The demo of ``pid`` removed its namespaces (named ``sixlab-demo-PID-*``: other
    demos' are theirs), stopped every process it started, and removed its temporary
    files."""
    assert not _namespaces(f"sixlab-demo-{pid}-")
    assert not _marked_processes(mark)
    assert not list(tmp.iterdir())


#: Every plane the demo offers (``--dataplane``'s choices), once; the socket plane with
#: both ways of collecting.
#: How far a median may be from the configured delay (ms). The scapy plane takes T1 and
#: T3 before it builds each packet with scapy layers (a Python-speed step on the send
#: path: docs of ``sixlab.dataplane.scapy_plane``), so its delays include that cost.
TOLERANCE_MS = {"scapy": 2.0}
#: Emulated link directions a measurement crosses: a one-way delay one, a two-way
#: path's round trip two, path L's round trip four (B out, the far link both ways, A
#: back). Each element's wake-up error adds (0.2-0.4 ms per element for whole runs on a
#: busy shared VM, more beside other work), so a round trip is allowed the one-way
#: tolerance per direction it crosses; none is ever faster than its links.
TWO_WAY_LEGS = 2
LOOP_LEGS = 4
#: The loss timeout (s) of the runs whose every probe is to be answered (``loss == 0``).
ANSWERED_TIMEOUT_S = 10
RUNS = [("socket", "stream"), ("socket", "poll")] + [
    (plane, "stream") for plane in available() if plane != "socket"
]


@pytest.mark.parametrize(("plane", "collect"), RUNS)
def test_demo_measures_the_configured_delays(tmp_path: Path, plane: str, collect: str) -> None:
    mark = secrets.token_hex(8)
    proc = subprocess.Popen(
        [
            *DEMO,
            "--duration",
            "3",
            "--interval",
            "0.05",
            # A loss timeout no reply the loaded machine holds reaches (each session ends
            # with its last reply, so it costs a passing run nothing).
            "--timeout",
            str(ANSWERED_TIMEOUT_S),
            "--json",
            "--out",
            str(tmp_path),
            "--path-a",
            "4,9",
            "--path-b",
            "15,2",
            "--collect",
            collect,
            "--dataplane",
            plane,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_marked_env(mark, tmp_path / "tmp"),
    )
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    doc = json.loads(stdout)
    assert [p["name"] for p in doc["paths"]] == ["path-A", "path-B", "path-L"]
    want = {"path-A": (4.0, 9.0), "path-B": (15.0, 2.0)}
    *two_way, loop = doc["paths"]
    # Path L, loopback mode (docs/srpm.md): out over B (15 ms), around the agent-less far
    # host (2 + 4 ms, the default --far-link), back over A (9 ms); round trip only.
    assert (loop["mode"], loop["configured"]) == ("loopback", {"rtt_ms": 30.0})
    m = loop["measured"]
    assert (m["direct_ms"], m["return_ms"]) == (None, None)
    loop_tolerance = LOOP_LEGS * TOLERANCE_MS.get(plane, 1.0)
    assert abs(m["rtt_ms"]["p50"] - 30.0) <= loop_tolerance, loop
    assert m["rtt_ms"]["min"] >= 30.0 - 0.1, loop
    assert m["loss"] == 0
    assert m["received"] >= 50
    assert len(loop["segments"]) == 4
    for p in two_way:
        assert p["mode"] == "two-way"
        fwd, ret = want[p["name"]]
        assert p["configured"] == {"direct_ms": fwd, "return_ms": ret}
        m = p["measured"]
        tolerance = TOLERANCE_MS.get(plane, 1.0)
        assert abs(m["direct_ms"]["p50"] - fwd) <= tolerance, p
        assert abs(m["return_ms"]["p50"] - ret) <= tolerance, p
        assert abs(m["rtt_ms"]["p50"] - fwd - ret) <= TWO_WAY_LEGS * tolerance, p
        assert m["rtt_ms"]["min"] >= fwd + ret - 0.1, p
        assert m["loss"] == 0
        assert m["received"] >= 50  # 3 s at 20 probes/s, per path
        assert len(p["segments"]) == 2
    sqlite = list(tmp_path.glob("demo-*.sqlite"))
    png = list(tmp_path.glob("demo-*.png"))
    assert len(sqlite) == len(png) == 1
    assert png[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"results: {sqlite[0]}" in stderr
    store = SqliteStore(sqlite[0])  # --timeout reached every session
    try:
        timeouts = [r.params["loss_timeout_ns"] for r in store.sessions(include_destroyed=True)]
        assert timeouts == [ANSWERED_TIMEOUT_S * 10**9] * 3
    finally:
        store.close()
    _assert_left_nothing(proc.pid, mark, tmp_path / "tmp")


def test_demo_cleans_up_on_ctrl_c_and_runs_again(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    with log.open("w") as sink:
        mark = secrets.token_hex(8)
        proc = subprocess.Popen(
            [*DEMO, "--duration", "60", "--out", str(tmp_path)],
            stdout=sink,
            stderr=sink,
            env=_marked_env(mark, tmp_path / "tmp"),
        )
        try:
            deadline = time.monotonic() + 60
            while not _namespaces(f"sixlab-demo-{proc.pid}-") or "measuring" not in log.read_text():
                assert time.monotonic() < deadline, "the demo did not start measuring"
                time.sleep(0.2)
            time.sleep(1)
            running = _marked_processes(mark)
            assert any("linkemu" in p for p in running), running  # what must go, seen
            assert any("stamp agent" in p for p in running), running
            assert list((tmp_path / "tmp").iterdir())  # its socket folders, seen
            proc.send_signal(signal.SIGINT)
            assert proc.wait(60) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "interrupted" in log.read_text()
    # Nothing it started is left (namespaces, link emulators, agents, socket folders);
    # other runs' may exist.
    _assert_left_nothing(proc.pid, mark, tmp_path / "tmp")
    # A second run right after works, and leaves nothing either.
    again = subprocess.Popen(
        [*DEMO, "--duration", "1", "--json", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_marked_env(mark, tmp_path / "tmp"),
    )
    try:
        stdout, stderr = again.communicate(timeout=120)
    finally:
        if again.poll() is None:
            again.kill()
            again.wait()
    assert again.returncode == 0, stderr
    assert all(p["measured"]["received"] > 0 for p in json.loads(stdout)["paths"])
    _assert_left_nothing(again.pid, mark, tmp_path / "tmp")


def test_demo_without_root_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In-process with the uid faked: running the command as another user depends on
    # that user being able to read the checkout, which a CI folder need not allow.
    from sixlab.cli import main  # noqa: PLC0415

    monkeypatch.setattr("os.geteuid", lambda: 65534)
    assert main(["demo", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "needs root" in err
    assert "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing was built or written
