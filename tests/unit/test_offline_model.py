"""Behaviour of the offline provider: what the docstring promises is what it does.

The offline provider is what a server without an Anthropic key serves and what tests and
benchmarks run against, so each mapping, the result summaries, the safe arithmetic, determinism,
budgets and usage estimates are checked here without Ray or network.
"""

from __future__ import annotations

import builtins
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nodus_ray.models.base import BASH_TOOL, ModelProvider, ModelRequest, ModelResponse
from nodus_ray.models.offline import OFFLINE_MODELS, OfflineProvider
from nodus_ray.sandbox import CommandResult

MODEL = "offline-sonnet"


def _request(messages: list[dict[str, Any]], *, max_tokens: int = 1024, system: str = "") -> ModelRequest:
    return ModelRequest(model=MODEL, system=system, messages=messages, max_tokens=max_tokens)


def _ask(prompt: str, **kwargs: Any) -> ModelResponse:
    return OfflineProvider().complete(_request([{"role": "user", "content": prompt}], **kwargs))


def _commands(response: ModelResponse) -> list[str]:
    return [block["input"]["command"] for block in response.tool_uses()]


def _reply_with_results(prompt: str, outputs: list[str]) -> tuple[ModelResponse, ModelResponse]:
    """Ask, then feed one tool_result per tool call back; return (tool call answer, final answer)."""
    provider = OfflineProvider()
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    first = provider.complete(_request(messages))
    assert first.stop_reason == "tool_use"
    assert len(first.tool_uses()) == len(outputs)
    messages.append({"role": "assistant", "content": first.content})
    messages.append(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": block["id"], "content": output}
                for block, output in zip(first.tool_uses(), outputs, strict=True)
            ],
        }
    )
    return first, provider.complete(_request(messages))


# --- identity ---------------------------------------------------------------------------------


def test_model_ids_say_offline_and_families_map() -> None:
    provider = OfflineProvider()
    assert isinstance(provider, ModelProvider)
    assert provider.name == "offline"
    for family, model in OFFLINE_MODELS.items():
        assert "offline" in model
        assert provider.model_for_family(family) == model
        assert provider.model_for_family(family.upper()) == model
        assert provider.model_for_family(model) == model
    with pytest.raises(ValueError):
        provider.model_for_family("gpt")


def test_response_echoes_request_model() -> None:
    request = ModelRequest(
        model="offline-opus", system="", messages=[{"role": "user", "content": "hi"}], max_tokens=100
    )
    assert OfflineProvider().complete(request).model == "offline-opus"


# --- shell requests -----------------------------------------------------------------------------


def test_python_version_round_trip() -> None:
    first, final = _reply_with_results(
        "Use the shell to print the Python version.", ["exit code 0\nPython 3.11.2"]
    )
    assert _commands(first) == ["python3 --version"]
    assert first.content[0]["type"] == "text" and "python3 --version" in first.content[0]["text"]
    tool_use = first.tool_uses()[0]
    assert tool_use["name"] == "bash" and tool_use["id"].startswith("toolu_off_")
    assert final.stop_reason == "end_turn"
    assert not final.tool_uses()
    assert "3.11.2" in final.text()


def test_count_files_round_trip() -> None:
    first, final = _reply_with_results("How many files are in the workspace?", ["exit code 0\n3\n"])
    assert _commands(first) == ["find . -type f | wc -l"]
    assert "3 files" in final.text()


def test_count_command_prints_one_number(tmp_path: Path) -> None:
    for name in ("a", "b", ".hidden"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c").write_text("x")
    [command] = _commands(_ask("Count the files"))
    out = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "4"


def test_list_workspace_and_summary() -> None:
    listing = (
        "exit code 0\ntotal 8\ndrwxr-xr-x 2 u u 4096 Jan 1 00:00 .\ndrwxr-xr-x 3 u u 4096 Jan 1 00:00 ..\n"
        "-rw-r--r-- 1 u u 6 Jan 1 00:00 notes.txt\n-rw-r--r-- 1 u u 6 Jan 1 00:00 my file.md\n"
    )
    first, final = _reply_with_results("List the files in the workspace", [listing])
    assert _commands(first) == ["ls -la"]
    assert "2 entries" in final.text()
    assert "notes.txt" in final.text() and "my file.md" in final.text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_create_then_read_file_really_works(tmp_path: Path) -> None:
    response = _ask("Create a file notes.txt containing hello world, then read it back.")
    commands = _commands(response)
    assert len(commands) == 2 and commands[1] == "cat notes.txt"
    assert [block["id"] for block in response.tool_uses()] == ["toolu_off_1", "toolu_off_2"]
    subprocess.run(["bash", "-c", commands[0]], cwd=tmp_path, check=True)
    assert (tmp_path / "notes.txt").read_text() == "hello world\n"
    cat = subprocess.run(
        ["bash", "-c", commands[1]], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert cat.stdout == "hello world\n"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_create_file_quotes_hostile_content(tmp_path: Path) -> None:
    [command] = _commands(_ask("Create a file x.txt containing '$(touch pwned); `id`'"))
    subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True)
    assert (tmp_path / "x.txt").read_text() == "$(touch pwned); `id`\n"
    assert not (tmp_path / "pwned").exists()


def test_create_file_summary_and_read_file_summary() -> None:
    first, final = _reply_with_results("Create a file notes.txt containing hello", ["exit code 0\n"])
    assert _commands(first) == ["printf '%s\\n' hello > notes.txt"]
    assert "notes.txt" in final.text() and "Created" in final.text()
    first, final = _reply_with_results("Read the file notes.txt", ["exit code 0\nhello\n"])
    assert _commands(first) == ["cat notes.txt"]
    assert "notes.txt contains: hello" in final.text()


def test_backticked_commands_run_verbatim_in_order() -> None:
    response = _ask("Run `echo one`, then `echo two` and `ls -l | wc -l`.")
    assert response.stop_reason == "tool_use"
    assert _commands(response) == ["echo one", "echo two", "ls -l | wc -l"]
    ids = [block["id"] for block in response.tool_uses()]
    assert len(set(ids)) == 3


def test_run_colon_and_run_the_command_forms() -> None:
    assert _commands(_ask("Run: ls -la; echo hi")) == ["ls -la; echo hi"]
    assert _commands(_ask("Run the command find .")) == ["find ."]
    assert _commands(_ask("Run the command ls -la /tmp and tell me what you see.")) == ["ls -la /tmp"]


@pytest.mark.parametrize(
    ("prompt", "command"),
    [
        ("What is the date? Use the shell.", "date"),
        ("Print the current directory using bash", "pwd"),
        ("Show disk usage in the terminal", "df -h ."),
        ("Use the shell to show the kernel name", "uname -a"),
        ("Show the environment variables in the shell", "env | sort"),
        ("Which user am I? Use the terminal.", "whoami"),
        ("List the files. What is in the workspace? Use bash.", "ls -la"),
        ('Use bash to print "hello there"', "echo 'hello there'"),
        ("Compute 2 + 3 in the shell", "python3 -c 'print(2 + 3)'"),
    ],
)
def test_small_command_table(prompt: str, command: str) -> None:
    assert _commands(_ask(prompt)) == [command]


@pytest.mark.parametrize(
    ("prompt", "command"),
    [
        ('Use the shell to print "Hello. World"', "echo 'Hello. World'"),
        ('Use bash to echo "notes.txt"', "echo notes.txt"),
        ("In the terminal, print 'dir/x.md'", "echo dir/x.md"),
        ('Say "what time is it" in the shell', "echo 'what time is it'"),
        ('Use the shell to print "the Python version"', "echo 'the Python version'"),
        ('Use the shell to print "list the files"', "echo 'list the files'"),
        ('Use the shell to print "create a file x.txt"', "echo 'create a file x.txt'"),
        ('Use the shell to print "$(touch pwned)"', "echo '$(touch pwned)'"),
    ],
)
def test_quoted_text_after_print_is_echoed_whatever_it_looks_like(prompt: str, command: str) -> None:
    assert _commands(_ask(prompt)) == [command]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_quoted_print_echoes_exactly(tmp_path: Path) -> None:
    [command] = _commands(_ask('Use the shell to print "Hello. World"'))
    out = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout == "Hello. World\n"


@pytest.mark.parametrize(
    ("prompt", "command"),
    [
        ('Read the file "Hello. World"', "cat 'Hello. World'"),
        ("Use the shell to print the file notes.txt", "cat notes.txt"),
        ("cat notes.txt", "cat notes.txt"),
        ("Read notes.txt", "cat notes.txt"),
        ("Show the contents of notes.txt", "cat notes.txt"),
        ("Show me what's in a.txt", "cat a.txt"),
        ('Use the shell to cat "my notes.txt"', "cat 'my notes.txt'"),
    ],
)
def test_only_explicit_file_words_read_a_file(prompt: str, command: str) -> None:
    assert _commands(_ask(prompt)) == [command]


def test_quoted_print_without_a_shell_word_is_not_a_file_read() -> None:
    response = _ask('Print "notes.txt"')
    assert not response.tool_uses()
    assert response.text().startswith("You asked:")


def test_echo_then_read_in_one_prompt() -> None:
    prompt = 'In bash, echo "a; b. c" then show the contents of a.txt'
    assert _commands(_ask(prompt)) == ["echo 'a; b. c'", "cat a.txt"]


def test_unmappable_shell_request_falls_back_to_ls_and_says_so() -> None:
    response = _ask("Run the tests in the shell")
    assert _commands(response) == ["ls -la"]
    assert "could not map" in response.content[0]["text"]


def test_failed_and_killed_commands_are_reported() -> None:
    _, final = _reply_with_results("Run `false`", ["exit code 1\n"])
    assert "failed with exit code 1" in final.text()
    _, final = _reply_with_results("Run `sleep 5`", ["killed: timeout after 2s\n"])
    assert "killed" in final.text() and "timeout after 2s" in final.text()
    _, final = _reply_with_results(
        "Run `cat missing`", ["exit code 1\ncat: missing: No such file or directory"]
    )
    assert "failed" in final.text() and "No such file" in final.text()


def test_generic_result_reports_first_lines_trimmed() -> None:
    output = "exit code 0\n" + "\n".join(f"line {i}" for i in range(50))
    _, final = _reply_with_results("Run `seq 50`", [output])
    assert "`seq 50` exited with code 0" in final.text()
    assert "line 0" in final.text() and "line 49" not in final.text()


@pytest.mark.parametrize(
    "result", ["exit code 0\n(no output)", "exit code 0\n(no output)\n", "exit code 0\n", "exit code 0"]
)
def test_command_with_no_output_printed_nothing(result: str) -> None:
    _, final = _reply_with_results("Run `true`", [result])
    assert final.text() == "The command `true` exited with code 0 and printed nothing."
    assert "(no output)" not in final.text()


def test_no_output_marker_from_the_sandbox_reads_as_nothing() -> None:
    def result(exit_code: int | None, **kwargs: Any) -> str:
        fields = {"truncated": False, "timed_out": False, "cancelled": False, "duration_seconds": 0.1}
        fields.update(kwargs)
        return CommandResult(exit_code=exit_code, output="", limit=None, **fields).for_model()

    assert result(0).endswith("(no output)")  # the marker this test is about
    _, final = _reply_with_results("Run `true`", [result(0)])
    assert "printed nothing" in final.text() and "(no output)" not in final.text()
    _, final = _reply_with_results("Run `false`", [result(1)])
    assert final.text() == "The command `false` failed with exit code 1 and printed nothing."
    _, final = _reply_with_results("Read the file empty.txt", [result(0)])
    assert final.text() == "The file empty.txt is empty."
    _, final = _reply_with_results("List the files in the workspace", [result(0)])
    assert final.text() == "The workspace is empty."
    _, final = _reply_with_results("Run `sleep 5`", ["killed: timeout after 2s\n(no output)"])
    assert "killed (timeout after 2s) and printed nothing." in final.text()
    # Real output that merely contains the words is still quoted.
    _, final = _reply_with_results("Run `echo x`", ["exit code 0\nlog: (no output) yet"])
    assert "printed: log: (no output) yet" in final.text()


def test_tool_result_as_text_blocks_and_ids_stay_unique_across_turns() -> None:
    provider = OfflineProvider()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Run `echo hi`"}]
    first = provider.complete(_request(messages))
    messages += [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": first.tool_uses()[0]["id"],
                    "content": [{"type": "text", "text": "exit code 0\nhi"}],
                }
            ],
        },
    ]
    final = provider.complete(_request(messages))
    assert final.stop_reason == "end_turn" and "printed: hi" in final.text()
    messages += [{"role": "assistant", "content": final.content}, {"role": "user", "content": "Run `pwd`"}]
    second = provider.complete(_request(messages))
    assert _commands(second) == ["pwd"]
    assert second.tool_uses()[0]["id"] != first.tool_uses()[0]["id"]


def test_follow_up_prompt_is_answered_on_its_own() -> None:
    provider = OfflineProvider()
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Use the shell to print the Python version."}
    ]
    first = provider.complete(_request(messages))
    result = {
        "type": "tool_result",
        "tool_use_id": first.tool_uses()[0]["id"],
        "content": "exit code 0\nPython 3.11.2",
    }
    messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}]
    final = provider.complete(_request(messages))
    messages += [
        {"role": "assistant", "content": final.content},
        {"role": "user", "content": "What is 6 * 7?"},
    ]
    follow_up = provider.complete(_request(messages))
    assert follow_up.stop_reason == "end_turn"
    assert follow_up.text() == "6 * 7 = 42."
    messages += [
        {"role": "assistant", "content": follow_up.content},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]},
    ]
    assert "capital of France" in provider.complete(_request(messages)).text()


# --- arithmetic -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [
        ("What is 2 + 2?", "2 + 2 = 4."),
        ("What is 2 + 3 * 4?", "2 + 3 * 4 = 14."),
        ("What is (2 + 3) * 4?", "(2 + 3) * 4 = 20."),
        ("compute (3*7) - 4", "(3*7) - 4 = 17."),
        ("12 / 4", "12 / 4 = 3."),
        ("What is 10 / 4?", "10 / 4 = 2.5."),
        ("1/3", "1/3 = 0.333333333333."),
        ("7 // 2", "7 // 2 = 3."),
        ("17 % 5", "17 % 5 = 2."),
        ("2^10", "2^10 = 1024."),
        ("2**10", "2**10 = 1024."),
        ("What is -3 + 5?", "-3 + 5 = 2."),
        ("What is 3 plus 4 times 2?", "3 + 4 * 2 = 11."),
        ("3 times 4", "3 * 4 = 12."),
        ("what is 6 * 7?", "6 * 7 = 42."),
        ("What's 2-3?", "2-3 = -1."),
        ("how much is 5 x 3?", "5 * 3 = 15."),
        ("Please calculate: 3*(4+1).", "3*(4+1) = 15."),
        ("evaluate 2 ** 8", "2 ** 8 = 256."),
        ("solve 12/4/2", "12/4/2 = 1.5."),
        ("2+2=?", "2+2 = 4."),
        ("Hey, what is 6 * 7? I need it for homework.", "6 * 7 = 42."),
        ("What is 3 x 4 and 2 to the power of 10 and 5 squared?", "3 * 4 = 12; 2**10 = 1024; 5**2 = 25."),
        ("12 / 4, 2^3", "12 / 4 = 3; 2^3 = 8."),
    ],
)
def test_arithmetic(prompt: str, answer: str) -> None:
    response = _ask(prompt)
    assert response.stop_reason == "end_turn"
    assert not response.tool_uses()
    assert response.text() == answer


@pytest.mark.parametrize(
    "prompt",
    [
        "Plan a 2-3 day trip to Rome",
        "Plan a 2 - 3 day trip to Rome",
        "Book a table for 4-6 people",
        "Pages 10-20 of the report are missing",
        "The meeting is on 2024-01-05",
        "The meeting is on 2024-10-15",
        "What is 2024-10-15?",
        "What happened on 1/5/2024?",
        "What is new in Python 3.11.2?",
        "Upgrade from 3.11.2 - 1 to 3.12",
        "Call me at 555-123-4567",
        "What is 555-123-4567?",
        "I ate 3/4 of the pie",
        "Give me 5 tips",
        "Hi. 2+2 apples",
    ],
)
def test_numbers_in_prose_are_restated_not_computed(prompt: str) -> None:
    response = _ask(prompt)
    assert response.stop_reason == "end_turn"
    assert not response.tool_uses()
    assert response.text().startswith(f'You asked: "{prompt}"')
    assert " = " not in response.text()


def test_shell_arithmetic_follows_the_same_rule() -> None:
    assert _commands(_ask("Use bash to compute 2 ** 100")) == ["python3 -c 'print(2 ** 100)'"]
    assert _commands(_ask("2 ** 100 in the shell")) == ["python3 -c 'print(2 ** 100)'"]
    # A range in a shell request is not a sum: the request is unmapped and lists the workspace.
    assert _commands(_ask("Run the tests for 2-3 minutes in the shell")) == ["ls -la"]


def test_arithmetic_refuses_division_by_zero_and_huge_powers_before_computing_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nodus_ray.models.offline import arithmetic

    assert "division by zero" in _ask("What is 1 / 0?").text()
    computed: list[int | float | complex] = []
    checked = arithmetic._checked

    def recording(value: int | float | complex) -> int | float:
        computed.append(value)
        return checked(value)

    monkeypatch.setattr(arithmetic, "_checked", recording)
    assert "too large" in _ask("What is 9**9**9?").text()
    assert "too large" in _ask("2 ** 100000").text()
    # Refused from the operands: 9**387420489 was never computed (it would take minutes), only
    # the inner 9**9.
    assert computed == [9**9]


def test_dangerous_expression_is_never_evaluated(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("eval/exec must not be used")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    text = _ask("What is __import__('os').system('echo pwned') + 1?").text()
    assert text.startswith("You asked:")
    assert _ask("What is 2 + 2?").text() == "2 + 2 = 4."


# --- restating ------------------------------------------------------------------------------------


def test_restates_other_prompts() -> None:
    response = _ask("What is the capital of France?")
    assert response.stop_reason == "end_turn"
    assert not response.tool_uses()
    assert response.text().startswith('You asked: "What is the capital of France?"')
    assert "offline" in response.text()


def test_restating_truncates_long_prompts() -> None:
    text = _ask("Tell me a story about " + "dragons " * 500).text()
    assert len(text) < 300
    assert "..." in text


def test_question_about_a_command_is_not_run() -> None:
    assert not _ask("What does `ls -la` do?").tool_uses()


# --- determinism, budget, usage, latency ----------------------------------------------------------


@pytest.mark.parametrize(
    "prompt",
    ["Run `echo a` and `echo b`", "What is 2 + 2?", "What is the capital of France?", "List the workspace"],
)
def test_deterministic(prompt: str) -> None:
    request = _request([{"role": "user", "content": prompt}])
    first, second = OfflineProvider().complete(request), OfflineProvider().complete(request)
    assert first == second
    assert first.to_dict() == second.to_dict()
    assert ModelResponse.from_dict(first.to_dict()) == first


def test_usage_is_an_estimate_that_grows_with_input() -> None:
    short = _ask("What is the capital of France?")
    long = _ask("What is the capital of France? " + "Please answer carefully. " * 40)
    assert short.usage.input_tokens > 0 and short.usage.output_tokens > 0
    assert long.usage.input_tokens > short.usage.input_tokens
    assert short.usage.output_tokens == math.ceil(len(short.text()) / 4)
    assert short.usage.cache_creation_input_tokens == 0 and short.usage.cache_read_input_tokens == 0
    with_system = _ask("What is the capital of France?", system="x" * 400)
    assert with_system.usage.input_tokens == short.usage.input_tokens + 100
    # The tool definitions count too: a request without tools is cheaper.
    no_tools = OfflineProvider().complete(
        ModelRequest(
            model=MODEL, system="", messages=[{"role": "user", "content": "hi"}], max_tokens=100, tools=[]
        )
    )
    with_tools = _ask("hi", max_tokens=100)
    assert with_tools.usage.input_tokens > no_tools.usage.input_tokens >= 1
    assert BASH_TOOL in _request([]).tools


def test_max_tokens_cuts_text() -> None:
    response = _ask("What is the capital of France?", max_tokens=5)
    assert response.stop_reason == "max_tokens"
    assert 0 < len(response.text()) <= 20
    assert response.usage.output_tokens <= 5
    assert _ask("What is the capital of France?", max_tokens=1000).stop_reason == "end_turn"


def test_max_tokens_drops_tool_calls_that_do_not_fit() -> None:
    response = _ask("Run `echo a` and `echo b`", max_tokens=3)
    assert response.stop_reason == "max_tokens"
    assert not response.tool_uses()


def test_latency_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = OfflineProvider(latency_seconds=0.2)
    slept: list[float] = []
    monkeypatch.setattr("nodus_ray.models.offline.provider.time.sleep", slept.append)
    provider.complete(_request([{"role": "user", "content": "hi"}]))
    assert slept == [0.2]  # the call waits its latency, once
    OfflineProvider().complete(_request([{"role": "user", "content": "hi"}]))
    assert slept == [0.2]  # no latency, no wait
    with pytest.raises(ValueError):
        OfflineProvider(latency_seconds=-1)


def test_an_exit_header_with_a_limit_note_is_still_read() -> None:
    from nodus_ray.models.base import ModelRequest
    from nodus_ray.models.offline import OfflineProvider

    messages = [
        {"role": "user", "content": "Use the shell to run `yes | head -c 100000000`"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_off_1",
                    "name": "bash",
                    "input": {"command": "yes | head -c 100000000"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_off_1",
                    "content": "exit code 0 (output limit exceeded)\ny\ny",
                }
            ],
        },
    ]
    answer = (
        OfflineProvider()
        .complete(ModelRequest(model="offline-haiku", system="", messages=messages, max_tokens=1024))
        .text()
    )
    assert "exited with code 0" in answer
    assert "no exit code" not in answer
