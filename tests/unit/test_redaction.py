"""Secret values never survive into what a run records."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nodus_ray.core.redaction import Redactor

KEY = "sk-ant-api03-0123456789abcdef"


def test_every_occurrence_is_masked_with_the_secrets_name() -> None:
    redact = Redactor({"db/PASSWORD": "hunter2-long", "anthropic/ANTHROPIC_API_KEY": KEY})
    text = f"key={KEY}\npassword: hunter2-long and again {KEY}"
    assert redact(text) == (
        "key=[REDACTED:anthropic/ANTHROPIC_API_KEY]\npassword: [REDACTED:db/PASSWORD] "
        "and again [REDACTED:anthropic/ANTHROPIC_API_KEY]"
    )
    assert "hunter2" not in repr(redact)


def test_a_multi_line_value_is_masked_whole_and_line_by_line() -> None:
    pem = "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END KEY-----"
    redact = Redactor({"tls/KEY": pem})
    assert redact(f"x{pem}y") == "x[REDACTED:tls/KEY]y"
    assert redact("line: MIIEvQIBADANBgkqhkiG9w0BAQEFAASC") == "line: [REDACTED:tls/KEY]"


def test_a_value_cut_by_the_output_limit_is_masked_at_the_cut() -> None:
    redact = Redactor({"s/TOKEN": KEY})
    cut = f"lots of output {KEY[:12]}\n[output truncated: 900 more bytes not shown]"
    assert redact(cut) == "lots of output [REDACTED:s/TOKEN]\n[output truncated: 900 more bytes not shown]"


def test_values_too_short_to_mask_safely_are_left_and_nothing_else_changes() -> None:
    redact = Redactor({"s/PIN": "123"})
    assert not redact and redact("1234 123") == "1234 123"
    assert Redactor({"s/A": "abcd"}).tree({"content": [{"text": "xabcdx", "n": 1}]}) == {
        "content": [{"text": "x[REDACTED:s/A]x", "n": 1}]
    }


@given(st.text(), st.text(min_size=4, max_size=40).filter(lambda v: v.strip() == v and "\n" not in v))
def test_no_value_survives_in_any_text(prefix: str, value: str) -> None:
    masked = Redactor({"s/K": value})(prefix + value + prefix)
    assert value not in masked.replace("[REDACTED:s/K]", "\x00")
