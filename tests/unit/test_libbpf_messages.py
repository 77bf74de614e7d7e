"""libbpf's own messages go to logging, not to the process's stderr."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sixlab.linux.errors import LinuxError
from sixlab.linux.libbpf import BpfObject, recent_messages


def test_libbpf_messages_are_logged_not_printed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    bogus = tmp_path / "bogus.o"
    bogus.write_text("not an ELF object\n")
    with caplog.at_level(logging.DEBUG, logger="sixlab.linux.libbpf"), pytest.raises(LinuxError):
        BpfObject(bogus)
    assert capfd.readouterr().err == ""  # libbpf's default printer writes to fd 2
    assert any("is not a proper ELF object" in m for m in recent_messages())
    assert any("is not a proper ELF object" in r.getMessage() for r in caplog.records)
