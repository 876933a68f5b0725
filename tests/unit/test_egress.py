"""The egress policy: which entries are valid, what they match, which addresses stay closed.

Pure: no sockets. The proxy itself is tested in tests/integration/test_egress_proxy.py.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from nodus.egress_policy import (
    MAX_ALLOWED_HOSTS,
    EgressPolicy,
    is_public_address,
    parse_private_networks,
    validate_allowed_host,
    validate_allowed_hosts,
)
from nodus_ray.egress.proxy import EgressRecord
from nodus_ray.egress.wiring import (
    SANDBOX_EGRESS_DIR,
    SANDBOX_FORWARDER,
    SANDBOX_SOCKET,
    bwrap_args,
    proxy_env,
    wrap_argv,
)

ip = ipaddress.ip_address


@pytest.mark.parametrize(
    ("entry", "normal"),
    [
        ("example.com", "example.com"),
        ("API.Example.COM.", "api.example.com"),
        ("example.com:443", "example.com:443"),
        ("*.example.com", "*.example.com"),
        ("*.Example.com:8443", "*.example.com:8443"),
        ("93.184.216.34", "93.184.216.34"),
        ("93.184.216.34:80", "93.184.216.34:80"),
        ("2001:db8:0::1", "2001:db8::1"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("[2001:DB8::1]:443", "[2001:db8::1]:443"),
        ("_dmarc.example.com", "_dmarc.example.com"),
        ("localhost", "localhost"),  # valid as an entry; the address rule still refuses it
    ],
)
def test_valid_entries_are_normalized(entry: str, normal: str) -> None:
    assert validate_allowed_host(entry) == normal


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("", "at most"),
        (" example.com", "without spaces"),
        ("exa mple.com", "without spaces"),
        ("bücher.de", "punycode"),
        ("*", "not a valid host name"),
        ("*.com", "at least two labels"),
        ("foo.*.example.com", "not a valid host name"),
        ("*example.com", "not a valid host name"),
        ("example.com:0", "port"),
        ("example.com:65536", "port"),
        ("example.com:http", "port"),
        ("example.com:", "port"),
        ("-bad.example.com", "not a valid host name"),
        ("example..com", "not a valid host name"),
        ("127.1", "last label not all digits"),
        ("2130706433", "last label not all digits"),
        ("2001:db8::1:443", None),  # valid IPv6 in fact: 2001:db8::1:443 (no port)
        ("[2001:db8::1", "expected [IPv6]"),
        ("[example.com]:80", "not an IPv6 address"),
        ("1:2:3", "not an IPv6 address"),
        ("a" * 64 + ".com", "not a valid host name"),
        ("http://example.com", "not a URL"),
        ("example.com/path", "not a URL"),
        ("user@example.com", "not a URL"),
    ],
)
def test_invalid_entries_say_what_is_wrong(entry: str, words: str | None) -> None:
    if words is None:
        assert validate_allowed_host(entry) == entry
        return
    with pytest.raises(ValueError, match="allowed host") as info:
        validate_allowed_host(entry)
    assert words in str(info.value)


def test_non_strings_and_too_many_entries_are_refused() -> None:
    with pytest.raises(ValueError, match="must be a string"):
        validate_allowed_host(443)
    with pytest.raises(ValueError, match="must be a list"):
        validate_allowed_hosts("example.com")
    assert validate_allowed_hosts([f"h{i}.example.com" for i in range(MAX_ALLOWED_HOSTS)])
    with pytest.raises(ValueError, match=f"at most {MAX_ALLOWED_HOSTS}"):
        validate_allowed_hosts([f"h{i}.example.com" for i in range(MAX_ALLOWED_HOSTS + 1)])
    with pytest.raises(ValueError, match="at most"):
        EgressPolicy(tuple(f"h{i}.example.com" for i in range(MAX_ALLOWED_HOSTS + 1)))


def test_exact_names_ignore_case_and_a_trailing_dot_and_allow_any_port() -> None:
    policy = EgressPolicy.from_settings(["Example.com."], "")
    assert policy.allowed_hosts == ("example.com",)
    for host in ("example.com", "EXAMPLE.com", "example.com."):
        assert policy.allows(host, 443)
        assert policy.allows(host, 8080)
    for host in ("www.example.com", "example.com.evil.org", "notexample.com", "example.co", ""):
        assert not policy.allows(host, 443)


def test_wildcards_match_subdomains_at_any_depth_but_not_the_domain() -> None:
    policy = EgressPolicy.from_settings(["*.example.com"], "")
    assert policy.allows("api.example.com", 443)
    assert policy.allows("a.b.example.com", 443)
    assert policy.allows("API.Example.com.", 443)
    assert not policy.allows("example.com", 443)
    assert not policy.allows("badexample.com", 443)
    assert not policy.allows("example.com.evil.org", 443)
    assert not policy.allows("bad host.example.com", 443)  # not a valid name, so never matched


def test_a_port_suffix_restricts_the_port() -> None:
    policy = EgressPolicy.from_settings(["example.com:443", "*.example.org:8443", "10.0.0.1:22"], "")
    assert policy.allows("example.com", 443)
    assert not policy.allows("example.com", 80)
    assert policy.allows("x.example.org", 8443)
    assert not policy.allows("x.example.org", 443)
    assert policy.allows("10.0.0.1", 22)
    assert not policy.allows("10.0.0.1", 23)


def test_ip_literals_match_only_the_same_address() -> None:
    policy = EgressPolicy.from_settings(["93.184.216.34", "[2001:db8::1]:443"], "")
    assert policy.allows("93.184.216.34", 1)
    assert policy.allows("2001:db8:0:0::1", 443)
    assert policy.allows("[2001:db8::1]", 443)
    assert not policy.allows("2001:db8::1", 80)
    # Other spellings of an address are names that are not valid, so they never match.
    for host in ("93.184.216.034", "1572395042", "0x5d.0xb8.0xd8.0x22", "93.184.55330"):
        assert not policy.allows(host, 1)
    assert not policy.allows("fe80::1%eth0", 443)


def test_names_do_not_match_address_entries_or_the_reverse() -> None:
    policy = EgressPolicy.from_settings(["example.com", "127.0.0.1"], "")
    assert not policy.allows("93.184.216.34", 443)  # what example.com might resolve to
    assert not policy.allows("localhost", 443)  # what resolves to 127.0.0.1


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fd00::1",
        "fec0::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "64:ff9b::7f00:1",
        "2002:7f00:1::1",
        "::7f00:1",
    ],
)
def test_private_and_special_addresses_are_not_public(address: str) -> None:
    assert not is_public_address(ip(address))
    assert not EgressPolicy(("example.com",)).address_allowed(ip(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1", "::ffff:8.8.8.8"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert is_public_address(ip(address))
    assert EgressPolicy(("example.com",)).address_allowed(ip(address))


def test_only_the_operators_networks_open_private_addresses() -> None:
    policy = EgressPolicy.from_settings(["db.internal"], "10.0.0.0/8, 127.0.0.1/32 ,fd00::/8")
    assert policy.address_allowed(ip("10.20.30.40"))
    assert policy.address_allowed(ip("::ffff:10.20.30.40"))  # judged as the IPv4 address it is
    assert policy.address_allowed(ip("127.0.0.1"))
    assert policy.address_allowed(ip("fd12::1"))
    assert not policy.address_allowed(ip("127.0.0.2"))
    assert not policy.address_allowed(ip("169.254.169.254"))
    assert not policy.address_allowed(ip("::1"))


def test_private_networks_come_from_the_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODUS_EGRESS_PRIVATE_NETWORKS", "192.168.0.0/16")
    assert EgressPolicy.from_settings([]).private_networks == (ipaddress.ip_network("192.168.0.0/16"),)
    monkeypatch.delenv("NODUS_EGRESS_PRIVATE_NETWORKS")
    assert EgressPolicy.from_settings([]).private_networks == ()


def test_private_network_setting_is_parsed_leniently_but_never_silently_wrong() -> None:
    assert parse_private_networks("") == ()
    assert parse_private_networks(" , ") == ()
    assert parse_private_networks("10.1.2.3/8,10.0.0.5") == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("10.0.0.5/32"),
    )
    with pytest.raises(ValueError, match="NODUS_EGRESS_PRIVATE_NETWORKS: 'internal'"):
        parse_private_networks("10.0.0.0/8,internal")
    with pytest.raises(ValueError, match="allowed host"):
        EgressPolicy.from_settings(["*"], "")


def test_record_dict_has_the_camel_case_keys_and_nothing_else() -> None:
    record = EgressRecord(
        "example.com", 443, "refused", "HostNotAllowed", 0, 0, 0.01, "2024-01-01T00:00:00Z", "CONNECT"
    )
    assert record.to_dict() == {
        "host": "example.com",
        "port": 443,
        "outcome": "refused",
        "reason": "HostNotAllowed",
        "bytesUp": 0,
        "bytesDown": 0,
        "durationSeconds": 0.01,
        "startedAt": "2024-01-01T00:00:00Z",
        "method": "CONNECT",
    }


def test_sandbox_wiring() -> None:
    env = proxy_env()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        assert env[name] == "http://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1"
    args = bwrap_args(Path("/run/nodus/egress-1.sock"))
    assert args[:4] == ["--perms", "0755", "--dir", SANDBOX_EGRESS_DIR]  # enterable by the sandbox uid
    assert args[4:7] == ["--ro-bind", "/run/nodus/egress-1.sock", SANDBOX_SOCKET]
    assert args[7] == "--ro-bind" and Path(args[8]).is_file() and args[9] == SANDBOX_FORWARDER
    assert wrap_argv(["/bin/bash", "-c", "echo hi"]) == [
        "/usr/bin/python3",
        "-I",
        "-S",
        SANDBOX_FORWARDER,
        "--listen",
        "127.0.0.1:3128",
        "--socket",
        SANDBOX_SOCKET,
        "--",
        "/bin/bash",
        "-c",
        "echo hi",
    ]
