"""``nodus/python-fix@1.0.0``: fix the bugs in a small Python module; hidden tests grade the file.

Each task seeds the agent's workspace with one module (``calc.py``, ...) of 2-4 small
functions, 1-2 of them with a planted bug (a wrong operator, an off-by-one range, a wrong
comparison, ...), drawn from templates by the seeded RNG. The prompt describes what every
function should do. The hidden answer holds the test calls with their expected ``repr`` and
the fully fixed source (``"solution"``, so tests can script a correct agent).

How grading stays honest
------------------------
The agent's code is untrusted, so it only runs in a sandbox (``GradingWorkspace.run``), and
the *expected values never enter that sandbox*: a check script there calls each function on
the hidden inputs and prints what the calls returned; the grader compares those with the
expected values in its own process. Code that tampers with the check can therefore only
misreport its own results, which cannot make a wrong function pass. More precisely:

* the check script runs with ``python3 -I -S`` (read from stdin), so files the agent planted (``json.py``,
  ``sitecustomize.py``) are never imported by it;
* the agent's module is imported only in child processes (one to check that it imports, one
  per function), each with its own timeout, so a hanging or crashing function costs only its
  own checks;
* a per-grade random marker tells the check's lines apart from anything else in the output.
  The check prints ``<marker> started`` before any agent code runs: without it the sandbox
  itself failed (GraderError, unscored); with it but without a summary, the agent's code
  stopped the check (a ``fail``, so an agent cannot dodge a score by killing the checker).
"""

from __future__ import annotations

import json
import random
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from nodus_ray.environments.base import Environment, Grade, GraderError, Task
from nodus_ray.environments.workspace import GradingWorkspace
from nodus_ray.sandbox import CommandResult

__all__ = ["PythonFix"]

_MODULES = ("calc", "mathkit", "toolbox", "helpers")
_CASES_PER_FUNCTION = 4
_MAX_ATTEMPTS = 200
_CASE_ATTEMPTS = 30
_REPR_CAP = 300  # longer reprs are cut: expected values are short, so a cut one never matches
_WORDS = ("apple", "Orange", "sky", "tree", "Ocean", "rhythm", "idea", "UMBRELLA", "cat", "queue", "Eel")

Args = tuple[Any, ...]


@dataclass(frozen=True)
class _Template:
    """One function: its correct source, the bugs it can carry, and inputs for hidden checks."""

    name: str
    signature: str
    description: str  # what the prompt says the function does
    source: str  # the correct definition
    bugs: tuple[tuple[str, str], ...]  # (correct text, buggy text): one replacement in ``source``
    inputs: Callable[[random.Random], Args]

    def buggy(self, index: int) -> str:
        old, new = self.bugs[index]
        return self.source.replace(old, new, 1)


def _ints(rng: random.Random, low: int, high: int, smallest: int, largest: int) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(smallest, largest))]


def _clamp_inputs(rng: random.Random) -> Args:
    low = rng.randint(-10, 10)
    high = low + rng.randint(1, 20)
    x = rng.choice((low - rng.randint(1, 9), high + rng.randint(1, 9), rng.randint(low, high)))
    return (x, low, high)


def _count_above_inputs(rng: random.Random) -> Args:
    values = _ints(rng, 0, 20, 3, 7)
    return (values, rng.choice(values) if rng.random() < 0.6 else rng.randint(0, 20))


def _text_inputs(rng: random.Random) -> Args:
    return (" ".join(rng.sample(_WORDS, rng.randint(2, 5))),)


_TEMPLATES: tuple[_Template, ...] = (
    _Template(
        "total",
        "values",
        "returns the sum of all numbers in the list `values` (0 for an empty list)",
        "def total(values):\n"
        "    result = 0\n"
        "    for i in range(len(values)):\n"
        "        result += values[i]\n"
        "    return result\n",
        (
            ("range(len(values))", "range(1, len(values))"),
            ("range(len(values))", "range(len(values) - 1)"),
            ("result += values[i]", "result -= values[i]"),
        ),
        lambda rng: (_ints(rng, -20, 50, 2, 6),),
    ),
    _Template(
        "clamp",
        "x, low, high",
        "returns `x` limited to the range `low`..`high`: `low` when `x` is below `low`, `high` when "
        "`x` is above `high`, otherwise `x` itself",
        "def clamp(x, low, high):\n"
        "    if x < low:\n"
        "        return low\n"
        "    if x > high:\n"
        "        return high\n"
        "    return x\n",
        (
            ("if x < low:", "if x > low:"),
            ("if x > high:", "if x < high:"),
            ("        return high\n", "        return low\n"),
        ),
        _clamp_inputs,
    ),
    _Template(
        "count_above",
        "values, limit",
        "returns how many numbers in the list `values` are strictly greater than `limit`",
        "def count_above(values, limit):\n"
        "    count = 0\n"
        "    for value in values:\n"
        "        if value > limit:\n"
        "            count += 1\n"
        "    return count\n",
        (("if value > limit:", "if value >= limit:"), ("if value > limit:", "if value < limit:")),
        _count_above_inputs,
    ),
    _Template(
        "factorial",
        "n",
        "returns n factorial, the product of the integers 1 to `n` (1 when `n` is 0)",
        "def factorial(n):\n"
        "    result = 1\n"
        "    for i in range(1, n + 1):\n"
        "        result *= i\n"
        "    return result\n",
        (("range(1, n + 1)", "range(1, n)"), ("result *= i", "result += i")),
        lambda rng: (rng.randint(0, 10),),
    ),
    _Template(
        "is_even",
        "n",
        "returns `True` when the integer `n` is even, otherwise `False`",
        "def is_even(n):\n    return n % 2 == 0\n",
        (("n % 2 == 0", "n % 2 == 1"), ("n % 2 == 0", "n // 2 == 0")),
        lambda rng: (rng.randint(-50, 50),),
    ),
    _Template(
        "largest",
        "values",
        "returns the largest number in the non-empty list `values`",
        "def largest(values):\n"
        "    best = values[0]\n"
        "    for value in values[1:]:\n"
        "        if value > best:\n"
        "            best = value\n"
        "    return best\n",
        (("if value > best:", "if value < best:"), ("values[1:]", "values[2:]")),
        lambda rng: (_ints(rng, -30, 30, 2, 6),),
    ),
    _Template(
        "rectangle_area",
        "width, height",
        "returns the area of a rectangle `width` wide and `height` high",
        "def rectangle_area(width, height):\n    return width * height\n",
        (("width * height", "width + height"), ("width * height", "width * width")),
        lambda rng: (rng.randint(1, 30), rng.randint(1, 30)),
    ),
    _Template(
        "sum_of_squares",
        "n",
        "returns the sum of the squares of the integers 1 to `n` (0 when `n` is 0)",
        "def sum_of_squares(n):\n"
        "    result = 0\n"
        "    for i in range(1, n + 1):\n"
        "        result += i * i\n"
        "    return result\n",
        (("result += i * i", "result += i + i"), ("range(1, n + 1)", "range(1, n)")),
        lambda rng: (rng.randint(0, 12),),
    ),
    _Template(
        "difference",
        "a, b",
        "returns `a` minus `b`",
        "def difference(a, b):\n    return a - b\n",
        (("a - b", "b - a"), ("a - b", "a + b")),
        lambda rng: (rng.randint(-50, 50), rng.randint(-50, 50)),
    ),
    _Template(
        "count_vowels",
        "text",
        "returns how many characters of `text` are vowels (a, e, i, o, u, in upper or lower case)",
        "def count_vowels(text):\n"
        "    count = 0\n"
        "    for char in text.lower():\n"
        '        if char in "aeiou":\n'
        "            count += 1\n"
        "    return count\n",
        (
            ("for char in text.lower():", "for char in text:"),
            ('if char in "aeiou":', 'if char not in "aeiou":'),
        ),
        _text_inputs,
    ),
    _Template(
        "average",
        "values",
        "returns the arithmetic mean of the non-empty list `values`, as a float",
        "def average(values):\n    return sum(values) / len(values)\n",
        (
            ("sum(values) / len(values)", "sum(values) // len(values)"),
            ("sum(values) / len(values)", "sum(values) / (len(values) - 1)"),
        ),
        lambda rng: (_ints(rng, 0, 40, 2, 6),),
    ),
    _Template(
        "reverse_words",
        "text",
        "returns the words of `text` in reverse order, joined by single spaces",
        'def reverse_words(text):\n    words = text.split()\n    return " ".join(words[::-1])\n',
        (("words[::-1]", "words[-2::-1]"), ('" ".join', '"".join')),
        _text_inputs,
    ),
)

for _template in _TEMPLATES:  # a template typo would silently plant no bug
    for _old, _new in _template.bugs:
        assert _template.source.count(_old) >= 1 and _old != _new, (_template.name, _old)


def _call_text(name: str, args: Args) -> str:
    return f"{name}({', '.join(repr(arg) for arg in args)})"


def _results(source: str, name: str, calls: list[Args]) -> list[str | None]:
    """What our own (trusted, generated) definition returns for each call, as repr; None if it raises."""
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<{name}>", "exec"), namespace)  # noqa: S102 - our templates only
    function = namespace[name]
    out: list[str | None] = []
    for args in calls:
        try:
            out.append(repr(function(*args)))
        except Exception:  # noqa: BLE001 - a planted bug may raise (IndexError, ...)
            out.append(None)
    return out


_HEADER = '"""Small helper functions."""\n'


def _module_text(definitions: list[str]) -> str:
    return _HEADER + "\n\n" + "\n\n".join(definitions)


def _function_name(call: str) -> str:
    return call.split("(", 1)[0]


def _safe_word(text: Any) -> str:
    """An exception name from the agent's code, reduced to something safe to quote."""
    word = re.sub(r"[^A-Za-z0-9_.]", "", str(text))[:60]
    return word or "an exception"


class PythonFix(Environment):
    """Fix the planted bugs of a small module in place; hidden checks call every function."""

    owner: ClassVar[str] = "nodus"
    name: ClassVar[str] = "python-fix"
    version: ClassVar[str] = "1.0.0"
    description: ClassVar[str] = (
        "Fix a small Python module in place: 2-4 functions, 1-2 with a planted bug. Graded by hidden "
        "checks run in a sandbox; the reward is the share of checks passed."
    )
    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    import_timeout: ClassVar[float] = 10.0  # seconds for the module to import
    call_timeout: ClassVar[float] = 10.0  # seconds for one function's checks

    # -- tasks ------------------------------------------------------------------------------

    def tasks(self, split: str, seed: int, count: int) -> list[Task]:
        self.check_request(split, seed, count)
        return [self._task(split, seed, index) for index in range(count)]

    def _task(self, split: str, seed: int, index: int) -> Task:
        for attempt in range(_MAX_ATTEMPTS):
            rng = self.task_random(split, seed, index, attempt)
            task = self._candidate(rng, self.task_id(split, index), split)
            if task is not None:
                return task
        raise RuntimeError(f"{self.ref}: no task found for {split}/{seed}/{index}")  # pragma: no cover

    def _candidate(self, rng: random.Random, task_id: str, split: str) -> Task | None:
        """A task from this RNG, or None when it belongs to the other split or a bug would go unseen."""
        chosen = rng.sample(_TEMPLATES, rng.randint(2, 4))
        bugged = set(rng.sample(range(len(chosen)), rng.randint(1, min(2, len(chosen)))))
        module = rng.choice(_MODULES) + ".py"
        seeded: list[str] = []
        for position, template in enumerate(chosen):
            bug = rng.randrange(len(template.bugs)) if position in bugged else None
            seeded.append(template.source if bug is None else template.buggy(bug))
        seeded_text = _module_text(seeded)
        if not self.in_split(split, seeded_text):
            return None
        cases: list[tuple[str, str]] = []
        for template, definition in zip(chosen, seeded, strict=True):
            found = self._cases(rng, template, definition)
            if found is None:
                return None
            cases += found
        lines = "\n".join(f"- `{t.name}({t.signature})`: {t.description}." for t in chosen)
        prompt = (
            f"The Python module `{module}` in your workspace has bugs: some of its functions do not do "
            f"what they should. Fix the file in place so that every function behaves as described below, "
            f"keeping the module's name and each function's name and parameters.\n\n{lines}\n\n"
            f"Hidden tests will import `{module}` and call these functions."
        )
        answer = {
            "module": module,
            "cases": tuple(cases),
            "solution": _module_text([t.source for t in chosen]),
        }
        return Task(id=task_id, prompt=prompt, files={module: seeded_text}, answer=answer)

    @staticmethod
    def _cases(rng: random.Random, template: _Template, seeded: str) -> list[tuple[str, str]] | None:
        """Hidden checks for one function; a bugged one must fail at least one of them."""
        for _ in range(_CASE_ATTEMPTS):
            calls = [template.inputs(rng) for _ in range(_CASES_PER_FUNCTION)]
            if len({_call_text(template.name, args) for args in calls}) < len(calls):
                continue  # each check should test something new
            expected = _results(template.source, template.name, calls)
            if any(value is None for value in expected):
                continue  # pragma: no cover - the templates' inputs are always valid
            if seeded != template.source and _results(seeded, template.name, calls) == expected:
                continue  # the planted bug would pass every check
            return [
                (_call_text(template.name, args), str(value))
                for args, value in zip(calls, expected, strict=True)
            ]
        return None

    # -- grading ----------------------------------------------------------------------------

    def grade(self, task: Task, answer: str, workspace: GradingWorkspace) -> Grade:
        module: str = task.answer["module"]
        cases: list[tuple[str, str]] = [(str(call), str(value)) for call, value in task.answer["cases"]]
        if workspace.read_text(module) is None:
            if workspace.exists(module):
                return Grade("invalid", 0.0, f"{module} is not a regular file inside the workspace")
            return Grade("invalid", 0.0, f"{module} is missing from the workspace")

        groups: dict[str, list[tuple[str, str]]] = {}
        for call, expected in cases:
            groups.setdefault(_function_name(call), []).append((call, expected))
        marker = secrets.token_hex(8)
        script = f".nodus_grader_check_{marker}.py"
        data = {
            "marker": marker,
            "script": script,
            "module": module.removesuffix(".py"),
            "groups": [[call for call, _ in calls] for calls in groups.values()],  # inputs only
            "import_timeout": self.import_timeout,
            "call_timeout": self.call_timeout,
            "repr_cap": _REPR_CAP,
        }
        workspace.write_text(script, _CHECK_SCRIPT.replace("__DATA__", repr(json.dumps(data))))
        budget = self.import_timeout + self.call_timeout * len(groups) + 20.0
        # From stdin, not by name: Python opens a script by its absolute path, which the process
        # fallback's dropped uid cannot reach when a parent directory is private to root.
        result = workspace.run(f"python3 -I -S - < {script}", timeout=budget)
        summary = _summary(result, marker)
        if summary is None:
            return Grade(
                "fail",
                0.0,
                f"the hidden checks did not finish: the check {_how(result)} (the "
                f"module's code stopped or flooded the checker)",
            )

        imported = summary.get("import")
        status: dict[str, Any] = imported if isinstance(imported, dict) else {}
        if status.get("status") != "ok":
            if status.get("status") == "error":
                why = f"{module} does not import: {_safe_word(status.get('error', ''))}"
                line = status.get("line")
                if isinstance(line, int) and not isinstance(line, bool):
                    why += f" at line {line}"
                return Grade("invalid", 0.0, why)
            if status.get("status") == "timeout":
                return Grade(
                    "invalid", 0.0, f"importing {module} did not finish within {self.import_timeout:g}s"
                )
            return Grade("invalid", 0.0, f"{module} does not import: importing it ended the process")

        # The check reports in its own order (function by function); compare position by position.
        ordered = [(call, expected) for calls in groups.values() for call, expected in calls]
        reported = summary.get("results")
        if not isinstance(reported, list) or len(reported) != len(ordered):
            return Grade(
                "fail",
                0.0,
                "the hidden checks did not report their results (the module's code "
                "interfered with the checker)",
            )
        passed = 0
        failing: dict[str, str] = {}
        for (call, expected), entry in zip(ordered, reported, strict=True):
            kind, value = (list(entry) + [None, None])[:2] if isinstance(entry, list) else (None, None)
            if kind == "ok" and value == expected:
                passed += 1
                continue
            note = {"missing": "missing", "timeout": "timed out", "crash": "crashed"}.get(str(kind), "")
            if kind == "raised":
                note = f"raised {_safe_word(value)}"
            name = _function_name(call)
            if not failing.get(name):
                failing[name] = note
        total = len(ordered)
        evidence = f"{passed} of {total} hidden checks passed"
        if failing:
            evidence += "; failing: " + ", ".join(
                f"{n} ({note})" if note else n for n, note in failing.items()
            )
        if passed == total:
            return Grade("pass", 1.0, evidence)
        if passed == 0:
            return Grade("fail", 0.0, evidence)
        return Grade("partial", passed / total, evidence)


def _how(result: CommandResult) -> str:
    if result.timed_out:
        return f"timed out after {result.duration_seconds:.0f}s"
    if result.exit_code is None:
        return f"was killed ({result.limit or 'stopped'})"
    return f"exited with code {result.exit_code}"


def _summary(result: CommandResult, marker: str) -> dict[str, Any] | None:
    """The check's summary; None when it started but left none; GraderError when it never started.

    No start line means no agent code ran yet: the sandbox itself failed (unscored). Started
    but no usable summary means the agent's code stopped or flooded the checker (graded).
    """
    lines = result.output.splitlines()
    if f"{marker} started" not in (line.strip() for line in lines):
        tail = " ".join(result.output.split())[-200:]
        raise GraderError(
            f"the check could not start in the sandbox: it {_how(result)}" + (f": {tail}" if tail else "")
        )
    prefix = f"{marker} summary "
    for line in reversed(lines):
        if line.startswith(prefix):
            try:
                summary = json.loads(line[len(prefix) :])
            except ValueError:
                return None
            return summary if isinstance(summary, dict) else None
    return None


# The check, run in the sandbox as ``python3 -I -S - < <file>``. It holds the hidden *inputs* only
# (never expected values) and must run on any python3 >= 3.8 the host has.
_CHECK_SCRIPT = r'''
import json
import os
import signal
import stat
import subprocess
import sys

DATA = json.loads(__DATA__)
MARKER = DATA["marker"]
RESULT_CAP = 1 << 20

CHILD = """
import json, sys

def main():
    module_name, out_path, calls, cap = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])

    def write(obj):
        with open(out_path, "w") as handle:
            handle.write(json.dumps(obj))

    # Loaded from its relative path rather than imported through sys.path: the import system
    # works with absolute paths, which a dropped uid cannot reach below a root-private directory.
    sys.path.insert(0, "")  # best effort, for modules the agent split the file into
    sys.dont_write_bytecode = True
    filename = module_name + ".py"
    try:
        import types
        with open(filename, "rb") as handle:
            source = handle.read()
        module = types.ModuleType(module_name)
        module.__file__ = filename
        sys.modules[module_name] = module
        exec(compile(source, filename, "exec"), module.__dict__)
    except BaseException as exc:
        line = exc.lineno if isinstance(exc, SyntaxError) else None
        write({"ok": False, "error": type(exc).__name__, "line": line})
        return
    values = []
    for call in calls:
        name = call.split("(", 1)[0]
        try:
            function = getattr(module, name, None)
            if not callable(function):
                values.append(["missing", None])
                continue
            text = repr(eval(call, {"__builtins__": __builtins__, name: function}))
            if not isinstance(text, str):
                raise TypeError("repr")
        except BaseException as exc:
            values.append(["raised", type(exc).__name__])
            continue
        if len(text) > cap:
            text = text[:cap] + "...(cut)"
        values.append(["ok", text])
    write({"ok": True, "values": values})

main()
"""


def remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def read_json(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, RESULT_CAP)
        return json.loads(raw.decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def run_child(calls, timeout):
    """("done", data), ("timeout", None) or ("crash", None)."""
    out = ".nodus_result_" + MARKER + ".json"
    remove(out)
    argv = [sys.executable, "-I", "-S", "-c", CHILD, DATA["module"], out, json.dumps(calls),
            str(DATA["repr_cap"])]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return "crash", None
    status = "done"
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        status = "timeout"
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # and whatever the module started
    except OSError:
        pass
    proc.wait()
    data = read_json(out) if status == "done" else None
    remove(out)
    if status == "done" and not isinstance(data, dict):
        status = "crash"
    return status, data


def main():
    remove(DATA["script"])
    print(MARKER + " started", flush=True)
    summary = {"import": None, "results": []}
    status, data = run_child([], DATA["import_timeout"])
    if status != "done":
        summary["import"] = {"status": status}
    elif not data.get("ok"):
        line = data.get("line")
        summary["import"] = {"status": "error", "error": str(data.get("error"))[:80],
                             "line": line if isinstance(line, int) else None}
    else:
        summary["import"] = {"status": "ok"}
        for calls in DATA["groups"]:
            status, data = run_child(calls, DATA["call_timeout"])
            values = data.get("values") if status == "done" and data.get("ok") else None
            if not isinstance(values, list) or len(values) != len(calls):
                summary["results"] += [[status if status != "done" else "crash", None]] * len(calls)
                continue
            for value in values:
                ok = (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
                      and (value[1] is None or isinstance(value[1], str)))
                summary["results"].append(value if ok else ["crash", None])
    print(MARKER + " summary " + json.dumps(summary), flush=True)


main()
'''
