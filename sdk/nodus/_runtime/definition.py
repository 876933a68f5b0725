"""What one Agent's Python program is: its entrypoint and its steps, and where a step call goes.

`ProgramDefinition` is what ``nodus.Agent`` keeps for ``@agent.entrypoint`` and
``@agent.step``. A decorated step asks the *active runtime* (the bootstrap's inside a sandbox,
`run_local`'s in ``Agent.local``) to run it as a journaled step; with no runtime active (a
script importing its own agent, a test) a step is a plain function call, as document 000 says.
A step called while another step runs is a plain call too: the outer step's recorded result
already covers what the inner one did.

The active runtime is looked up per call: a context variable first (`run_local`, which may
nest for children run in-process), then the process's runtime (the bootstrap's, one per
sandbox process, so threads the program starts see it too).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast, overload

from ..errors import Invalid

__all__ = [
    "EFFECTS",
    "ProgramDefinition",
    "Runtime",
    "StopImport",
    "active_runtime",
    "activate",
    "set_process_runtime",
    "guard_client_call",
    "check_effect",
]

EFFECTS = ("pure", "idempotent", "external")

F = TypeVar("F", bound=Callable[..., Any])


class Runtime(Protocol):
    """What a step call needs from the runtime that journals it."""

    @property
    def in_step(self) -> bool: ...

    def run_step(self, name: str, fn: Callable[[], Any], effect: str) -> Any: ...

    async def run_step_async(self, name: str, fn: Callable[[], Awaitable[Any]], effect: str) -> Any: ...


class StopImport(BaseException):
    """Raised by a client-side call (``agent.deploy()``, ``agent.submit()``) while the bootstrap
    imports the entrypoint's module: a script that deploys and submits itself at module level is
    also the program, so its import stops there, with the entrypoint and steps above defined.

    A BaseException so ``except Exception`` in the script does not swallow it."""


_LOCAL: contextvars.ContextVar[Runtime | None] = contextvars.ContextVar("nodus_runtime", default=None)
_process_runtime: Runtime | None = None
_importing_program = False


def active_runtime() -> Runtime | None:
    """The runtime a step call goes to now, or None (a plain call)."""
    return _LOCAL.get() or _process_runtime


def set_process_runtime(runtime: Runtime | None, *, importing: bool = False) -> None:
    """The bootstrap's runtime, for every thread of the program's process. ``importing`` says
    the bootstrap is importing the entrypoint's module (see `guard_client_call`)."""
    global _process_runtime, _importing_program
    _process_runtime = runtime
    _importing_program = importing


@contextmanager
def activate(runtime: Runtime) -> Iterator[None]:
    """Make ``runtime`` the active one in this context (`run_local`, possibly nested)."""
    token = _LOCAL.set(runtime)
    try:
        yield
    finally:
        _LOCAL.reset(token)


def guard_client_call(what: str) -> None:
    """For ``nodus.Agent``'s client-side calls (``deploy``, ``submit``, ``remote``, ``local``...).

    While the bootstrap imports the program's module this stops the import (`StopImport`);
    inside a running program it refuses: a run cannot deploy or submit through the API (it has
    no route to it), it spawns children with ``ctx.spawn``. Outside a run it does nothing."""
    if _importing_program:
        raise StopImport(what)
    if _process_runtime is not None:
        raise RuntimeError(f"Agent.{what}() cannot be called inside a run; use ctx.spawn() for child runs")


def check_effect(effect: str) -> str:
    if effect not in EFFECTS:
        raise ValueError(f"effect must be pure, idempotent or external, not {effect!r}")
    return effect


class ProgramDefinition:
    """One Agent's program: the entrypoint ``fn(ctx, input)`` and its steps."""

    def __init__(self) -> None:
        self.entrypoint_fn: Callable[..., Any] | None = None
        self.steps: dict[str, Callable[..., Any]] = {}

    def entrypoint(self, fn: F) -> F:
        """Register ``fn(ctx, input)`` as the run entrypoint; ``fn`` stays callable unchanged."""
        if not callable(fn):
            raise TypeError("entrypoint takes a function fn(ctx, input)")
        self.entrypoint_fn = fn
        return fn

    @overload
    def step(self, _fn: F, *, effect: str = "pure", name: str | None = None) -> F: ...

    @overload
    def step(
        self, _fn: None = None, *, effect: str = "pure", name: str | None = None
    ) -> Callable[[F], F]: ...

    def step(
        self, _fn: Callable[..., Any] | None = None, *, effect: str = "pure", name: str | None = None
    ) -> Any:
        """``@step`` or ``@step(effect=..., name=...)``: journal each call as a step in a run."""
        check_effect(effect)
        if name is not None and (not isinstance(name, str) or not name or len(name) > 200):
            raise ValueError("a step's name must be a non-empty string of at most 200 characters")

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            step_name: str = name or str(getattr(fn, "__name__", "step"))
            wrapper: Callable[..., Any]
            if inspect.iscoroutinefunction(fn):

                @functools.wraps(fn)
                async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                    runtime = active_runtime()
                    if runtime is None or runtime.in_step:
                        return await fn(*args, **kwargs)
                    return await runtime.run_step_async(step_name, lambda: fn(*args, **kwargs), effect)

                wrapper = async_wrapper
            else:

                @functools.wraps(fn)
                def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                    runtime = active_runtime()
                    if runtime is None or runtime.in_step:
                        return fn(*args, **kwargs)
                    return runtime.run_step(step_name, lambda: fn(*args, **kwargs), effect)

                wrapper = sync_wrapper
            self.steps[step_name] = fn
            return wrapper

        if _fn is not None:
            return decorate(_fn)
        return decorate

    # -- what deploy uploads --------------------------------------------------------------------

    def _fn(self) -> Callable[..., Any]:
        if self.entrypoint_fn is None:
            raise Invalid(
                "the agent has no entrypoint: decorate a function with @agent.entrypoint",
                details={"field": "entrypoint"},
            )
        return self.entrypoint_fn

    def entrypoint_ref(self) -> str:
        """``"module:function"``; a script run as ``__main__`` is the module named by its file."""
        fn = self._fn()
        qualname = getattr(fn, "__qualname__", "")
        if "." in qualname or "<" in qualname:
            raise Invalid(
                f"the entrypoint {qualname} must be a function defined at the top level of its module",
                details={"field": "entrypoint"},
            )
        return f"{_module_name(fn)}:{fn.__name__}"

    def module_source(self) -> dict[str, str]:
        """The entrypoint's module file as the Agent's source: ``{"main.py": text}`` (a module
        ``pkg.mod`` is ``pkg/mod.py``, so the uploaded tree imports it by the same name)."""
        fn = self._fn()
        try:
            file = inspect.getsourcefile(fn)
        except TypeError:
            file = None
        if file is None or not Path(file).is_file():
            raise Invalid(
                "the entrypoint's module has no source file (defined interactively?): pass source=",
                details={"field": "source"},
            )
        module = _module_name(fn)
        path = Path(file)
        relative = (
            "/".join(module.split(".")[:-1] + ["__init__.py"])
            if path.name == "__init__.py"
            else "/".join(module.split(".")) + path.suffix
        )
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise Invalid(f"{path.name} is not UTF-8 text", details={"field": "source"}) from None
        return {relative: text}


def _module_name(fn: Callable[..., Any]) -> str:
    module = cast(str, getattr(fn, "__module__", "") or "")
    if module == "__main__" or not module:
        main = sys.modules.get("__main__")
        file = getattr(main, "__file__", None) or inspect.getsourcefile(fn)
        if not file:
            raise Invalid(
                "the entrypoint's module has no file to name it by", details={"field": "entrypoint"}
            )
        return Path(file).stem
    return module
