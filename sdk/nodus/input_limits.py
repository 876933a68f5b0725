"""How large and how deep a document a user may send: one set of limits for the API's JSON bodies
and the CLI's YAML files, checked before anything else reads the document.

A resource is a few levels deep (``items[0].spec.env[0].valueFrom.secretKeyRef.name`` is the
deepest, 7), so `MAX_NESTING_DEPTH` leaves room and still keeps every recursive reader (the
JSON decoder, pydantic, pickling to the control plane, YAML's composer) far from Python's
recursion limit, where a deep body used to end as a 500 or a traceback. YAML aliases are counted
each time they are used, so a "billion laughs" file is refused by `MAX_YAML_NODES` before it is
expanded into memory.
"""

from __future__ import annotations

import json
from typing import Any, Final

import yaml

from .errors import BadRequest, Invalid, PayloadTooLarge

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_NESTING_DEPTH",
    "MAX_YAML_NODES",
    "body_too_large",
    "check_depth",
    "decode_json_body",
    "check_yaml_node",
]

MAX_BODY_BYTES: Final = 1024 * 1024  # a 256 KiB input, JSON-escaped, fits
MAX_NESTING_DEPTH: Final = 32  # objects and arrays inside one another
MAX_YAML_NODES: Final = 100_000  # scalars, sequences and mappings of one document, aliases expanded


def _too_deep(where: str) -> Invalid:
    return BadRequest(
        f"{where} is nested more than {MAX_NESTING_DEPTH} levels deep (objects and arrays)",
        details={"field": "", "limit": MAX_NESTING_DEPTH},
    )


def check_depth(value: Any, where: str = "the request body") -> None:
    """Refuse a decoded value whose objects and arrays nest deeper than `MAX_NESTING_DEPTH`.

    Iterative, so it is safe on any value the decoder produced.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth + 1 > MAX_NESTING_DEPTH:
            raise _too_deep(where)
        stack.extend((child, depth + 1) for child in children)


def body_too_large() -> PayloadTooLarge:
    """The refusal of a body over `MAX_BODY_BYTES`, for a reader that stops before the end."""
    return PayloadTooLarge(
        f"the request body is larger than {MAX_BODY_BYTES} bytes (1 MiB)",
        details={"field": "", "limit": MAX_BODY_BYTES},
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def decode_json_body(raw: bytes) -> Any:
    """The JSON value of a request body, or a 4xx `NodusError` saying why not.

    Refused: more than `MAX_BODY_BYTES` (413), not UTF-8 JSON, ``NaN``/``Infinity`` (they are
    not JSON, and a stored NaN could not be answered back), and nesting deeper than
    `MAX_NESTING_DEPTH` (400). An empty body is ``null``.
    """
    if len(raw) > MAX_BODY_BYTES:
        raise body_too_large()
    try:
        return_value = json.loads(raw or b"null", parse_constant=_no_constant)
    except RecursionError:
        raise _too_deep("the request body") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not JSON: {exc}", details={"field": ""}) from None
    check_depth(return_value)
    return return_value


def check_yaml_node(node: yaml.Node, source: str) -> None:
    """Refuse a composed YAML document nested deeper than `MAX_NESTING_DEPTH`, or larger than
    `MAX_YAML_NODES` nodes once its aliases are expanded (which also stops a cycle)."""
    stack: list[tuple[yaml.Node, int]] = [(node, 0)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > MAX_YAML_NODES:
            raise Invalid(
                f"{source}: the document has more than {MAX_YAML_NODES} values once its aliases are "
                "expanded (aliases used too often, or an alias inside itself)",
                details={"file": source, "limit": MAX_YAML_NODES},
            )
        if isinstance(item, yaml.SequenceNode):
            children: list[yaml.Node] = list(item.value)
        elif isinstance(item, yaml.MappingNode):
            children = [part for pair in item.value for part in pair]
        else:
            continue
        if depth + 1 > MAX_NESTING_DEPTH:
            line = item.start_mark.line + 1 if item.start_mark is not None else 0
            raise Invalid(
                f"{source} line {line}: nested more than {MAX_NESTING_DEPTH} levels deep",
                details={"file": source, "limit": MAX_NESTING_DEPTH},
            )
        stack.extend((child, depth + 1) for child in children)
