"""Text from the trace made safe to show, once, in the page's model (``tracekit.inputs.safe_text``).

The page inserts every string with ``textContent`` or as canvas text, so no string can add markup;
but a character that is not printable would still act on what the page shows: a bidi override
(U+202E) displays the rest of a frame name reversed, a zero-width or other format character hides
text, a lone surrogate (a file name that was not UTF-8) shows as a replacement mark. Every such
character is written as ``repr`` writes it (``\\u202e``, ``\\udcff``), exactly as the terminal
verbs print it, so the page and ``tracekit analyze`` read alike. Escaped text is printable, so
escaping again leaves it as it is.
"""

from __future__ import annotations

from typing import TypeVar, cast

from tracekit.inputs import safe_text

T = TypeVar("T")


def safe_strings(obj: T) -> T:
    """``obj`` (JSON-like: dicts, lists, strings, numbers) with every string through ``safe_text``
    (newlines kept: explanations are tracekit's own sentences over lines); the same shape back."""
    return cast(T, _walk(obj))


def _walk(obj: object) -> object:
    if isinstance(obj, str):
        return safe_text(obj, lines=True)
    if isinstance(obj, dict):
        return {k: _walk(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v) for v in obj] if any(isinstance(v, str | dict | list) for v in obj) else obj
    return obj


def safe_texts(texts: tuple[str, ...] | list[str]) -> list[str]:
    """Each text through ``safe_text`` on one line (a newline in a frame name escaped too)."""
    return [safe_text(t) for t in texts]
