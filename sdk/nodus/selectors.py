"""Label and field selectors, Kubernetes' grammar: parsed once, matched the same everywhere.

The server is the authority (the control plane filters before a page crosses Ray), but the CLI
and the SDK parse the same text first, so a selector that does not parse is refused on the
caller's machine with the same message the API would give. That is why the parser lives in the
SDK (the server imports the SDK, never the other way round) and is pure: no I/O, no clock.

Label selectors (``metadata.labels``): ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``,
``k notin (a,b)``, ``k`` (has the label), ``!k`` (has not); a comma is AND. As in Kubernetes,
``k!=v`` and ``k notin (...)`` match an object without the label.

Field selectors: ``status.phase``, ``status.reason``, ``spec.agent``, ``spec.group`` and
``metadata.name`` with ``=``, ``==`` or ``!=``, and ``metadata.creationTimestamp`` with ``=``,
``>``, ``>=``, ``<`` or ``<=`` against an RFC 3339 time; which fields a kind has is `FIELDS`.

Labels themselves are checked here too (`validate_labels`), with Kubernetes' rules, so a label
that no selector could name is refused when the resource is written.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from operator import eq, ge, gt, le, lt, ne
from typing import Any

from .errors import BadRequest
from .lifecycle import GroupPhase, RunPhase

__all__ = [
    "LabelOperator",
    "LabelRequirement",
    "LabelSelector",
    "FieldOperator",
    "FieldRequirement",
    "FieldSelector",
    "FieldSpec",
    "FIELDS",
    "MAX_LIMIT",
    "parse_label_selector",
    "parse_field_selector",
    "parse_limit",
    "canonical_time",
    "validate_labels",
    "label_problem",
]

MAX_LIMIT = 1000  # the most items one page may ask for
_MAX_SELECTOR = 4096  # characters of one selector: far more than any real one

# A label name (the part after an optional DNS-subdomain prefix and '/'), and a label value.
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _key_problem(key: str) -> str | None:
    """Why ``key`` is not a label key (``[prefix/]name``), or None when it is one."""
    if not isinstance(key, str):
        return "a label key must be a string"
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _PREFIX.match(prefix)):
        return f"label key {key!r}: the prefix before '/' must be a DNS subdomain of at most 253 characters"
    if not _NAME.match(name):
        return (
            f"label key {key!r}: the name must be 1-63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def _value_problem(key: str, value: Any) -> str | None:
    if not isinstance(value, str):
        return f"label {key!r}: the value must be a string"
    if not _VALUE.match(value):
        return (
            f"label {key!r}: value {value!r} must be at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit (or empty)"
        )
    return None


def label_problem(key: str, value: Any) -> str | None:
    """Why ``key: value`` is not a valid label, or None."""
    return _key_problem(key) or _value_problem(key, value)


def validate_labels(labels: dict[str, str]) -> dict[str, str]:
    """``metadata.labels`` as Kubernetes allows them; raises ValueError naming the first bad one
    (the schemas turn it into ``Invalid`` naming ``metadata.labels``)."""
    for key, value in labels.items():
        problem = label_problem(key, value)
        if problem:
            raise ValueError(problem)
    return labels


def _refuse(field: str, message: str) -> BadRequest:
    return BadRequest(f"{field}: {message}", details={"field": field})


# -- label selectors --------------------------------------------------------------------------


class LabelOperator(StrEnum):
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    operator: LabelOperator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        match self.operator:
            case LabelOperator.EQUALS | LabelOperator.IN:
                return has and value in self.values
            case LabelOperator.NOT_EQUALS | LabelOperator.NOT_IN:
                return not has or value not in self.values
            case LabelOperator.EXISTS:
                return has
            case LabelOperator.DOES_NOT_EXIST:
                return not has

    def __str__(self) -> str:
        match self.operator:
            case LabelOperator.EXISTS:
                return self.key
            case LabelOperator.DOES_NOT_EXIST:
                return f"!{self.key}"
            case LabelOperator.IN | LabelOperator.NOT_IN:
                return f"{self.key} {self.operator} ({','.join(self.values)})"
            case _:
                return f"{self.key}{self.operator}{self.values[0]}"


@dataclass(frozen=True)
class LabelSelector:
    """Requirements that must all hold; empty selects everything."""

    requirements: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        return all(requirement.matches(labels or {}) for requirement in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(requirement) for requirement in self.requirements)

    def __bool__(self) -> bool:
        return bool(self.requirements)


def _split_top_level(text: str, field: str) -> list[str]:
    """Split on the commas outside parentheses (those inside separate a set's values)."""
    parts: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
            if depth > 1:
                raise _refuse(field, f"{text!r}: parentheses may not nest")
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise _refuse(field, f"{text!r}: ')' without '('")
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    if depth:
        raise _refuse(field, f"{text!r}: '(' without ')'")
    parts.append(text[start:])
    return [part.strip() for part in parts]


_SET = re.compile(r"^(?P<key>\S+?)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQUALITY = re.compile(r"^(?P<key>[^=!\s]+)\s*(?P<op>==|!=|=)\s*(?P<value>[^=!\s]*)$")


def _checked_key(key: str, field: str, part: str) -> str:
    problem = _key_problem(key)
    if problem:
        raise _refuse(field, f"{part!r}: {problem}")
    return key


def _checked_value(key: str, value: str, field: str, part: str) -> str:
    problem = _value_problem(key, value)
    if problem:
        raise _refuse(field, f"{part!r}: {problem}")
    return value


def _label_requirement(part: str, field: str) -> LabelRequirement:
    if not part:
        raise _refuse(field, "an empty requirement (two commas, or one at either end)")
    match = _SET.match(part)
    if match:
        key = _checked_key(match["key"], field, part)
        values = tuple(value.strip() for value in match["values"].split(","))
        if values == ("",):
            raise _refuse(field, f"{part!r}: the set of values is empty")
        for value in values:
            _checked_value(key, value, field, part)
        return LabelRequirement(key, LabelOperator(match["op"]), tuple(sorted(set(values))))
    match = _EQUALITY.match(part)
    if match:
        key = _checked_key(match["key"], field, part)
        value = _checked_value(key, match["value"], field, part)
        operator = LabelOperator.NOT_EQUALS if match["op"] == "!=" else LabelOperator.EQUALS
        return LabelRequirement(key, operator, (value,))
    if part.startswith("!"):
        return LabelRequirement(_checked_key(part[1:].strip(), field, part), LabelOperator.DOES_NOT_EXIST)
    if re.fullmatch(r"\S+", part) and not any(char in part for char in "=!()"):
        return LabelRequirement(_checked_key(part, field, part), LabelOperator.EXISTS)
    raise _refuse(
        field,
        f"{part!r} does not parse; a requirement is k=v, k==v, k!=v, 'k in (a,b)', 'k notin (a,b)', k or !k",
    )


def parse_label_selector(text: str | None, *, field: str = "labelSelector") -> LabelSelector:
    """The selector ``text`` means; raises `BadRequest` (400) naming ``field`` when it does not parse."""
    if text is None or not text.strip():
        return LabelSelector()
    if len(text) > _MAX_SELECTOR:
        raise _refuse(field, f"the selector is {len(text)} characters; at most {_MAX_SELECTOR}")
    return LabelSelector(tuple(_label_requirement(part, field) for part in _split_top_level(text, field)))


# -- field selectors --------------------------------------------------------------------------


class FieldOperator(StrEnum):
    EQUALS = "="
    NOT_EQUALS = "!="
    GREATER = ">"
    GREATER_OR_EQUAL = ">="
    LESS = "<"
    LESS_OR_EQUAL = "<="


_ORDERING = frozenset(
    {FieldOperator.GREATER, FieldOperator.GREATER_OR_EQUAL, FieldOperator.LESS, FieldOperator.LESS_OR_EQUAL}
)


@dataclass(frozen=True)
class FieldSpec:
    """One selectable field: where it is in a resource, whether it is a time, its allowed values."""

    path: tuple[str, ...]
    time: bool = False
    values: tuple[str, ...] = ()  # empty: any string


_NAME_FIELD = FieldSpec(("metadata", "name"))
_CREATED = FieldSpec(("metadata", "creationTimestamp"), time=True)

# The fields each kind can be selected on (the kind's REST plural as the key).
FIELDS: Mapping[str, Mapping[str, FieldSpec]] = {
    "agentruns": {
        "status.phase": FieldSpec(("status", "phase"), values=tuple(RunPhase)),
        "status.reason": FieldSpec(("status", "reason")),
        "spec.agent": FieldSpec(("spec", "agent")),
        "spec.group": FieldSpec(("spec", "group")),
        "metadata.name": _NAME_FIELD,
        "metadata.creationTimestamp": _CREATED,
    },
    "agentgroups": {
        "status.phase": FieldSpec(("status", "phase"), values=tuple(GroupPhase)),
        "status.reason": FieldSpec(("status", "reason")),
        "spec.agent": FieldSpec(("spec", "agent")),
        "metadata.name": _NAME_FIELD,
        "metadata.creationTimestamp": _CREATED,
    },
    "agents": {"metadata.name": _NAME_FIELD, "metadata.creationTimestamp": _CREATED},
}


def _lookup(resource: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = resource
    for step in path:
        value = value.get(step) if isinstance(value, Mapping) else None
    return value


def _instant(text: str) -> datetime | None:
    """An RFC 3339 time (``2026-12-03T11:00:00Z``, any offset); None when ``text`` is not one."""
    if not re.fullmatch(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)", text):
        return None
    try:
        moment = datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.astimezone(UTC)


_SERVER_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z")


@functools.lru_cache(maxsize=1 << 16)
def canonical_time(text: str) -> str | None:
    """``text`` as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC, whose text order is time order; None
    when it is not an RFC 3339 time. The server's own timestamps (UTC, ``Z``, a fraction or none)
    are rewritten without parsing, and remembered: every page sorts a project's runs by them."""
    if _SERVER_TIME.fullmatch(text):
        return f"{text[:19]}.{text[20:-1].ljust(6, '0')}Z"
    moment = _instant(text)
    return None if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_COMPARE: Mapping[FieldOperator, Callable[[str, str], bool]] = {
    FieldOperator.EQUALS: eq,
    FieldOperator.NOT_EQUALS: ne,
    FieldOperator.GREATER: gt,
    FieldOperator.GREATER_OR_EQUAL: ge,
    FieldOperator.LESS: lt,
    FieldOperator.LESS_OR_EQUAL: le,
}


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    operator: FieldOperator
    value: str
    spec: FieldSpec

    @functools.cached_property
    def _wanted_time(self) -> str | None:
        return canonical_time(self.value) if self.spec.time else None

    def matches(self, resource: Mapping[str, Any]) -> bool:
        found = _lookup(resource, self.spec.path)
        if self.spec.time:
            moment = canonical_time(found) if isinstance(found, str) else None
            wanted = self._wanted_time
            if moment is None or wanted is None:  # a resource without the time matches no comparison
                return self.operator == FieldOperator.NOT_EQUALS
            return _COMPARE[self.operator](moment, wanted)  # canonical times: text order is time order
        text = "" if found is None else str(found)  # an absent reason is "", as in Kubernetes
        return (text == self.value) == (self.operator == FieldOperator.EQUALS)

    def __str__(self) -> str:
        return f"{self.field}{self.operator}{self.value}"


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, resource: Mapping[str, Any]) -> bool:
        return all(requirement.matches(resource) for requirement in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(requirement) for requirement in self.requirements)

    def __bool__(self) -> bool:
        return bool(self.requirements)


_FIELD_PART = re.compile(r"^(?P<field>[^=!<>\s]+)\s*(?P<op>==|!=|>=|<=|=|>|<)\s*(?P<value>.*)$")


def _field_requirement(part: str, collection: str, field: str) -> FieldRequirement:
    supported = FIELDS.get(collection, {})
    if not part:
        raise _refuse(field, "an empty requirement (two commas, or one at either end)")
    match = _FIELD_PART.match(part)
    if match is None:
        raise _refuse(
            field, f"{part!r} does not parse; a requirement is FIELD=VALUE, FIELD!=VALUE or a time comparison"
        )
    name, value = match["field"], match["value"].strip()
    operator = FieldOperator("=" if match["op"] == "==" else match["op"])
    spec = supported.get(name)
    if spec is None:
        raise _refuse(
            field,
            f"{name!r} is not a field {collection} can be selected on; supported: {', '.join(supported)}",
        )
    if spec.time:
        if _instant(value) is None:
            raise _refuse(field, f"{part!r}: {value!r} is not an RFC 3339 time such as 2026-12-03T11:00:00Z")
    elif operator in _ORDERING:
        raise _refuse(
            field, f"{part!r}: {name} takes =, == or !=; only metadata.creationTimestamp is ordered"
        )
    elif any(char in value for char in "=!<>"):
        raise _refuse(field, f"{part!r} does not parse: one operator per requirement")
    if spec.values and value not in spec.values:
        raise _refuse(field, f"{part!r}: {value!r} is not a {name}; one of {', '.join(spec.values)}")
    return FieldRequirement(name, operator, value, spec)


def parse_field_selector(text: str | None, collection: str, *, field: str = "fieldSelector") -> FieldSelector:
    """The selector ``text`` means for ``collection`` (``agentruns``, ``agentgroups``, ``agents``);
    raises `BadRequest` (400) naming ``field``, and the supported fields when one is not."""
    if text is None or not text.strip():
        return FieldSelector()
    if len(text) > _MAX_SELECTOR:
        raise _refuse(field, f"the selector is {len(text)} characters; at most {_MAX_SELECTOR}")
    return FieldSelector(
        tuple(_field_requirement(part.strip(), collection, field) for part in text.split(","))
    )


def parse_limit(value: str | int | None, *, field: str = "limit") -> int | None:
    """A page size, 1 to `MAX_LIMIT`; None (no limit) when not given."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not (isinstance(value, int) or re.fullmatch(r"[+-]?\d{1,12}", str(value))):
        raise _refuse(field, f"{value!r} is not a whole number; a page holds 1 to {MAX_LIMIT} items")
    number = int(value)
    if not 1 <= number <= MAX_LIMIT:
        raise _refuse(field, f"{number} is out of range; a page holds 1 to {MAX_LIMIT} items")
    return number
