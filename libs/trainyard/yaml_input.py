"""YAML that people hand in (job specs, tenancy files, rate cards), read without letting aliases blow it up.

YAML's anchors and aliases (``&a`` ... ``*a``) let a few hundred bytes stand
for billions of values (the "billion laughs" document) or for a value that
contains itself.  Decoding such a document is cheap, since an alias is a
reference, but everything that walks the result afterwards (encoding it as
JSON, converting it into structs, validating it) walks every expanded value
and runs out of memory or recursion.  :func:`check_yaml` composes the
document once (linear in its size) and counts the values it expands to,
refusing one that aliases make expand past :data:`MAX_VALUES` or that refers
to itself; the callers then decode it as before.  A long document without
aliases passes: reading it costs what its size does, which callers bound.
"""

from __future__ import annotations

import yaml

MAX_VALUES = 100_000  # values a document may expand to; a job spec or tenancy file has hundreds
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlTooLarge(ValueError):
    """The document expands, through aliases, to too many values or to one that contains itself."""


def check_yaml(text: str | bytes, what: str = "the document", limit: int = MAX_VALUES) -> None:
    """Raise :class:`YamlTooLarge` if ``text`` expands to more than ``limit`` values or refers to itself.
    Text that is not YAML passes: the caller's decoder reports it as it always has."""
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError:
        return
    if node is None:
        return
    sizes: dict[int, int] = {}  # id of a node -> values it expands to, itself included
    open_: set[int] = set()  # nodes whose children are being counted
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        current, children_done = stack.pop()
        key = id(current)
        if key in sizes:
            continue
        kids = _children(current)
        if children_done:
            open_.discard(key)
            sizes[key] = 1 + sum(sizes[id(k)] for k in kids)
            continue
        if key in open_:
            raise YamlTooLarge(f"{what} contains itself through a YAML alias (*name); remove the alias")
        open_.add(key)
        stack.append((current, True))
        for kid in kids:
            if id(kid) in open_:
                raise YamlTooLarge(f"{what} contains itself through a YAML alias (*name); remove the alias")
            if id(kid) not in sizes:
                stack.append((kid, False))
    # A long document written out is as costly to read as it is long; only aliases multiply the cost.
    if sizes[id(node)] > limit and sizes[id(node)] > len(sizes):
        raise YamlTooLarge(
            f"{what} expands to more than {limit:,} values through YAML aliases (*name); "
            "write the values out or use fewer aliases"
        )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []
