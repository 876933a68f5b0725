"""Every name the SDK reference (document 000, ``nodus.agent``) lists exists, with its signature.

The reference is not in this repository, so its signature lines are copied here as data, as
written (``_SIGNATURES``), with the attributes it lists (``_ATTRIBUTES``). Each line is parsed
with `ast` and compared with `inspect.signature` of the SDK's object: the documented parameters
come first, in order, with the same names, kinds (positional or keyword-only, ``*args``,
``**kwargs``) and defaults. The SDK may add a parameter only after them, keyword-only with a
default, and only one listed in ``_EXTRAS`` with the reason it exists: a silent addition or a
renamed parameter fails here.
"""

from __future__ import annotations

import ast
import inspect
import typing
from typing import Any

import pytest

import nodus
import nodus.agent

# Copied from document 000 (nodus.agent), one line per documented callable, as written there.
_SIGNATURES: dict[str, str] = {
    "Agent": (
        "class Agent(name: str, *, image: Any = None, source: str | Path | dict[str, Any] | None = None, "
        "entrypoint: str | None = None, setup: str | None = None, secrets: list[Any] | None = None, "
        "env: dict[str, str] | None = None, network: _spec.Egress | None = None, models: list[str] | None "
        "= None, min_workers: int | None = None, max_workers: int | None = None, scaledown_window: Any = "
        "None, per_run_max_cost: Any = None, max_cost: Any = None, cpu: Any = None, memory: Any = None, "
        "app: Any = None, project: str | None = None) -> None"
    ),
    "Agent.deploy": "deploy() -> View",
    "Agent.entrypoint": "entrypoint(fn: Callable[..., Any]) -> Callable[..., Any]",
    "Agent.from_name": "from_name(name: str, project: str | None = None) -> _Agent",
    "Agent.local": "local(input: Any = None) -> Any",
    "Agent.map": (
        "map(inputs: Iterable[Any], *, max_active: int | None = None, order_outputs: bool = True, "
        "return_exceptions: bool = False) -> AsyncIterator[Any]"
    ),
    "Agent.remote": "remote(input: Any = None, **kwargs: Any) -> Any",
    "Agent.spawn": "spawn(input: Any = None, **kwargs: Any) -> _AgentRun",
    "Agent.step": (
        "step(_fn: Callable[..., Any] | None = None, *, effect: str = 'pure', name: str | None = None) -> Any"
    ),
    "Agent.submit": (
        "submit(input: Any = None, *, idempotency_key: str | None = None, session_key: str | None = None, "
        "deadline: str | None = None, group: str | None = None, hold_worker: str | None = None, "
        "name: str | None = None) -> _AgentRun"
    ),
    "AgentGroup": "class AgentGroup(obj: Obj) -> None",
    "AgentGroup.cancel": "cancel() -> None",
    "AgentGroup.create": (
        "create(name: str, agent: _Agent | str, *, max_active: int | None = None, max_pending: int | None "
        "= None, max_held: int | None = None, max_cost: Any = None, evaluation: dict[str, Any] | None = "
        "None, project: str | None = None) -> _AgentGroup"
    ),
    "AgentGroup.delete": "delete() -> None",
    "AgentGroup.from_name": "from_name(name: str, project: str | None = None) -> _AgentGroup",
    "AgentGroup.results": "results() -> list[View]",
    "AgentGroup.runs": "runs() -> list[_AgentRun]",
    "AgentGroup.seal": "seal() -> None",
    "AgentGroup.submit_many": "submit_many(tasks: list[dict[str, Any]]) -> list[_AgentRun]",
    "AgentGroup.wait": "wait(timeout: float | None = None) -> View",
    "AgentRun": "class AgentRun(obj: Obj) -> None",
    "AgentRun.answer": "answer() -> str",
    "AgentRun.cancel": "cancel() -> None",
    "AgentRun.children": "children() -> list[_AgentRun]",
    "AgentRun.from_name": "from_name(name: str, project: str | None = None) -> _AgentRun",
    "AgentRun.logs": "logs(follow: bool = False) -> AsyncIterator[str]",
    "AgentRun.resolve": (
        "resolve(step_id: str, decision: str, evidence: dict[str, str] | None = None, result: Any = None, "
        "checkpoint_seq: int | None = None, expected_revision: int | None = None) -> View"
    ),
    "AgentRun.result": "result() -> str",
    "AgentRun.resume": "resume() -> None",
    "AgentRun.retry": "retry() -> None",
    "AgentRun.send": "send(name: str, payload: Any, message_key: str | None = None) -> View",
    "AgentRun.steps": "steps() -> list[View]",
    "AgentRun.suspend": "suspend() -> None",
    "AgentRun.wait": "wait(timeout: float | None = None) -> View",
    "RunContext.child_output": "child_output(child: Any, name: str) -> Any",
    "RunContext.continue_as_new": "continue_as_new(input: Any) -> None",
    "RunContext.gather": "gather(children: list[Any], return_exceptions: bool = False) -> list[Any]",
    "RunContext.map": "map(inputs: Iterable[Any]) -> list[Any]",
    "RunContext.save_output": "save_output(name: str, path: str) -> None",
    "RunContext.send": "send(target: str, name: str, payload: Any) -> None",
    "RunContext.sleep": "sleep(duration: str | float) -> None",
    "RunContext.sleep_until": "sleep_until(time: str) -> None",
    "RunContext.spawn": (
        "spawn(input: Any, key: str, permissions: Any = None, deadline: str | None = None) -> Any"
    ),
    "RunContext.step": "step(name: str, fn: Callable[[], Any], effect: str = 'pure') -> Any",
    "RunContext.wait_for_message": "wait_for_message(name: str, timeout: str | float | None = None) -> Any",
}

# The attributes 000 lists ("Type: ..."): each exists on the class (a property, or an annotation).
_ATTRIBUTES = (
    "Agent.name",
    "AgentGroup.name",
    "AgentRun.name",
    "AgentRun.outputs",
    "RunContext.idempotency_key",
    "RunContext.state_dir",
)
_CLASSES = ("Agent", "AgentGroup", "AgentRun", "RunContext")

# Parameters the SDK adds after 000's (keyword-only, with a default), and why.
_CLIENT = "an explicit HTTP client instead of one from the environment (tests, several servers)"
_LABELS = "the runs' metadata.labels, which label selectors find among thousands (issue 20, decision 61)"
_SELECTS = "selects the runs on the server by labels and phase (issue 20, decision 61)"
_EXTRAS: dict[str, dict[str, str]] = {
    "Agent": {"client": _CLIENT},
    "Agent.from_name": {"client": _CLIENT},
    "Agent.local": {
        "messages": "answers ctx.wait_for_message in a local run",
        "outputs_dir": "where a local run's saved outputs go",
    },
    "Agent.submit": {
        "keep_alive": "documents 001 and 002 submit keep-alive runs: submit(..., keep_alive=True)",
        "labels": _LABELS,
    },
    "Agent.map": {"labels": _LABELS},
    "AgentGroup.runs": {"labels": _SELECTS, "phase": _SELECTS},
    "AgentGroup": {"project": "the project of a handle made from a resource", "client": _CLIENT},
    "AgentGroup.create": {"client": _CLIENT},
    "AgentGroup.from_name": {"client": _CLIENT},
    "AgentRun": {"project": "the project of a handle made from a resource", "client": _CLIENT},
    "AgentRun.from_name": {"client": _CLIENT},
}

_KINDS = {
    "posonly": inspect.Parameter.POSITIONAL_ONLY,
    "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
    "vararg": inspect.Parameter.VAR_POSITIONAL,
    "kwonly": inspect.Parameter.KEYWORD_ONLY,
    "kwarg": inspect.Parameter.VAR_KEYWORD,
}
_NO_DEFAULT = inspect.Parameter.empty


def documented(line: str) -> list[tuple[str, inspect._ParameterKind, Any]]:
    """``(name, kind, default)`` of each parameter a 000 signature line lists, parsed with `ast`."""
    text = line.removeprefix("class ")
    name, _, rest = text.partition("(")
    arguments = rest[: rest.rindex(")")]
    tree = ast.parse(f"def {name}({arguments}): pass")
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    spec = function.args
    out: list[tuple[str, inspect._ParameterKind, Any]] = []
    positional = [*spec.posonlyargs, *spec.args]
    defaults = [_NO_DEFAULT] * (len(positional) - len(spec.defaults)) + [
        ast.literal_eval(d) for d in spec.defaults
    ]
    for arg, default in zip(positional, defaults, strict=True):
        kind = _KINDS["posonly"] if arg in spec.posonlyargs else _KINDS["args"]
        out.append((arg.arg, kind, default))
    if spec.vararg is not None:
        out.append((spec.vararg.arg, _KINDS["vararg"], _NO_DEFAULT))
    for arg, kw_default in zip(spec.kwonlyargs, spec.kw_defaults, strict=True):
        value = _NO_DEFAULT if kw_default is None else ast.literal_eval(kw_default)
        out.append((arg.arg, _KINDS["kwonly"], value))
    if spec.kwarg is not None:
        out.append((spec.kwarg.arg, _KINDS["kwarg"], _NO_DEFAULT))
    return out


def _target(name: str) -> Any:
    owner, _, member = name.partition(".")
    cls = getattr(nodus.agent, owner)
    return getattr(cls, member) if member else cls


def actual(name: str) -> list[tuple[str, inspect._ParameterKind, Any]]:
    """The SDK's parameters of ``name``, ``self`` left out as 000 leaves it out."""
    target = _target(name)
    parameters = list(inspect.signature(target).parameters.values())
    owner, _, member = name.partition(".")
    if member and not isinstance(inspect.getattr_static(getattr(nodus.agent, owner), member), classmethod):
        assert parameters and parameters[0].name == "self", name
        parameters = parameters[1:]
    return [(p.name, p.kind, p.default) for p in parameters]


def test_the_reference_is_the_whole_nodus_agent_module() -> None:
    for cls in _CLASSES:
        assert hasattr(nodus.agent, cls), f"nodus.agent.{cls} is missing"
        assert getattr(nodus.agent, cls) is getattr(nodus, cls), cls
        assert cls in nodus.agent.__all__, cls


@pytest.mark.parametrize("name", sorted(_SIGNATURES))
def test_each_documented_callable_has_the_documented_signature(name: str) -> None:
    expected = documented(_SIGNATURES[name])
    found = actual(name)
    assert found[: len(expected)] == expected, f"{name}: 000 says {expected}, the SDK has {found}"
    extras = found[len(expected) :]
    allowed = _EXTRAS.get(name, {})
    for extra, kind, default in extras:
        assert extra in allowed, f"{name}: parameter {extra!r} is not in 000 (list it in _EXTRAS, with why)"
        assert kind == inspect.Parameter.KEYWORD_ONLY and default is not _NO_DEFAULT, (
            f"{name}: the added {extra!r} must be keyword-only with a default, so 000's calls still work"
        )
    assert not set(allowed) - {extra for extra, _, _ in extras}, f"{name}: stale _EXTRAS entries"


@pytest.mark.parametrize("name", _ATTRIBUTES)
def test_each_documented_attribute_exists(name: str) -> None:
    owner, _, attribute = name.partition(".")
    cls = getattr(nodus.agent, owner)
    hints = typing.get_type_hints(cls) if owner == "RunContext" else {}
    annotated = any(attribute in getattr(klass, "__annotations__", {}) for klass in cls.__mro__)
    assert hasattr(cls, attribute) or annotated or attribute in hints, f"{name} is missing"


def test_every_documented_member_of_each_class_is_checked() -> None:
    """What this file checks is what 000 lists: no class member of 000 slips through untested."""
    members = {name for name in _SIGNATURES if "." in name} | set(_ATTRIBUTES)
    for cls in _CLASSES:
        for name in (m for m in members if m.startswith(f"{cls}.")):
            assert hasattr(getattr(nodus.agent, cls), name.partition(".")[2]) or name in _ATTRIBUTES, name


def test_the_parser_reads_kinds_and_defaults() -> None:
    """The comparison is only as good as the parse: a line with every kind, read back."""
    parsed = documented("f(a: int, b: str = 'x', *rest: Any, c: bool = True, d: int, **more: Any) -> None")
    assert parsed == [
        ("a", inspect.Parameter.POSITIONAL_OR_KEYWORD, _NO_DEFAULT),
        ("b", inspect.Parameter.POSITIONAL_OR_KEYWORD, "x"),
        ("rest", inspect.Parameter.VAR_POSITIONAL, _NO_DEFAULT),
        ("c", inspect.Parameter.KEYWORD_ONLY, True),
        ("d", inspect.Parameter.KEYWORD_ONLY, _NO_DEFAULT),
        ("more", inspect.Parameter.VAR_KEYWORD, _NO_DEFAULT),
    ]
