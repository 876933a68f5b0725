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

Modules: :mod:`.provider` (``OfflineProvider`` and the answer it decides), :mod:`.shell`
(prompts to commands), :mod:`.results` (tool results to sentences), :mod:`.arithmetic`
(sums without ``eval``), :mod:`.messages` (reading the conversation, the token budget).
"""

from nodus_ray.models.offline.provider import OFFLINE_MODELS, OfflineProvider

__all__ = ["OfflineProvider", "OFFLINE_MODELS"]
