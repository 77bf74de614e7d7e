"""``sixlab ilnp``: the host daemon and the tools that talk to it.

* ``sixlab ilnp host --nid NID --locator L64[,PREF] ... --interface IF --policy P`` runs
  :class:`sixlab.ilnp.daemon.IlnpDaemon` in the foreground until SIGTERM/SIGINT (without
  ``--locator``, locators come from Router Advertisements: :mod:`sixlab.ilnp.autoconf`); it
  prints one ``ready ...`` line once the TUN device, rings, nft table and control socket
  exist.
* ``sixlab ilnp status`` and ``sixlab ilnp cache`` ask a running daemon over its
  control socket (JSON lines); ``--json`` prints the reply as it came.
* ``sixlab ilnp move L64...`` replaces the daemon's locators (``set-locators``) and
  ``sixlab ilnp add-peer NAME`` starts an ILCC entry for a name (``add-peer``).

Locators are written ``2001:db8:a::/64``, ``2001:db8:a::`` or ``2001:db8:a:0``; NIDs
``::a``, ``0:0:0:a`` or an integer (:mod:`sixlab.ilnp.config`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

from sixlab.cli import _argtypes as argtypes
from sixlab.cli import _daemon

if TYPE_CHECKING:
    from sixlab.wire.ilnp import LocatorEntry

__all__ = ["add_parsers", "main"]

log = logging.getLogger("sixlab.ilnp")


def add_parsers(sub: Any) -> None:
    """Add the ``ilnp`` command group to the ``sixlab`` subparsers ``sub``."""
    from sixlab.ilnp import POLICIES, STORES  # noqa: PLC0415 - keeps `--help` light

    control_help = "control socket path (default: /run/sixlab-ilnp-NETNS.sock, per namespace)"
    ilnp = sub.add_parser("ilnp", help="ILNPv6 host daemon and its tools")
    tools = ilnp.add_subparsers(dest="ilnp_command", required=True, metavar="TOOL")

    host = tools.add_parser("host", help="run the ILNPv6 host daemon")
    host.add_argument("--nid", required=True, type=_nid, help="our NID: ::a, 0:0:0:a or an integer")
    host.add_argument(
        "--locator",
        action="append",
        type=_host_locator,
        metavar="L64[,PREF[,LIFETIME]][@IF]",
        help="one of our locators, e.g. 2001:db8:a::/64 (repeat for multihoming); lower "
        "PREF is preferred; @IF: the link its address goes on when no link holds one; "
        "without any, locators are learned from Router Advertisements",
    )
    host.add_argument(
        "--ra-wait",
        type=argtypes.seconds,
        default=10.0,
        help="without --locator: how long to wait at start for a Router Advertisement",
    )
    host.add_argument(
        "--interface",
        action="append",
        type=argtypes.text,
        help="link to serve (repeatable; default: every Ethernet link that is up)",
    )
    host.add_argument("--policy", choices=POLICIES.names(), default="socket")
    host.add_argument("--store", choices=STORES.names(), default="hash")
    host.add_argument("--control", type=argtypes.text, help=control_help)
    host.add_argument(
        "--hosts", type=argtypes.text, help="I-LV hosts file for resolving correspondents"
    )
    host.add_argument(
        "--names",
        metavar="PATH",
        type=argtypes.text,
        help="write the identifier addresses of known names here, /etc/hosts format",
    )
    host.add_argument(
        "--name",
        action="append",
        default=[],
        type=argtypes.text,
        help="a correspondent's name to resolve at start (hosts file, then DNS NID and L64 "
        "records): in the --names file, reachable at its identifier address (repeatable)",
    )
    host.add_argument(
        "--tun", type=argtypes.text, default="ilnp0", help="TUN device for identifier addresses"
    )
    host.add_argument(
        "--nonce",
        choices=["always", "initial"],
        default="always",
        help="carry (and require) the nonce in every packet, or only where RFC 6744 must",
    )
    host.add_argument(
        "--fastpath",
        choices=["auto", "on", "off"],
        default="auto",
        help="kernel fast path for established correspondents (tc/eBPF): auto uses it "
        "when it loads, on requires it, off keeps every packet in the daemon",
    )
    host.add_argument("--capacity", type=_positive, default=1024, help="bounded policy: ILCC cap")
    host.add_argument(
        "--idle", type=argtypes.seconds, default=60.0, help="bounded policy: idle expiry, s"
    )
    _daemon.add_logging_arguments(host, default_level="warning")
    host.add_argument("--config", metavar="FILE", help="TOML file of flags (keys: long names)")
    host.set_defaults(handler=_host)

    for name, text in (("status", "daemon status and counters"), ("cache", "ILCC entries")):
        tool = tools.add_parser(name, help=text)
        tool.add_argument("--control", type=argtypes.text, help=control_help)
        tool.add_argument("--json", action="store_true", help="print the JSON reply")
        tool.set_defaults(handler=_query, query=name)

    move = tools.add_parser(
        "move", help="replace our locators (a move or a new uplink): Locator Updates go out"
    )
    move.add_argument(
        "locators",
        nargs="+",
        type=_locator,
        metavar="L64[,PREF[,LIFETIME]]",
        help="the new set; each must be held by one of the daemon's links",
    )
    move.add_argument("--control", help=control_help)
    move.add_argument("--json", action="store_true", help="print the JSON reply")
    move.set_defaults(handler=_query, query="set-locators")

    peer = tools.add_parser("add-peer", help="resolve a name and start an ILCC entry for it")
    peer.add_argument("name", help="a name in the daemon's hosts file, or in DNS (NID, L64)")
    peer.add_argument("--control", help=control_help)
    peer.add_argument("--json", action="store_true", help="print the JSON reply")
    peer.set_defaults(handler=_query, query="add-peer")

    cleanup = tools.add_parser(
        "cleanup",
        help="undo what a killed daemon left in this namespace (its state file says what)",
    )
    cleanup.add_argument(
        "--tun", type=argtypes.text, default="ilnp0", help="the dead daemon's TUN device"
    )
    cleanup.set_defaults(handler=_cleanup)


def _nid(text: str) -> int:
    from sixlab.ilnp.daemon import parse_nid  # noqa: PLC0415

    try:
        return parse_nid(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad NID {text!r}: {exc}") from None


def _locator(text: str) -> LocatorEntry:
    from sixlab.ilnp.resolve import ResolveError, parse_locator_spec  # noqa: PLC0415

    try:
        return parse_locator_spec(text)
    except ResolveError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _host_locator(text: str) -> tuple[LocatorEntry, str | None]:
    """``L64[,PREF[,LIFETIME]][@IF]``: a locator and the link its address goes on."""
    spec, at, link = text.partition("@")
    if at and not link:
        raise argparse.ArgumentTypeError(f"locator {text!r}: an interface name after @")
    return _locator(spec), link or None


def _format_spec(entry: LocatorEntry) -> str:
    """A parsed locator back in the control socket's ``L64,PREF,LIFETIME`` notation."""
    from sixlab.ilnp.config import format_l64  # noqa: PLC0415

    return f"{format_l64(entry.locator)},{entry.preference},{entry.lifetime}"


#: Largest ILCC the bounded policy may be given (entries): far above what a host
#: daemon serves, far below what would exhaust memory before the first packet.
MAX_CAPACITY = 1 << 24
_positive = argtypes.integer(1, MAX_CAPACITY, "a number of entries")


def _host(args: argparse.Namespace) -> int:
    with _daemon.daemon_logging(args.log_format, args.log_level):
        return _run_host(args)


def _run_host(args: argparse.Namespace) -> int:
    from sixlab.ilnp import ConfigError, IlnpError  # noqa: PLC0415
    from sixlab.ilnp.daemon import DaemonConfig, default_control, run_daemon  # noqa: PLC0415
    from sixlab.ilnp.host import check_locator_set  # noqa: PLC0415

    given = args.locator or []
    locators = tuple(entry for entry, _link in given)
    links = tuple((entry.locator, link) for entry, link in given if link is not None)
    try:
        if locators:  # none: learned from Router Advertisements
            check_locator_set(locators)
    except ConfigError as exc:
        print(f"sixlab ilnp host: {exc}", file=sys.stderr)
        return 2
    if not args.interface:
        from sixlab.ilnp.links import default_interfaces  # noqa: PLC0415

        args.interface = list(default_interfaces())
        if not args.interface:
            print("sixlab ilnp host: no Ethernet link is up: give --interface", file=sys.stderr)
            return 2
    for _value, link in links:
        if link not in args.interface:
            print(f"sixlab ilnp host: locator @{link}: not an --interface link", file=sys.stderr)
            return 2
    config = DaemonConfig(
        nid=args.nid,
        locators=locators,
        locator_links=links,
        interfaces=tuple(args.interface),
        policy=args.policy,
        store=args.store,
        control=args.control or default_control(),
        hosts=args.hosts,
        names=args.names,
        tun_name=args.tun,
        always_nonce=args.nonce == "always",
        bounded_capacity=args.capacity,
        bounded_idle=args.idle,
        fastpath=args.fastpath,
        ra_wait=args.ra_wait,
        resolve_names=tuple(args.name),
    )

    def announce(line: str) -> None:
        print(line, flush=True)
        log.info("%s", line)

    try:
        return run_daemon(config, announce=announce)
    except IlnpError as exc:
        # A setting that cannot work, or what the host cannot provide (an interface, a
        # readable hosts file, root for the TUN device, nft...): one line, no traceback.
        print(f"sixlab ilnp host: {exc}", file=sys.stderr)
        return 1


def _query(args: argparse.Namespace) -> int:
    from sixlab.ilnp import IlnpError  # noqa: PLC0415
    from sixlab.ilnp.daemon import control_request, default_control  # noqa: PLC0415

    request: dict[str, Any] = {"cmd": args.query}
    if args.query == "set-locators":
        request["locators"] = [_format_spec(entry) for entry in args.locators]
    elif args.query == "add-peer":
        request["name"] = args.name
    path = args.control or default_control()
    try:
        reply = control_request(path, request)
    except OSError as exc:
        print(f"sixlab ilnp {args.query}: {path}: {exc}", file=sys.stderr)
        return 1
    except IlnpError as exc:
        print(f"sixlab ilnp {args.query}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(reply, indent=2))
    elif args.query in ("status", "set-locators"):
        _print_status(reply)
    elif args.query == "add-peer":
        print(f"peer {args.name}: NID {reply['nid']}" if reply.get("ok") else reply.get("error"))
    else:
        _print_cache(reply)
    return 0 if reply.get("ok") else 1


def _cleanup(args: argparse.Namespace) -> int:
    from sixlab.ilnp import IlnpError  # noqa: PLC0415
    from sixlab.ilnp.leftovers import state_path, undo  # noqa: PLC0415

    path = state_path(args.tun)
    try:
        done = undo(path)
    except (IlnpError, OSError) as exc:
        print(f"sixlab ilnp cleanup: {exc}", file=sys.stderr)
        return 1
    for line in done:
        print(line)
    if not done:
        print(f"nothing to undo ({path}: no dead daemon's state here)")
    return 0


def _print_status(reply: dict[str, Any]) -> None:
    if not reply.get("ok"):
        print(reply.get("error"))
        return
    print(f"NID {reply['nid']}  address {reply['identifier_address']}")
    for loc in reply["locators"]:
        mark = "*" if loc["in_use"] else " "
        print(f" {mark} locator {loc['locator']}  pref {loc['preference']}")
    print(f"policy {reply['policy']}  store {reply['store']}  ILCC {reply['ilcc_size']}")
    fast = reply.get("fastpath") or {}
    if fast.get("enabled"):
        print(f"fast path: {fast['entries']} entries in the kernel")
    elif fast.get("mode") != "off":
        print(f"fast path: unavailable ({fast.get('error')})")
    sections = {t: reply[t] for t in ("counters", "drops", "events")}
    sections["fast path"] = fast.get("counters") or {}
    for title, values in sections.items():
        items = ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
        print(f"{title}: {items or '-'}")


def _print_cache(reply: dict[str, Any]) -> None:
    if not reply.get("ok"):
        print(reply.get("error"))
        return
    for entry in reply["entries"]:
        locs = " ".join(
            f"{p['locator']}({p['preference']},{p['state']})" for p in entry["locators"]
        )
        print(f"{entry['peer_nid']}  {entry['state']}  {locs}")


def main(argv: list[str] | None = None) -> int:
    """``python -m sixlab.cli.ilnp TOOL ...``: the group on its own (tests, before wiring)."""
    parser = argparse.ArgumentParser(prog="sixlab")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["ilnp", *(sys.argv[1:] if argv is None else argv)])
    rc: int = args.handler(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
