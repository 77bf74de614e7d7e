"""Declarative configuration: make the controller's nodes and sessions what a list says.

Theory of operation
-------------------
``plan`` compares what is wanted (``WantedNode``, ``WantedSession``) with the store and
returns the steps that make them equal, in an order that always works:

1. destroy the sessions that are not wanted, that differ (any field of their spec), or
   that run on a node about to be replaced or re-initialised;
2. remove the nodes that are not wanted, point those whose address or role differs at
   the new agent, add the new ones;
3. initialise the nodes whose Init parameters are new or differ (Reset first: an agent
   initialises once, and a Reset also drops what it carried);
4. create the new and the destroyed-for-a-change sessions (the destroyed one keeps its
   results under its name, beside the new one: ``session list --all``);
5. start the sessions wanted running that are created or stopped, and stop those wanted
   stopped that run.

A node not wanted on which sessions ran (destroyed ones included: their stored results,
epochs, events and rollups name the node) is removed only with ``prune``, and that
history with it; without, ``plan`` refuses the list (``InUseError``, naming the sessions)
rather than keep the node quietly: keep it in the list to keep the history.

A session that finished (its count or duration reached) counts as running: it ran as
asked, and applying the same list again does not start it again. Equal lists make an
empty plan, so applying a list twice, or applying what ``export`` wrote, changes
nothing. ``plan`` only reads; every check that could refuse the list (unknown nodes,
names twice, a key hash that does not match) happens there, before ``execute`` makes
the first change.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from sixlab.controller.core import Controller, ControllerError, SessionSpec
from sixlab.controller.store import InUseError, SessionRow, Store, _listing

__all__ = ["Step", "WantedNode", "WantedSession", "execute", "key_sha256", "plan", "spec_of"]

#: A session the user counts as started (see the module docstring).
_STARTED = ("running", "starting", "stopping", "finished")


@dataclass(frozen=True, slots=True)
class WantedNode:
    name: str
    address: str
    role: str
    #: Init parameters as the store keeps them (dataplane, port, interface, source), or
    #: None to leave the agent alone.
    init: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class WantedSession:
    spec: SessionSpec
    #: Keep the session's key if its SHA-256 is this (``spec.key_hex`` is then unused).
    key_sha256: str
    running: bool


@dataclass(frozen=True, slots=True)
class Step:
    action: str
    kind: str
    name: str
    detail: str
    run: Callable[[], object]
    #: A session (re)create step's spec: ``execute`` creates runs of them in one batch.
    spec: SessionSpec | None = None


def key_sha256(key_hex: str) -> str:
    """The hex SHA-256 of a hex key ("" for no key)."""
    return hashlib.sha256(bytes.fromhex(key_hex)).hexdigest() if key_hex else ""


def spec_of(row: SessionRow) -> SessionSpec:
    params = dict(row.params)
    for key in ("segments", "return_segments"):
        params[key] = tuple(params[key])
    known = {f.name for f in fields(SessionSpec)}
    return SessionSpec(**{k: v for k, v in params.items() if k in known})


def _differs(a: SessionSpec, b: SessionSpec) -> list[str]:
    one, two = asdict(a), asdict(b)
    return [k for k in one if one[k] != two[k]]


def plan(  # noqa: PLR0912 - one branch per kind of difference, in the order the steps run
    controller: Controller,
    nodes: list[WantedNode],
    sessions: list[WantedSession],
    *,
    prune: bool = False,
) -> list[Step]:
    """The steps that make the controller match; ControllerError if the list is wrong
    (``prune``: see the module docstring)."""
    store: Store = controller.store
    wanted_nodes = _unique("node", [(n.name, n) for n in nodes])
    wanted = _unique("session", [(s.spec.name, s) for s in sessions])
    for s in wanted.values():
        for role, node in (("sender", s.spec.sender), ("reflector", s.spec.reflector)):
            if node not in wanted_nodes:
                raise ControllerError(
                    f"sessions.{s.spec.name}.{role}: node {node!r} is not in the list"
                )
            if wanted_nodes[node].role != role:
                raise ControllerError(
                    f"sessions.{s.spec.name}.{role}: node {node!r} is a {wanted_nodes[node].role}"
                )
        s.spec.validate()
    current_nodes = {n.name: n for n in store.nodes()}
    current = {r.name: r for r in store.sessions()}

    replaced: dict[str, str] = {}  # node -> why
    reinit: dict[str, str] = {}
    for name, want in wanted_nodes.items():
        have = current_nodes.get(name)
        if have is None:
            if want.init is not None:
                reinit[name] = "new node"
            continue
        diff = [k for k in ("address", "role") if getattr(have, k) != getattr(want, k)]
        if diff:
            replaced[name] = ", ".join(diff)
            if want.init is not None:
                reinit[name] = "node replaced"
        elif want.init is not None and want.init != have.init:
            reinit[name] = _init_diff(have.init, want.init)

    steps: list[Step] = []
    create: dict[str, tuple[SessionSpec, str]] = {}
    for name, row in current.items():
        want_s = wanted.get(name)
        if row.state == "destroying":
            # Being destroyed (through another request or replica): the destroy step
            # waits until it is, then a wanted one is created afresh.
            steps.append(_step("destroy", "session", name, "being destroyed", controller))
            if want_s is not None:
                create[name] = (_resolve_key(want_s, spec_of(row)), "being destroyed")
            continue
        if want_s is None:
            steps.append(_step("destroy", "session", name, "not in the list", controller))
            continue
        have_spec = spec_of(row)
        want_spec = _resolve_key(want_s, have_spec)
        fields_ = _differs(have_spec, want_spec)
        moved = [n for n in (row.sender, row.reflector) if n in replaced or n in reinit]
        if fields_ or moved:
            detail = ", ".join(fields_) if fields_ else f"node {moved[0]} changes"
            steps.append(_step("destroy", "session", name, detail, controller))
            create[name] = (want_spec, detail)
    for name, want_s in wanted.items():
        if name not in current:
            create[name] = (_resolve_key(want_s, None), "new session")

    steps.extend(_removals(controller, [n for n in current_nodes if n not in wanted_nodes], prune))
    for name, want in wanted_nodes.items():
        where = f"{want.role} at {want.address}"
        if name in replaced:
            detail = f"{replaced[name]}: {where}"
            steps.append(Step("replace", "node", name, detail, _replace(controller, want)))
        elif name not in current_nodes:
            steps.append(Step("add", "node", name, where, _add(controller, want)))
    for name, why in reinit.items():
        init = wanted_nodes[name].init
        assert init is not None
        steps.append(Step("init", "node", name, why, _init(controller, name, init)))
    for name, (spec, detail) in create.items():
        action = "create" if name not in current else "recreate"
        steps.append(Step(action, "session", name, detail, _create(controller, spec), spec))

    for name, want_s in wanted.items():
        state = "created" if name in create else current[name].state
        if want_s.running and state in ("created", "stopped"):
            steps.append(_step("start", "session", name, "wanted running", controller))
        elif not want_s.running and state == "running":
            steps.append(_step("stop", "session", name, "wanted stopped", controller))
    return steps


def execute(steps: list[Step], controller: Controller | None = None) -> list[Step]:
    """Run the steps in order; returns those done. The first failure propagates with
    ``done`` (the steps made before it) attached.

    With ``controller``, a run of consecutive session creations is one
    ``Controller.create_sessions`` call, a run of starts one ``start_sessions`` (their
    agent calls pipelined) and a run of destroys one ``destroy_sessions`` (one wait for
    the replicas that carry them out): the steps of a run that succeed are done even
    when another of the run failed, and ``done`` says so."""
    done: list[Step] = []
    i = 0
    while i < len(steps):
        run = _batchable(steps, i) if controller is not None else 1
        try:
            if run > 1:
                assert controller is not None
                _run_batch(controller, steps[i : i + run], done)
            else:
                steps[i].run()
                done.append(steps[i])
        except Exception as exc:
            exc.add_note(f"after {len(done)} of {len(steps)} changes")
            exc.done = done  # type: ignore[attr-defined]
            raise
        i += run
    return done


def _batchable(steps: list[Step], i: int) -> int:
    """How many steps from ``i`` on make one batch (1: none)."""

    def kind(step: Step) -> str:
        if step.kind == "session" and step.action in ("create", "recreate") and step.spec:
            return "create"
        if step.kind == "session" and step.action in ("start", "destroy"):
            return step.action
        return ""

    first = kind(steps[i])
    if not first:
        return 1
    n = 1
    while i + n < len(steps) and kind(steps[i + n]) == first:
        n += 1
    return n


def _run_batch(controller: Controller, steps: list[Step], done: list[Step]) -> None:
    """Create or start the sessions of a run of steps at once (see ``execute``)."""
    if steps[0].action == "start":
        errors = controller.start_sessions([s.name for s in steps])
    elif steps[0].action == "destroy":
        errors = controller.destroy_sessions([s.name for s in steps])
    else:
        _, errors = controller.create_sessions([s.spec for s in steps if s.spec is not None])
    done.extend(s for s in steps if s.name not in errors)
    for step in steps:
        if step.name in errors:
            raise errors[step.name]


# --------------------------------------------------------------------------- helpers


def _unique(kind: str, items: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, item in items:
        if name in out:
            raise ControllerError(f"{kind}s: {name!r} is listed twice")
        out[name] = item
    return out


def _resolve_key(want: WantedSession, have: SessionSpec | None) -> SessionSpec:
    """The wanted spec with its key: given, or kept from ``have`` by its hash."""
    if not want.key_sha256:
        return want.spec
    if have is not None and key_sha256(have.key_hex) == want.key_sha256.lower():
        return replace(want.spec, key_hex=have.key_hex)
    raise ControllerError(
        f"sessions.{want.spec.name}: key-sha256 names no key this controller has for the "
        "session: give the key itself (auth-key)"
    )


def _init_diff(have: dict[str, Any] | None, want: dict[str, Any]) -> str:
    if have is None:
        return "not initialised"
    return ", ".join(k for k in want if have.get(k) != want[k]) or "init"


def _step(action: str, kind: str, name: str, detail: str, controller: Controller) -> Step:
    fn = {
        "destroy": controller.destroy_session,
        "start": controller.start_session,
        "stop": controller.stop_session,
    }[action]
    return Step(action, kind, name, detail, lambda: fn(name))


def _removals(controller: Controller, names: list[str], prune: bool) -> list[Step]:
    """The steps removing the nodes not wanted (module docstring: ``prune``)."""
    if not names:
        return []
    ran: dict[str, list[str]] = {name: [] for name in names}
    for row in controller.store.sessions(include_destroyed=True):
        for node in {row.sender, row.reflector}:
            if node in ran and row.name not in ran[node]:
                ran[node].append(row.name)
    steps = []
    for name in names:
        detail = "not in the list"
        if ran[name]:
            history = f"session{'s' * (len(ran[name]) > 1)} {_listing(ran[name])}"
            if not prune:
                raise InUseError(
                    f"nodes: {name!r} is not in the list, but the stored results of {history} "
                    "name it: keep the node in the list, or prune (apply --prune) to remove "
                    "it with that history"
                )
            detail += f"; with the history of {history}"
        steps.append(Step("remove", "node", name, detail, _remove(controller, name, prune)))
    return steps


def _remove(controller: Controller, name: str, prune: bool) -> Callable[[], object]:
    return lambda: controller.remove_node(name, prune=prune)


def _replace(controller: Controller, want: WantedNode) -> Callable[[], object]:
    return lambda: controller.replace_node(want.name, want.address, want.role)


def _add(controller: Controller, want: WantedNode) -> Callable[[], object]:
    return lambda: controller.register_node(want.name, want.address, want.role)


def _init(controller: Controller, name: str, init: dict[str, Any]) -> Callable[[], object]:
    def run() -> None:
        controller.client(name).reset()
        controller.init_node(name, **init)

    return run


def _create(controller: Controller, spec: SessionSpec) -> Callable[[], object]:
    return lambda: controller.create_session(spec)
