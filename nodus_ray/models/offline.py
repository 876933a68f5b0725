"""A deterministic stand-in for Claude: no network, no weights, no secrets.

A server without an Anthropic key serves ``OfflineProvider``, so every example runs on a laptop;
the tests and benchmarks use it because the same request always gets the same answer. It speaks
the same Messages shape as the real provider (``text`` and ``tool_use`` blocks, ``tool_result``
replies), so the conversation loop, the journal and replay cannot tell the difference.

What it can do (the full table is in the :class:`OfflineProvider` docstring):

* run simple shell requests through the ``bash`` tool (Python version, list/count files, create
  and read a file, date, current directory, disk usage, kernel, environment, ...), run commands
  given in backticks or after ``run:`` verbatim, and then report what the commands printed;
* do arithmetic (``+ - * / // % **``, ``^`` as power, parentheses, unary minus) without ``eval``,
  when the prompt is the sum ("What is 2 + 2?", "12 / 4"), not numbers in prose ("a 2-3 day trip");
* otherwise restate the request and say it is the offline model.

It cannot answer questions, write code, reason, or plan more than one round of tool calls.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from nodus_ray.models.base import ModelRequest, ModelResponse, Usage

__all__ = ["OfflineProvider", "OFFLINE_MODELS"]

# Model ids say they are offline, so nobody mistakes a recorded offline run for Claude.
OFFLINE_MODELS: dict[str, str] = {
    "haiku": "offline-haiku",
    "sonnet": "offline-sonnet",
    "opus": "offline-opus",
    "fable": "offline-fable",
}

_CHARS_PER_TOKEN = 4
_TOOL_ID_PREFIX = "toolu_off_"
_RESTATE_LIMIT = 120  # characters of the prompt quoted back
_EXCERPT_LINES = 5  # lines of command output quoted in the final answer
_EXCERPT_CHARS = 400
_LISTED_COMMANDS = 5  # commands named in the text before a batch of tool calls
_MAX_RESULT_BITS = 4000  # larger integers are refused (they would not be "one short sentence")
_MAX_EXPRESSION_CHARS = 200
_CAPABILITIES = (
    "I am the offline model, so I can only restate requests, do arithmetic and run simple shell commands."
)


class OfflineProvider:
    """A deterministic ``ModelProvider``: no network, no weights, the same answer every time.

    The answer is decided only from ``request.messages``; ``request.model`` is echoed back as
    ``response.model``. It looks at the latest user *prompt* (a user message made of a string or
    text blocks, not ``tool_result`` blocks) and what came after it, then:

    1. **Tool results came back** (the latest user message holds ``tool_result`` blocks): it answers
       ``end_turn`` with one sentence per result, e.g. "The Python version is Python 3.11.2.",
       "The workspace has 3 files.", "The file notes.txt contains: hello", or generically "The
       command `X` exited with code N and printed: ..." (first 5 lines, at most 400 characters).
       A non-zero ``exit code N`` is reported as a failure and ``killed: ...`` as killed. Empty
       output, or the sandbox's ``(no output)`` marker, is reported as "printed nothing".
    2. **A shell request** with no result yet: it answers ``tool_use`` with a short text block
       saying what it will run, then one ``bash`` ``tool_use`` block per command, in order, with
       ids ``toolu_off_<n>`` (n counts every tool call in the conversation, so ids are unique).
       A prompt is a shell request when it mentions the shell (shell, bash, terminal, command,
       run, execute, or workspace/sandbox together with a verb such as list, create, count) or
       when it matches one of the file tasks below on its own. Commands, checked clause by
       clause in this order (words inside quotes or backticks never select an entry):

       - ``run: CMD`` or "run the command CMD" (no backticks) -> ``CMD`` verbatim, one per line
       - text in backticks or a fenced block, with run/execute/command -> each snippet verbatim
       - print/show the Python version -> ``python3 --version``
       - count the files / how many files -> ``find . -type f | wc -l``
       - create/make/write a file NAME [containing CONTENT], write CONTENT to NAME
         -> ``printf '%s\\n' CONTENT > NAME`` (``printf '' > NAME`` without content;
         ``mkdir -p DIR &&`` first when NAME has a directory)
       - print/echo/say "TEXT" (quoted, whatever it looks like, even "notes.txt") -> ``echo TEXT``
         with a shell word; without one the clause asks for nothing (it is never a file read)
       - read/show/print/open the file NAME, cat/read/open/view NAME, show the contents of NAME,
         what's in NAME, or "it" after a create -> ``cat NAME`` (a NAME without the word "file"
         must look like a file name: notes.txt, dir/x)
       - list the files / the workspace, what is in the workspace -> ``ls -la``

       Only when the prompt also has a shell word ("in the shell", "run", "command", ...):

       - the current/working directory, pwd -> ``pwd``
       - disk usage / free space -> ``df -h .``;  size of the workspace -> ``du -sh .``
       - kernel / operating system -> ``uname -a``;  hostname -> ``uname -n``
       - environment variables -> ``env | sort``;  current user, whoami -> ``whoami``
       - number of CPUs / cores -> ``nproc``;  memory / RAM -> ``head -n 3 /proc/meminfo``
       - the date / time / day -> ``date``
       - arithmetic, under the rule of 3. below ("compute 2 + 2 in the shell")
         -> ``python3 -c 'print(2 + 2)'``
       - backticked text without a run verb ("use bash: `ls`") -> run verbatim

       Clauses are split at sentence ends, ``;``, "then" and "and <verb>", so "create a file a.txt
       containing hi, then show it" issues two commands. A shell request it cannot map runs
       ``ls -la`` and says so. Commands are quoted with ``shlex`` where it builds them; commands
       the user wrote are run as written (the sandbox, not this model, is the safety boundary).
    3. **Arithmetic**: numbers with ``+ - * / // % **``, ``^`` (power), ``x``/``×``/``÷`` and the
       words plus, minus, times, multiplied by, divided by, mod(ulo), to the power of, squared,
       cubed, and parentheses and unary minus. Parsed with ``ast`` and evaluated node by node (never
       ``eval``); results over ~4000 bits, complex results and division by zero are refused in
       words. Answer: "2 + 2 = 4." Integers stay integers; divisions give a clean decimal
       ("10 / 4 = 2.5.", "12 / 4 = 3."). Several expressions are answered in one sentence.
       Only when the expression is clearly the question: the prompt is just the expression(s)
       (joined by "and", "," or ";") once polite wrappers are stripped ("what is", "what's",
       "compute", "calculate", "evaluate", "how much is", "solve", "please", a trailing "?" or
       "."), or one of those verbs directly precedes it ("Hey, what is 6 * 7? I need it."). Numbers
       in prose ("Plan a 2-3 day trip"), dates (2024-01-05, 1/5/2024), phone numbers
       (555-123-4567) and versions (3.11.2) are not evaluated; such prompts are restated.
    4. **Anything else**: 'You asked: "<prompt, cut at 120 characters>" I am the offline model,
       so I can only restate requests, do arithmetic and run simple shell commands.' A follow-up
       prompt is handled the same way on its own.

    ``stop_reason`` is ``tool_use`` or ``end_turn``; if the content would need more than
    ``max_tokens`` (estimated at 4 characters per token, tool input counted as its JSON), the text
    is cut, tool calls that do not fit are dropped, and ``stop_reason`` is ``max_tokens``.
    ``usage`` is an estimate: input = ceil(chars / 4) of system + all message text (tool inputs as
    JSON) + tool definitions JSON; output = ceil(chars / 4) of the produced text + tool input JSON;
    cache fields are 0. ``latency_seconds`` sleeps that long in every call, to simulate a model
    in flight for benchmarks and tests.
    """

    name = "offline"

    def __init__(self, *, latency_seconds: float = 0.0):
        if not math.isfinite(latency_seconds) or latency_seconds < 0:
            raise ValueError(f"latency_seconds must be a finite number >= 0, got {latency_seconds!r}")
        self.latency_seconds = float(latency_seconds)

    def model_for_family(self, family: str) -> str:
        """``offline-<family>``; an offline model id is accepted as itself (idempotent)."""
        key = family.strip().lower()
        if key in OFFLINE_MODELS:
            return OFFLINE_MODELS[key]
        if key in OFFLINE_MODELS.values():
            return key
        raise ValueError(f"unknown model family {family!r}; expected one of {sorted(OFFLINE_MODELS)}")

    def complete(self, request: ModelRequest) -> ModelResponse:
        if self.latency_seconds:
            time.sleep(self.latency_seconds)
        content, stop_reason = _respond(list(request.messages or []))
        content, truncated = _fit_to_budget(content, request.max_tokens)
        if truncated:
            stop_reason = "max_tokens"
        usage = Usage(
            input_tokens=max(1, _tokens(_request_chars(request))),
            output_tokens=_tokens(_content_chars(content)),
        )
        return ModelResponse(model=request.model, content=content, stop_reason=stop_reason, usage=usage)

    def __repr__(self) -> str:
        return f"OfflineProvider(latency_seconds={self.latency_seconds!r})"


# --------------------------------------------------------------------------------------------
# Reading the conversation


def _blocks(content: Any) -> list[dict[str, Any]]:
    """Content as a list of blocks; a plain string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [block for block in content if isinstance(block, dict)]
    return []


def _is_prompt(message: dict[str, Any]) -> bool:
    """A user message a person wrote, as opposed to one carrying tool results."""
    if message.get("role") != "user":
        return False
    return not any(block.get("type") == "tool_result" for block in _blocks(message.get("content")))


def _prompt_text(message: dict[str, Any]) -> str:
    blocks = _blocks(message.get("content"))
    return "\n".join(str(block.get("text", "")) for block in blocks if block.get("type") == "text")


def _tool_result_text(block: dict[str, Any]) -> str:
    """The text of a ``tool_result``: a string, or a list of text blocks joined by newlines."""
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(str(part.get("text", "")) for part in _blocks(content) if part.get("type") == "text")


def _latest_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``tool_result`` blocks of the most recent user message that has any."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        results = [b for b in _blocks(message.get("content")) if b.get("type") == "tool_result"]
        if results:
            return results
    return []


def _tool_uses(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        block
        for message in messages
        if message.get("role") == "assistant"
        for block in _blocks(message.get("content"))
        if block.get("type") == "tool_use"
    ]


def _respond(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """Decide the whole answer (content blocks and stop reason) from the conversation."""
    prompt_index = next((i for i in range(len(messages) - 1, -1, -1) if _is_prompt(messages[i])), None)
    after_prompt = messages if prompt_index is None else messages[prompt_index + 1 :]
    results = _latest_tool_results(after_prompt)
    if results:
        return [_text_block(_summarize_results(results, _tool_uses(messages)))], "end_turn"

    prompt = "" if prompt_index is None else _prompt_text(messages[prompt_index])
    commands, fallback = _plan_commands(prompt)
    if commands:
        first_id = len(_tool_uses(messages)) + 1
        return _tool_call_content(commands, fallback, first_id), "tool_use"

    answer = _arithmetic_answer(prompt) or _restate(prompt)
    return [_text_block(answer)], "end_turn"


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


# --------------------------------------------------------------------------------------------
# Shell requests -> commands

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


# --------------------------------------------------------------------------------------------
# Tool results -> final answer

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


# --------------------------------------------------------------------------------------------
# Arithmetic, without eval

_WORD_OPERATORS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.I), symbol)
    for pattern, symbol in (
        (r"\bmultiplied\s+by\b", "*"),
        (r"\btimes\b", "*"),
        (r"\bdivided\s+by\b", "/"),
        (r"\bplus\b", "+"),
        (r"\bminus\b", "-"),
        (r"\bmod(?:ulo)?\b", "%"),
        (r"\s*\bto\s+the\s+power\s+of\b\s*", "**"),
        (r"\s*\bsquared\b", "**2"),
        (r"\s*\bcubed\b", "**3"),
        (r"(?<=[\d)])\s+x\s+(?=[\d(])", " * "),
        (r"×", "*"),
        (r"÷", "/"),
        (r"−", "-"),
    )
)
_CANDIDATE_RE = re.compile(r"(?:[-+(]\s*)*[\d.][\d.\s()+\-*/%^]*")

# When numbers with an operator count as a question (see :func:`_find_expressions`).
_ARITHMETIC_LEAD = r"(?:what\s+is|what's|whats|compute|calculate|evaluate|how\s+much\s+is|solve)"
_LEAD_BEFORE_RE = re.compile(rf"\b{_ARITHMETIC_LEAD}\s*:?\s*$", re.I)
_WRAPPER_BEFORE_RE = re.compile(
    rf"\s*(?:(?:please|kindly|hey|ok|okay|so|can\s+you|could\s+you|would\s+you|will\s+you|{_ARITHMETIC_LEAD})"
    r"\b[\s,:]*)*",
    re.I,
)
_WRAPPER_AFTER_RE = re.compile(
    r"(?:\s*=)?(?:\s+(?:in|inside|using|with|via|on)\s+(?:the\s+|your\s+|my\s+|a\s+)?"
    r"(?:shell|bash|terminal|sandbox|workspace|command\s+line))?"
    r"(?:[\s?.!,]|\bplease\b|\bfor\s+me\b)*",
    re.I,
)
_LEADING_DOTS_RE = re.compile(r"(?:\.(?!\d)|\s)*")
_JOINER_RE = re.compile(r"[\s,;&]*(?:and\b)?[\s,;&]*", re.I)
# Number shapes that are not sums: dates and phone numbers (2024-01-05, 555-123-4567), versions and
# dotted numbers (3.11.2), and slashed dates with a four-digit year (1/5/2024, 2024/01/05).
_NOT_ARITHMETIC_RE = re.compile(
    r"\d-\d+-\d|\d*\.\d+\.\d|\b\d{1,2}/\d{1,2}/(?:1[89]|2\d)\d\d\b|\b(?:1[89]|2\d)\d\d/\d{1,2}/\d{1,2}\b"
)

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


class _Refused(ValueError):
    """An expression that parses but will not be computed; the message says why, in words."""


def _arithmetic_answer(prompt: str) -> str | None:
    found = _find_expressions(prompt)
    if not found:
        return None
    parts = []
    for shown, tree in found[:5]:
        try:
            parts.append(f"{shown} = {_format_number(_evaluate(tree))}")
        except _Refused as why:
            parts.append(f"I can't compute {shown}: {why}")
    return "; ".join(parts) + "."


def _find_expressions(text: str) -> list[tuple[str, ast.Expression]]:
    """The arithmetic the text asks for, as (shown form, parsed tree); empty when it asks none.

    An expression (at least one binary operator) counts only when it is clearly the question:
    either the whole text is expressions (joined by "and", "," or ";") once polite wrappers are
    stripped ("what is", "compute", "please", a trailing "?" or "." or "in the shell"), or
    "what is", "what's", "compute", "calculate", "evaluate", "how much is" or "solve" directly
    precedes it (or precedes an expression it is joined to by "and"). So "Plan a 2-3 day trip"
    is not arithmetic. Dates, phone numbers and version numbers (2024-01-05, 555-123-4567,
    3.11.2) are never evaluated.
    """
    for pattern, symbol in _WORD_OPERATORS:
        text = pattern.sub(symbol, text)
    spans = _expression_spans(text)
    if not spans:
        return []
    if _only_expressions(text, spans):
        return [(shown, tree) for _, _, shown, tree in spans]
    found, previous_end = [], None
    for start, end, shown, tree in spans:
        before = text[:start]
        chained = previous_end is not None and _JOINER_RE.fullmatch(text[previous_end:start])
        if chained or _LEAD_BEFORE_RE.search(before):
            found.append((shown, tree))
            previous_end = end
        else:
            previous_end = None
    return found


def _expression_spans(text: str) -> list[tuple[int, int, str, ast.Expression]]:
    """Every arithmetic expression in the text: (start, end, shown form, parsed tree)."""
    spans = []
    for match in _CANDIDATE_RE.finditer(text):
        raw = match.group()
        leading = _LEADING_DOTS_RE.match(raw)  # a sentence's "." before the number
        lead = leading.end() if leading else 0
        candidate = _trim_candidate(raw[lead:])
        if not candidate or len(candidate) > _MAX_EXPRESSION_CHARS or _NOT_ARITHMETIC_RE.search(candidate):
            continue
        tree = _parse(candidate)
        if tree is not None and any(isinstance(node, ast.BinOp) for node in ast.walk(tree)):
            start = match.start() + lead
            spans.append((start, start + len(candidate), " ".join(candidate.split()), tree))
    return spans


def _only_expressions(text: str, spans: list[tuple[int, int, str, ast.Expression]]) -> bool:
    """Whether the text is nothing but the expressions, joiners and polite wrappers."""
    if not _WRAPPER_BEFORE_RE.fullmatch(text[: spans[0][0]]):
        return False
    if not _WRAPPER_AFTER_RE.fullmatch(text[spans[-1][1] :]):
        return False
    return all(
        _JOINER_RE.fullmatch(text[left[1] : right[0]]) for left, right in zip(spans, spans[1:], strict=False)
    )


def _trim_candidate(candidate: str) -> str:
    """Drop trailing punctuation and unmatched closing parentheses."""
    candidate = candidate.rstrip()
    while candidate and (candidate[-1] not in "0123456789)" or candidate.count(")") > candidate.count("(")):
        candidate = candidate[:-1].rstrip()
    return candidate


def _parse(candidate: str) -> ast.Expression | None:
    try:
        tree = ast.parse(candidate.replace("^", "**"), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return tree if _only_arithmetic(tree) else None


def _only_arithmetic(tree: ast.AST) -> bool:
    allowed_ops = (*_BINARY, ast.Pow, ast.USub, ast.UAdd)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if type(node.value) not in (int, float):
                return False
        elif isinstance(node, ast.BinOp | ast.UnaryOp):
            if not isinstance(node.op, allowed_ops):
                return False
        elif not isinstance(node, ast.Expression | ast.operator | ast.unaryop):
            return False
    return True


def _evaluate(node: ast.AST) -> int | float:
    """Evaluate a tree that ``_only_arithmetic`` accepted, refusing huge or undefined results."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        try:
            if isinstance(node.op, ast.Pow):
                return _checked(_power(left, right))
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise _Refused("division by zero is undefined") from None
        except OverflowError:
            raise _Refused("the result is too large") from None
    raise _Refused("only numbers and + - * / // % ** are allowed")


def _power(base: int | float, exponent: int | float) -> int | float | complex:
    """``base ** exponent``, refused before computing when the result would be enormous."""
    if abs(base) > 1 and exponent > 0 and exponent * math.log2(abs(base)) > _MAX_RESULT_BITS:
        raise _Refused("the result is too large")
    if base == 0 and exponent < 0:
        raise ZeroDivisionError
    return base**exponent


def _checked(value: int | float | complex) -> int | float:
    if isinstance(value, complex):
        raise _Refused("the result is not a real number")
    if isinstance(value, int) and value.bit_length() > _MAX_RESULT_BITS:
        raise _Refused("the result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise _Refused("the result is too large")
    return value


def _format_number(value: int | float) -> str:
    """Integers as integers; floats as a clean decimal (3.0 -> "3", 1/3 -> "0.333333333333")."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".12g")


# --------------------------------------------------------------------------------------------
# Restating, budgets and usage


def _restate(prompt: str) -> str:
    flat = " ".join(prompt.split())
    if not flat:
        return f"You sent an empty prompt. {_CAPABILITIES}"
    if len(flat) > _RESTATE_LIMIT:
        flat = flat[: _RESTATE_LIMIT - 3].rstrip() + "..."
    return f'You asked: "{flat}" {_CAPABILITIES}'


def _tokens(chars: int) -> int:
    return math.ceil(chars / _CHARS_PER_TOKEN)


def _json_chars(value: Any) -> int:
    return len(json.dumps(value, sort_keys=True, default=str))


def _content_chars(content: Any) -> int:
    """Characters a model would read or write for this content (tool inputs as JSON)."""
    total = 0
    for block in _blocks(content):
        kind = block.get("type")
        if kind == "text":
            total += len(str(block.get("text", "")))
        elif kind == "tool_use":
            total += _json_chars(block.get("input", {}))
        elif kind == "tool_result":
            total += len(_tool_result_text(block))
        else:
            total += _json_chars(block)
    return total


def _request_chars(request: ModelRequest) -> int:
    messages = sum(_content_chars(message.get("content")) for message in request.messages or [])
    tools = _json_chars(request.tools) if request.tools else 0
    return len(request.system or "") + messages + tools


def _fit_to_budget(content: list[dict[str, Any]], max_tokens: int) -> tuple[list[dict[str, Any]], bool]:
    """Keep what fits in ``max_tokens`` (4 chars each): cut text, drop tool calls that do not fit."""
    budget = max(0, int(max_tokens)) * _CHARS_PER_TOKEN
    kept: list[dict[str, Any]] = []
    for block in content:
        cost = _content_chars([block])
        if cost <= budget:
            kept.append(block)
            budget -= cost
            continue
        if block.get("type") == "text" and budget > 0:
            kept.append(_text_block(block["text"][:budget]))
        return kept, True
    return kept, False
