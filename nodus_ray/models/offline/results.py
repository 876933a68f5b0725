"""Tool results to the final answer: one sentence per command the offline model ran."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from nodus_ray.models.offline.messages import _tool_result_text
from nodus_ray.models.offline.shell import _COUNT_FILES_COMMAND, _short

__all__ = ["_summarize_results"]

_EXCERPT_LINES = 5  # lines of command output quoted in the final answer
_EXCERPT_CHARS = 400


_NO_OUTPUT_MARKER = "(no output)"  # what ``CommandResult.for_model`` writes when nothing was printed
_EXIT_RE = re.compile(r"^exit code (-?\d+)(?:\s*\([^)]*\))?\s*$", re.I)
_KILLED_RE = re.compile(r"^killed:\s*(.*)$", re.I)
_CREATED_RE = re.compile(r"^(?:mkdir -p \S+ && )?printf (?:'%s\\n' .+|'') > (?P<name>.+)$", re.S)


@dataclass(frozen=True)
class _Outcome:
    command: str | None
    exit_code: int | None  # None: killed, or no "exit code N" header
    killed: str | None
    output: str
    is_error: bool


def _parse_result(block: dict[str, Any], command: str | None) -> _Outcome:
    """Split ``exit code N`` / ``killed: why`` from the output that follows it.

    The sandbox writes ``(no output)`` in place of empty output; that marker becomes ``""``.
    """
    text = _tool_result_text(block)
    first, _, rest = text.partition("\n")
    rest = _without_no_output_marker(rest)
    exit_match, killed_match = _EXIT_RE.match(first.strip()), _KILLED_RE.match(first.strip())
    if exit_match:
        return _Outcome(command, int(exit_match.group(1)), None, rest, bool(block.get("is_error")))
    if killed_match:
        return _Outcome(command, None, killed_match.group(1).strip() or "no reason given", rest, True)
    return _Outcome(command, None, None, _without_no_output_marker(text), bool(block.get("is_error")))


def _without_no_output_marker(output: str) -> str:
    return "" if output.strip() == _NO_OUTPUT_MARKER else output


def _summarize_results(results: list[dict[str, Any]], tool_uses: list[dict[str, Any]]) -> str:
    commands = {block.get("id"): (block.get("input") or {}).get("command") for block in tool_uses}
    sentences = []
    for block in results:
        command = commands.get(block.get("tool_use_id"))
        sentences.append(_describe(_parse_result(block, command if isinstance(command, str) else None)))
    return "\n".join(sentences)


def _describe(outcome: _Outcome) -> str:
    """One sentence about one command's result: specific for known commands, generic otherwise."""
    label = f"The command `{_short(outcome.command)}`" if outcome.command else "The command"
    if outcome.killed is not None:
        return f"{label} was killed ({outcome.killed}) and {_printed(outcome.output)}"
    if outcome.exit_code is None:
        verb = "failed and" if outcome.is_error else "returned no exit code and"
        return f"{label} {verb} {_printed(outcome.output)}"
    if outcome.exit_code != 0 or outcome.is_error:
        return f"{label} failed with exit code {outcome.exit_code} and {_printed(outcome.output)}"
    specific = _describe_success(outcome.command or "", outcome.output)
    if specific:
        return specific
    return f"{label} exited with code 0 and {_printed(outcome.output)}"


def _describe_success(command: str, output: str) -> str | None:
    text = output.strip()
    first_line = text.splitlines()[0].strip() if text else ""
    if command == "python3 --version" and first_line:
        return f"The Python version is {first_line.rstrip('.')}."
    if command == _COUNT_FILES_COMMAND and first_line.isdigit():
        count = int(first_line)
        return f"The workspace has {count} file{'' if count == 1 else 's'}."
    if command == "ls -la":
        return _describe_listing(text)
    created = _CREATED_RE.match(command)
    if created:
        return f"Created the file {_shell_word(created.group('name'))}."
    if command.startswith("cat ") and len(_shell_words(command)) == 2:
        name = _shell_words(command)[1]
        return f"The file {name} is empty." if not text else f"The file {name} contains: {_excerpt(text)}"
    simple = {
        "pwd": "The current directory is {}.",
        "date": "The date in the sandbox is {}.",
        "whoami": "The sandbox user is {}.",
        "uname -a": "The system reports: {}.",
        "uname -n": "The hostname is {}.",
        "nproc": "The sandbox has {} CPUs.",
    }
    if command in simple and first_line and len(text.splitlines()) == 1:
        return simple[command].format(first_line.rstrip("."))
    return None


def _describe_listing(text: str) -> str:
    """Names from ``ls -la`` output (without . and ..)."""
    names = []
    for line in text.splitlines():
        parts = line.split(None, 8)
        if len(parts) == 9 and parts[8] not in {".", ".."}:
            names.append(parts[8])
    if not names:
        return (
            "The workspace is empty."
            if text.startswith("total") or not text
            else (f"The command `ls -la` exited with code 0 and {_printed(text)}")
        )
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    return f"The workspace has {len(names)} entr{'y' if len(names) == 1 else 'ies'}: {shown}."


def _shell_words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def _shell_word(text: str) -> str:
    words = _shell_words(text)
    return words[0] if len(words) == 1 else text


def _printed(output: str) -> str:
    excerpt = _excerpt(output)
    if not excerpt:
        return "printed nothing."
    return f"printed: {excerpt}" if "\n" not in excerpt else f"printed:\n{excerpt}"


def _excerpt(output: str) -> str:
    """The first lines of output, trimmed, with "..." when something was left out."""
    lines = [line.rstrip() for line in output.strip("\n").splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    text = "\n".join(lines[:_EXCERPT_LINES])
    cut = len(lines) > _EXCERPT_LINES
    if len(text) > _EXCERPT_CHARS:
        text, cut = text[:_EXCERPT_CHARS].rstrip(), True
    return text + ("\n..." if cut and "\n" in text else " ..." if cut else "")
