"""Sealed secrets and the credit ledger, on real local storage."""

from __future__ import annotations

import base64
import os
import stat
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidTag

from nodus.resources import parse_resource
from nodus_ray.control.secrets import SecretStore
from nodus_ray.money.credits import CreditLedger
from nodus_ray.store.secret_box import SecretBox, load_or_create_key
from nodus_ray.store.storage import Storage

VALUE = "sk-ant-unit-test-value-0123456789"


def _secret(name: str, **values: str) -> object:
    return parse_resource(
        {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": name}, "stringData": values}
    )


def test_the_key_file_is_created_private_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODUS_SECRET_KEY", raising=False)
    path = tmp_path / "keys" / "secret.key"
    first = load_or_create_key(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_key(str(path)) == first and len(first) == 32
    monkeypatch.setenv("NODUS_SECRET_KEY", base64.b64encode(b"x" * 32).decode())
    assert load_or_create_key(str(path)) == b"x" * 32


def test_sealed_values_open_only_in_their_own_context(tmp_path: Path) -> None:
    box = SecretBox(os.urandom(32))
    envelope = box.seal({"ANTHROPIC_API_KEY": VALUE}, context="p/a")
    assert VALUE not in str(envelope)
    assert box.open(envelope, context="p/a") == {"ANTHROPIC_API_KEY": VALUE}
    with pytest.raises(InvalidTag):
        box.open(envelope, context="p/b")  # an envelope copied onto another secret does not open
    with pytest.raises(InvalidTag):
        SecretBox(os.urandom(32)).open(envelope, context="p/a")


def test_the_store_never_writes_or_shows_a_value(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path / "store"))
    store = SecretStore(storage, SecretBox(os.urandom(32)))
    view, result = store.apply("p", _secret("anthropic-key", ANTHROPIC_API_KEY=VALUE), create_only=True)
    assert result == "created" and view["status"]["keys"] == ["ANTHROPIC_API_KEY"]
    assert VALUE not in str(view) and VALUE not in str(store.list("p"))
    on_disk = b"".join(p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert VALUE.encode() not in on_disk
    assert store.values("p", "anthropic-key") == {"ANTHROPIC_API_KEY": VALUE}
    assert (
        store.apply("p", _secret("anthropic-key", ANTHROPIC_API_KEY=VALUE), create_only=False)[1]
        == "unchanged"
    )
    assert (
        store.apply("p", _secret("anthropic-key", ANTHROPIC_API_KEY="other"), create_only=False)[1]
        == "configured"
    )
    reloaded = SecretStore(storage, store._box)  # noqa: SLF001 - the same operator key after a restart
    reloaded.load()
    assert reloaded.values("p", "anthropic-key") == {"ANTHROPIC_API_KEY": "other"}
    store.set_server_key(VALUE)
    assert store.server_key() == VALUE
    store.set_server_key(None)
    assert store.server_key() is None


def test_spend_is_derived_from_run_totals_and_never_counted_twice(tmp_path: Path) -> None:
    ledger = CreditLedger(Storage(str(tmp_path)), Decimal("1.00"))
    ledger.record_run_spend("p", "a", Decimal("0.10"))
    ledger.record_run_spend("p", "a", Decimal("0.10"))  # a replayed report
    ledger.record_run_spend("p", "b", Decimal("0.05"))
    assert ledger.view("p")["balanceUSD"] == "0.85"
    ledger.forget_run("p", "a")  # a deleted run's spend stays spent
    again = CreditLedger(Storage(str(tmp_path)), Decimal("1.00"))
    again.record_run_spend("p", "b", Decimal("0.05"))
    assert again.view("p")["balanceUSD"] == "0.85"


def test_a_group_deleted_in_parallel_keeps_every_deleted_runs_spend_after_a_restart(tmp_path: Path) -> None:
    """Found by benchmarks/chaos.py: a group's members are forgotten from several threads at
    once; a slower save of an older total landed last, and a restart lost a deleted run's spend."""
    import random
    import threading
    import time

    class SlowStorage(Storage):
        def write_json(self, key: str, value: Any) -> None:
            time.sleep(random.uniform(0, 0.01))
            super().write_json(key, value)

    ledger = CreditLedger(SlowStorage(str(tmp_path)), Decimal("1.00"))
    for i in range(8):
        ledger.record_run_spend("p", f"r{i}", Decimal("0.000016"))
    threads = [threading.Thread(target=ledger.forget_run, args=("p", f"r{i}")) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ledger.view("p")["spentUSD"] == "0.000128"
    assert CreditLedger(Storage(str(tmp_path)), Decimal("1.00")).view("p")["spentUSD"] == "0.000128"


def test_reservations_keep_concurrent_runs_from_overdrawing(tmp_path: Path) -> None:
    ledger = CreditLedger(Storage(str(tmp_path)), Decimal("1.00"))
    assert ledger.reserve("p", "a", Decimal("0.60"))
    assert not ledger.reserve("p", "b", Decimal("0.60"))
    ledger.record_run_spend("p", "a", Decimal("0.20"))  # a's call finished: its hold is released
    assert ledger.reserve("p", "b", Decimal("0.60"))
    assert ledger.view("p")["reservedUSD"] == "0.60"


def test_adding_credits_makes_a_refused_hold_fit(tmp_path: Path) -> None:
    ledger = CreditLedger(Storage(str(tmp_path)), Decimal("0"))
    assert not ledger.reserve("p", "a", Decimal("1.5"))
    ledger.add("p", Decimal("2"))
    assert ledger.reserve("p", "a", Decimal("1.5"))
    assert ledger.view("p")["reservedUSD"] == "1.5"


def test_the_operators_key_reaches_the_key_file_the_control_plane_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nodus_ray.store.secret_box import install_configured_key

    key = bytes(range(32))
    file = tmp_path / "nodus" / "secret.key"
    monkeypatch.delenv("NODUS_SECRET_KEY", raising=False)
    assert install_configured_key(str(file)) is False and not file.exists()
    monkeypatch.setenv("NODUS_SECRET_KEY", base64.b64encode(key).decode())
    assert install_configured_key(str(file)) is True
    assert oct(file.stat().st_mode & 0o777) == "0o600"
    monkeypatch.delenv("NODUS_SECRET_KEY")  # what the control plane sees: no variable, the file
    assert load_or_create_key(str(file)) == key
    monkeypatch.setenv("NODUS_SECRET_KEY", base64.b64encode(bytes(32)).decode())
    with pytest.raises(ValueError, match="differs from the key"):
        install_configured_key(str(file))
    monkeypatch.setenv("NODUS_SECRET_KEY", "not base64!")
    with pytest.raises(ValueError, match="base64 of 32 random bytes"):
        install_configured_key(str(tmp_path / "other.key"))
