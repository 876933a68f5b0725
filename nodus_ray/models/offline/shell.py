"""Shell requests to commands: which ``bash`` tool calls a prompt asks for, clause by clause.

The table of what maps to what is in :class:`nodus_ray.models.offline.OfflineProvider`'s
docstring; this module is its implementation.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from nodus_ray.models.offline.arithmetic import _find_expressions
from nodus_ray.models.offline.messages import _text_block

__all__ = ["_plan_commands", "_tool_call_content", "_short", "_COUNT_FILES_COMMAND"]

_TOOL_ID_PREFIX = "toolu_off_"
_LISTED_COMMANDS = 5  # commands named in the text before a batch of tool calls


_WORKSPACE_WORDS = r"(?:workspace|sandbox|directory|folder)"
_SHELL_CUE_RE = re.compile(r"\b(?:shell|bash|terminal|commands?|cli|execute|run|running)\b", re.I)
_PLACE_RE = re.compile(r"\b(?:workspace|sandbox)\b", re.I)
_ACTION_RE = re.compile(
    r"\b(?:list|show|print|display|count|create|make|write|read|cat|delete|remove|check|find|look)\b", re.I
)
_RUN_VERB_RE = re.compile(r"\b(?:run|runs|running|execute|exec|commands?)\b", re.I)

# Quoted and backticked spans are masked before looking for verbs and clause boundaries, so
# "`cd /tmp; ls`" or "'Hello. World'" are never split and words inside them never count.
_QUOTED_RE = re.compile(r"```.*?```|`[^`]*`|\"[^\"\n]*\"|(?<!\w)'[^'\n]*'(?!\w)", re.S)
_CLAUSE_VERBS = (
    r"(?:print|show|list|count|create|make|write|read|cat|display|run|execute|tell|check|open|view|echo"
    r"|touch)"
)
_CLAUSE_SPLIT_RE = re.compile(
    rf"[.!?;]+(?=\s|$)|\n+|,?\s+(?:and\s+)?then\s+"
    rf"|,?\s+and\s+(?={_CLAUSE_VERBS}\b)|,\s+(?={_CLAUSE_VERBS}\b)",
    re.I,
)
_FILLER_RE = re.compile(
    r"\b(?:and|also|then|or|too|finally|next|afterwards|after\s+that|as\s+well)\b|[\s,:]+", re.I
)
_SNIPPET_RE = re.compile(r"```(?:[A-Za-z0-9_+-]*\n)?(?P<fence>.*?)```|`(?P<inline>[^`\n]+)`", re.S)

_VERBATIM_COLON_RE = re.compile(
    r"\b(?:run|execute)(?:\s+(?:this|these|the\s+following|following|the))?(?:\s+(?:shell|bash))?"
    r"(?:\s+commands?)?\s*:\s*(?P<rest>.+)",
    re.I | re.S,
)
_VERBATIM_PHRASE_RE = re.compile(
    r"\b(?:run|execute)\s+the\s+(?:shell\s+|bash\s+)?command\s+(?P<rest>[^\n]+)", re.I
)
_TRAILING_REQUEST_RE = re.compile(
    r"\s*,?\s+(?:and|then)\s+(?:then\s+)?"
    r"(?:tell|report|show|say|explain|let|describe|summari[sz]e|give)\b.*$",
    re.I,
)
_TRAILING_PLACE_RE = re.compile(
    r"\s+(?:in|inside|using|with|via|from|on)\s+(?:the\s+|your\s+|my\s+|a\s+)?"
    r"(?:shell|bash|terminal|sandbox|workspace|command\s+line)$",
    re.I,
)

_NAME = r"(?P<name>`[^`\n]+`|\"[^\"\n]+\"|'[^'\n]+'|[\w.~/+-]+)"
_CREATE_RE = re.compile(
    r"\b(?:create|make|write|touch|add)\s+(?:a\s+|an\s+|the\s+|one\s+)?(?:new\s+)?(?:empty\s+)?(?:text\s+)?"
    rf"file\s+(?:(?:in|inside)\s+the\s+{_WORKSPACE_WORDS}\s+)?(?:called\s+|named\s+)?"
    r"(?!(?:with|containing|that|which|in|to|called|named)\b)" + _NAME + r"(?:\s+(?:(?:in|inside)\s+the\s+"
    rf"{_WORKSPACE_WORDS}\s+)?(?:containing|with\s+(?:the\s+)?(?:text|contents?|line)|with"
    r"|that\s+(?:says|contains)"
    r"|saying)\s*:?\s*(?P<content>.+))?",
    re.I | re.S,
)
_CREATE_BARE_RE = re.compile(
    r"\b(?:create|make|touch)\s+" + _NAME + r"(?:\s+(?:containing|with\s+(?:the\s+)?(?:text|contents?)|with"
    r"|that\s+(?:says|contains)|saying)\s*:?\s*(?P<content>.+))?",
    re.I | re.S,
)
_WRITE_TO_RE = re.compile(
    r"\bwrite\s+(?P<content>.{1,500}?)\s+(?:in)?to\s+(?:a\s+|the\s+)?(?:new\s+)?(?P<file>file\s+)?"
    r"(?:called\s+|named\s+)?" + _NAME,
    re.I | re.S,
)
_READ_VERBS = r"(?:read|show|print|display|open|output|view)"
_READ_FILE_RE = re.compile(
    rf"\b{_READ_VERBS}\s+(?:me\s+)?(?:the\s+)?(?:contents?\s+of\s+)?(?:the\s+)?file\s+(?:called\s+|named\s+)?"
    + _NAME,
    re.I,
)
# A name without the word "file" is read only after an explicit file verb or phrase: "cat X",
# "read X", "open X", "view X", "show the contents of X", "what's in X". "print X" / "show X" alone
# is not a read, so a quoted text after print/echo/say is echoed, whatever it looks like.
_READ_NAME_RE = re.compile(
    rf"\b(?:{_READ_VERBS}\s+(?:me\s+)?(?:the\s+)?contents?\s+of\s+(?:the\s+)?"
    r"|(?:read|cat|open|view)\s+(?:me\s+)?|what(?:'s|\s+is)\s+in(?:side)?\s+)" + _NAME,
    re.I,
)
_READ_IT_RE = re.compile(
    r"\b(?:read|show|cat|print|display|open|view)\s+(?:me\s+)?(?:it|its\s+contents?|the\s+file|that\s+file"
    r"|the\s+contents(?:\s+of\s+it)?)(?:\s+back)?\b",
    re.I,
)
_PYTHON_VERSION_RE = re.compile(r"\bpython\s*3?\s+version\b|\bversion\s+of\s+python\b", re.I)
_COUNT_RE = re.compile(r"\b(?:count|how\s+many|number\s+of)\b[^.?!]{0,200}?\bfiles?\b", re.I)
_LIST_RE = re.compile(
    r"\blist\b[^.?!]{0,200}?\b(?:files?|workspace|sandbox|directory|directories|folder|contents)\b"
    r"|\bwhat(?:'s|\s+is|\s+files\s+are)\s+(?:in|inside)\s+(?:the\s+|my\s+|your\s+|this\s+)?"
    rf"{_WORKSPACE_WORDS}\b"
    r"|\b(?:which|what)\s+files\b"
    r"|\b(?:show|display|print)\b[^.?!]{0,200}?\b(?:files|directory\s+listing"
    rf"|contents\s+of\s+the\s+{_WORKSPACE_WORDS})\b",
    re.I,
)

_COUNT_FILES_COMMAND = "find . -type f | wc -l"

# Requests that only count as shell requests next to a shell word: (pattern, command).
_CUED_TASKS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.I), command)
    for pattern, command in (
        (
            r"\b(?:current|working|present)\s+(?:working\s+)?(?:directory|folder)\b"
            r"|\bpwd\b|\bwhere\s+am\s+i\b",
            "pwd",
        ),
        (r"\bdisk\s+(?:usage|space)\b|\bfree\s+space\b|\bdf\b", "df -h ."),
        (
            rf"\b(?:size\s+of|how\s+big\s+is|how\s+much\s+space)\b[^.?!]{0, 200}\b{_WORKSPACE_WORDS}\b|\bdu\b",
            "du -sh .",
        ),
        (r"\bkernel\b|\boperating\s+system\b|\bos\s+(?:name|version)\b|\buname\b|\bwhich\s+os\b", "uname -a"),
        (r"\benvironment(?:\s+variables?)?\b|\benv(?:\s+vars?)?\b", "env | sort"),
        (r"\bwho\s*am\s*i\b|\bwhich\s+user\b|\buser\s*name\b|\bcurrent\s+user\b", "whoami"),
        (r"\b(?:cpus?|cores?|processors?)\b", "nproc"),
        (r"\bmemory\b|\bram\b", "head -n 3 /proc/meminfo"),
        (r"\bhost\s*name\b", "uname -n"),
        (r"\b(?:date|time|day)\b", "date"),
    )
)
_ECHO_RE = re.compile(
    r"\b(?:print|echo|say|output)(?:\s+out)?\s+(?:the\s+(?:text|string|words?|message|line)\s+)?"
    r"(?P<text>\"[^\"\n]*\"|(?<!\w)'[^'\n]*'(?!\w))",
    re.I,
)


@dataclass(frozen=True)
class _Task:
    command: str
    file: str | None = None  # the file it creates or reads, so "show it" can refer back


def _mask(text: str) -> str:
    return _QUOTED_RE.sub(lambda match: "_" * len(match.group()), text)


def _has_shell_cue(prompt: str) -> bool:
    masked = _mask(prompt)
    return bool(_SHELL_CUE_RE.search(masked) or (_PLACE_RE.search(masked) and _ACTION_RE.search(masked)))


def _split_clauses(text: str) -> list[str]:
    """Split at sentence ends, ';', 'then' and 'and <verb>', never inside quotes or backticks."""
    clauses, start = [], 0
    for match in _CLAUSE_SPLIT_RE.finditer(_mask(text)):
        clauses.append(text[start : match.start()])
        start = match.end()
    clauses.append(text[start:])
    return [clause.strip() for clause in clauses if clause.strip()]


def _snippets(text: str) -> list[str]:
    """Backticked commands and fenced code blocks, in order of appearance."""
    found = []
    for match in _SNIPPET_RE.finditer(text):
        fence = match.group("fence")
        snippet = (fence if fence is not None else match.group("inline")).strip()
        if snippet:
            found.append(snippet)
    return found


def _plan_commands(prompt: str) -> tuple[list[str], bool]:
    """The commands a prompt asks for, and whether they are the ``ls -la`` fallback."""
    cue = _has_shell_cue(prompt)
    if cue and "`" not in prompt:
        verbatim = _verbatim_commands(prompt)
        if verbatim:
            return verbatim, False

    commands: list[str] = []
    last_file: str | None = None
    for clause in _split_clauses(prompt):
        snippets = _snippets(clause)
        if snippets and cue and (_RUN_VERB_RE.search(_mask(clause)) or _only_snippets(clause)):
            commands.extend(snippets)
            continue
        task = _match_task(clause, cue=cue, last_file=last_file)
        if task is not None:
            if not commands or commands[-1] != task.command:  # "List the files. What is in the workspace?"
                commands.append(task.command)
            last_file = task.file or last_file
        elif snippets and cue:
            commands.extend(snippets)
    if commands:
        return commands, False
    return (["ls -la"], True) if cue else ([], False)


def _only_snippets(clause: str) -> bool:
    """A clause that is nothing but snippets and joining words ("`a` and `b`" after "run `x`, then")."""
    return not _FILLER_RE.sub("", _SNIPPET_RE.sub("", clause))


def _verbatim_commands(prompt: str) -> list[str]:
    """``run: CMD`` (one command per line) or ``run the command CMD`` (to the end of the line)."""
    match = _VERBATIM_COLON_RE.search(prompt)
    if match:
        lines = [line.strip() for line in match.group("rest").splitlines() if line.strip()]
        return [_clean_command(line) for line in lines if _clean_command(line)]
    match = _VERBATIM_PHRASE_RE.search(prompt)
    if match:
        command = _clean_command(_TRAILING_REQUEST_RE.sub("", match.group("rest")))
        return [command] if command else []
    return []


def _clean_command(text: str) -> str:
    """Drop wrapping quotes and a sentence-final period ("ls -la." but not "find .")."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1].strip()
    if len(text) >= 2 and text.endswith(".") and text[-2].isalnum():
        text = text[:-1]
    return text.strip()


def _match_task(clause: str, *, cue: bool, last_file: str | None) -> _Task | None:
    """The first table entry one clause asks for (see the class docstring for the table).

    Words inside quotes or backticks never select an entry: print "what time is it" is an echo,
    not ``date``.
    """
    masked = _mask(clause)
    if _PYTHON_VERSION_RE.search(masked):
        return _Task("python3 --version")
    if _COUNT_RE.search(masked):
        return _Task(_COUNT_FILES_COMMAND)
    task = _match_create(clause)
    if task is not None:
        return task
    echo = _ECHO_RE.search(clause)
    if echo is not None and not _in_quotes(clause, echo):
        # A quoted text after print/echo/say is text to print, never a file to read.
        return _Task(f"echo {shlex.quote(_unquote(echo.group('text')))}") if cue else None
    task = _match_read(clause, last_file)
    if task is not None:
        return task
    if _LIST_RE.search(masked):
        return _Task("ls -la")
    if cue:
        return _match_cued(clause)
    return None


def _in_quotes(text: str, match: re.Match[str]) -> bool:
    """Whether the match starts inside a quoted or backticked span of ``text``."""
    return _mask(text)[match.start()] == "_" and text[match.start()] != "_"


def _unquote(name: str) -> str:
    name = name.strip()
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "`\"'":
        return name[1:-1].strip()
    return name.rstrip(".,:")


def _looks_like_file(name: str) -> bool:
    """ "notes.txt" or "dir/x" is a file name; "date" or "2.5" is not."""
    return bool(re.search(r"[A-Za-z_]", name)) and ("." in name.strip(".") or "/" in name)


def _clean_content(text: str) -> str:
    text = _TRAILING_PLACE_RE.sub("", text.strip())
    return _unquote(text) if text[:1] in "`\"'" else text


def _match_create(clause: str) -> _Task | None:
    bare = (
        m
        for m in _overlapping(_CREATE_BARE_RE, clause)
        if _looks_like_file(_unquote(m.group("name"))) and not _in_quotes(clause, m)
    )
    match = _CREATE_RE.search(clause)
    if match is not None and _in_quotes(clause, match):
        match = None
    match = match or next(bare, None)
    if match is not None:
        content = match.group("content")
        name = _unquote(match.group("name"))
        return _create_task(name, None if content is None else _clean_content(content))
    match = _WRITE_TO_RE.search(clause)
    if match is not None and not _in_quotes(clause, match):
        name = _unquote(match.group("name"))
        if match.group("file") or _looks_like_file(name):
            return _create_task(name, _clean_content(match.group("content")))
    return None


def _create_task(name: str, content: str | None) -> _Task | None:
    if not name:
        return None
    quoted = shlex.quote(name)
    parent = name.rstrip("/").rpartition("/")[0]
    prefix = f"mkdir -p {shlex.quote(parent)} && " if parent else ""
    body = f"printf '%s\\n' {shlex.quote(content)}" if content else "printf ''"
    return _Task(f"{prefix}{body} > {quoted}", file=name)


def _overlapping(pattern: re.Pattern[str], text: str) -> Iterator[re.Match[str]]:
    """Every match, including ones starting inside an earlier match ("show me what's in a.txt")."""
    position = 0
    while (match := pattern.search(text, position)) is not None:
        yield match
        position = match.start() + 1


def _match_read(clause: str, last_file: str | None) -> _Task | None:
    match = _READ_FILE_RE.search(clause)
    if match is not None and _unquote(match.group("name")).lower() not in {"it", "back"}:
        name = _unquote(match.group("name"))
        return _Task(f"cat {shlex.quote(name)}", file=name)
    for match in _overlapping(_READ_NAME_RE, clause):
        name = _unquote(match.group("name"))
        if _looks_like_file(name):
            return _Task(f"cat {shlex.quote(name)}", file=name)
    if last_file and _READ_IT_RE.search(clause):
        return _Task(f"cat {shlex.quote(last_file)}", file=last_file)
    return None


def _match_cued(clause: str) -> _Task | None:
    masked = _mask(clause)
    for pattern, command in _CUED_TASKS:
        if pattern.search(masked):
            return _Task(command)
    evaluated = _find_expressions(clause)
    if evaluated:
        expression = evaluated[0][0].replace("^", "**")
        return _Task(f"python3 -c {shlex.quote(f'print({expression})')}")
    return None


def _tool_call_content(commands: list[str], fallback: bool, first_id: int) -> list[dict[str, Any]]:
    if fallback:
        intro = (
            "I could not map that request to a specific command, so I will list the workspace with `ls -la`."
        )
    elif len(commands) == 1:
        intro = f"I will run `{_short(commands[0])}` in the sandbox."
    else:
        listed = ", then ".join(f"`{_short(command)}`" for command in commands[:_LISTED_COMMANDS])
        if len(commands) > _LISTED_COMMANDS:
            listed += f" and {len(commands) - _LISTED_COMMANDS} more"
        intro = f"I will run {len(commands)} commands in the sandbox: {listed}."
    blocks = [_text_block(intro)]
    for offset, command in enumerate(commands):
        blocks.append(
            {
                "type": "tool_use",
                "id": f"{_TOOL_ID_PREFIX}{first_id + offset}",
                "name": "bash",
                "input": {"command": command},
            }
        )
    return blocks


def _short(command: str, limit: int = 80) -> str:
    """A command as shown in prose: one line, at most ``limit`` characters."""
    flat = " ; ".join(line.strip() for line in command.splitlines() if line.strip())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."
