"""The offline provider itself: the ``ModelProvider`` interface over the scripted behaviours.

What it answers is documented in :class:`OfflineProvider`; how is split by behaviour into
:mod:`.shell`, :mod:`.results`, :mod:`.arithmetic` and :mod:`.messages`.
"""

from __future__ import annotations

import math
import time
from typing import Any

from nodus_ray.models.base import ModelRequest, ModelResponse, Usage
from nodus_ray.models.catalog import OFFLINE_MODELS
from nodus_ray.models.offline.arithmetic import _arithmetic_answer
from nodus_ray.models.offline.messages import (
    _content_chars,
    _fit_to_budget,
    _is_prompt,
    _latest_tool_results,
    _prompt_text,
    _request_chars,
    _text_block,
    _tokens,
    _tool_uses,
)
from nodus_ray.models.offline.results import _summarize_results
from nodus_ray.models.offline.shell import _plan_commands, _tool_call_content

__all__ = ["OfflineProvider", "OFFLINE_MODELS"]


_RESTATE_LIMIT = 120  # characters of the prompt quoted back
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
# Deciding the answer


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


def _restate(prompt: str) -> str:
    flat = " ".join(prompt.split())
    if not flat:
        return f"You sent an empty prompt. {_CAPABILITIES}"
    if len(flat) > _RESTATE_LIMIT:
        flat = flat[: _RESTATE_LIMIT - 3].rstrip() + "..."
    return f'You asked: "{flat}" {_CAPABILITIES}'
