"""What operators install: systemd units, example configs, ``--config`` and JSON logs."""

from __future__ import annotations

import configparser
import json
import logging
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sixlab.cli import build_parser, main
from sixlab.cli._config import apply_config_file
from sixlab.cli._daemon import JsonFormatter
from sixlab.cli.install import install_units

UNITS = ("sixlab-agent@.service", "sixlab-controller.service", "sixlab-ilnp@.service")


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    install_units(tmp_path)
    return tmp_path


def _exec_start(unit: Path) -> list[str]:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(unit.read_text())
    assert {"Unit", "Service", "Install"} <= set(parser.sections())
    return shlex.split(parser["Service"]["ExecStart"])


def test_units_are_installed_with_this_python(installed: Path) -> None:
    unit_dir = installed / "etc/systemd/system"
    assert sorted(p.name for p in unit_dir.iterdir()) == sorted(UNITS)
    for name in UNITS:
        argv = _exec_start(unit_dir / name)
        assert argv[:3] == [sys.executable, "-m", "sixlab"]
        assert "--config" in argv
    assert sorted(p.name for p in (installed / "etc/sixlab").iterdir()) == [
        "agent-reflector.toml",
        "agent-sender.toml",
        "controller.toml",
        "ilnp-main.toml",
    ]


def test_install_keeps_edited_configs(installed: Path) -> None:
    config = installed / "etc/sixlab/controller.toml"
    config.write_text('db = "/srv/c.db"\n')
    install_units(installed)
    assert config.read_text() == 'db = "/srv/c.db"\n'


def test_systemd_accepts_the_units(installed: Path, tmp_path: Path) -> None:
    """``systemd-analyze verify`` (systemd is on Debian 12 and in CI): no error, and
    no warning either (an unknown key is only a warning there)."""
    analyze = shutil.which("systemd-analyze")
    assert analyze is not None, "systemd-analyze is missing (Debian package systemd)"
    unit_dir = installed / "etc/systemd/system"
    for name in UNITS:
        unit = unit_dir / name
        if name.endswith("@.service"):  # verify an instance of the template
            unit = tmp_path / name.replace("@.", "@example.")
            unit.write_text((unit_dir / name).read_text())
        out = subprocess.run(
            [analyze, "verify", str(unit)], capture_output=True, text=True, check=False
        )
        assert out.returncode == 0, out.stderr
        assert out.stderr == "", out.stderr


@pytest.mark.parametrize(
    ("unit", "instance", "expect"),
    [
        (
            "sixlab-agent@.service",
            "sender",
            {"role": "sender", "grpc": "[::]:50051", "log_format": "json"},
        ),
        (
            "sixlab-agent@.service",
            "reflector",
            {"role": "reflector", "grpc": "[::]:50052", "dataplane": "socket"},
        ),
        (
            "sixlab-controller.service",
            "",
            {"grpc": "unix:/run/sixlab/controller.sock", "metrics": ("127.0.0.1", 9464)},
        ),
        ("sixlab-ilnp@.service", "main", {"policy": "bounded", "interface": ["eth0"]}),
    ],
)
def test_each_unit_command_takes_its_example_config(
    installed: Path, unit: str, instance: str, expect: dict[str, object]
) -> None:
    argv = _exec_start(installed / "etc/systemd/system" / unit)[3:]
    argv = [
        a.replace("%i", instance).replace("/etc/sixlab", str(installed / "etc/sixlab"))
        for a in argv
    ]
    parser = build_parser()
    apply_config_file(parser, argv)
    args = parser.parse_args(argv)
    for key, value in expect.items():
        assert getattr(args, key) == value, key


# --------------------------------------------------------------------------- --config


def _parse(argv: list[str]) -> object:
    parser = build_parser()
    apply_config_file(parser, argv)
    return parser.parse_args(argv)


def test_config_values_are_flags_and_the_command_line_wins(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        'role = "reflector"\ngrpc = "unix:/run/a.sock"\nmax-workers = 4\ninsecure = true\n'
    )
    args = _parse(["stamp", "agent", "--config", str(config)])
    assert (args.role, args.grpc, args.max_workers, args.insecure) == (  # type: ignore[attr-defined]
        "reflector",
        "unix:/run/a.sock",
        4,
        True,
    )
    args = _parse(["stamp", "agent", "--config", str(config), "--max-workers", "2"])
    assert args.max_workers == 2  # type: ignore[attr-defined]
    assert args.role == "reflector"  # type: ignore[attr-defined]


def test_config_list_gives_repeatable_flag_and_command_line_replaces_it(tmp_path: Path) -> None:
    config = tmp_path / "ilnp.toml"
    config.write_text('nid = "0:0:0:a"\nlocator = ["2001:db8:1:0"]\ninterface = ["a", "b"]\n')
    args = _parse(["ilnp", "host", "--config", str(config)])
    assert args.interface == ["a", "b"]  # type: ignore[attr-defined]
    args = _parse(["ilnp", "host", "--config", str(config), "--interface", "c"])
    assert args.interface == ["c"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('role = "sender"\nbogus = 1\n', "unknown key 'bogus'"),
        ('role = "observer"\n', "role: 'observer' is not one of sender, reflector"),
        ('role = "sender"\nmax-workers = 0\n', "max-workers: 0 is not in 1..1024"),
        ('role = "sender"\nmax-workers = 1e300\n', "max-workers: not a number of threads"),
        ('role = "sender"\ninsecure = "yes"\n', "insecure: 'yes' is not true or false"),
        ('role = "sender"\ngrpc = ["a", "b"]\n', "grpc: one value, not a list"),
        ("role = \n", "not TOML"),
    ],
)
def test_bad_config_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(text)
    with pytest.raises(SystemExit) as exc:
        main(["stamp", "agent", "--config", str(config)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert message in err.strip().splitlines()[-1]


def test_missing_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["controller", "serve", "--config", str(tmp_path / "none.toml")])
    assert "No such file or directory" in capsys.readouterr().err


# ------------------------------------------------------------------------------- logs


def test_json_log_lines() -> None:
    record = logging.LogRecord("sixlab.agent", logging.WARNING, __file__, 1, "a %s", ("b",), None)
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "warning"
    assert line["logger"] == "sixlab.agent"
    assert line["msg"] == "a b"
    assert line["ts"].endswith("+00:00")


def test_agent_logs_json(tmp_path: Path) -> None:
    argv = ["stamp", "agent", "--role", "sender", "--grpc", f"unix:{tmp_path}/a.sock"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sixlab", *argv, "--log-format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("stamp agent: role=sender")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    lines = [json.loads(line) for line in err.splitlines()]
    assert [(x["level"], x["logger"]) for x in lines] == [
        ("info", "sixlab.agent"),
        ("info", "sixlab.agent"),
    ]
    assert lines[0]["msg"].startswith("serving the southbound API on unix:")
    assert lines[1]["msg"] == "stopping"


# ------------------------------------------------------------------------ prometheus


def test_alert_rules_pass_their_promtool_tests() -> None:
    """``deploy/prometheus/sixlab-rules.test.yml``: each alert fires when it should
    (and not before its ``for``), and a path with no loss has a loss ratio of 0."""
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing (Debian package prometheus; ./run adds it)"
    rules = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
    out = subprocess.run(
        [promtool, "test", "rules", "sixlab-rules.test.yml"],
        cwd=rules,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_daemon_run_in_process_leaves_logging_as_it_was(tmp_path: Path) -> None:
    """A command run by a test (or a program) in-process must not leave its stderr
    handler or its level on the root logger: later logs would be printed."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    db = tmp_path / "missing" / "c.db"
    argv = ["controller", "serve", "--db", str(db), "--grpc", f"unix:{tmp_path}/s.sock", "-v"]
    assert main(argv) == 2
    assert main(["stamp", "agent", "--role", "sender", "--grpc", "[::]:0"]) == 2
    assert root.handlers == handlers
    assert root.level == level
