"""Parsing policy options given in PyTorch's allocator-config syntax.

``PYTORCH_CUDA_ALLOC_CONF`` style: ``key:value`` pairs separated by commas,
e.g. ``expandable_segments:True,max_split_size_mb:256``; a value may be a
bracketed list holding commas and colons of its own, as in
``roundup_power2_divisions:[256:1,512:2,>:8]``. Keys and values are kept as
strings: the policy that receives them validates their meaning.
"""

from __future__ import annotations

from tracekit.errors import UsageError


def parse_alloc_conf(text: str, what: str = "--torch-conf") -> dict[str, str]:
    """``"a:1,b:[x:1,y:2]"`` -> ``{"a": "1", "b": "[x:1,y:2]"}``; UsageError when malformed."""
    out: dict[str, str] = {}
    for item in _split_top(text, what):
        key, sep, value = item.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise UsageError(
                f"invalid {what} entry {item.strip()!r}: expected key:value, "
                "e.g. expandable_segments:True,max_split_size_mb:256"
            )
        if key in out:
            raise UsageError(f"invalid {what}: key {key!r} given twice")
        out[key] = value
    return out


def _split_top(text: str, what: str) -> list[str]:
    """Split on commas outside brackets."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(f"invalid {what} {text!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise UsageError(f"invalid {what} {text!r}: unbalanced '['")
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]
