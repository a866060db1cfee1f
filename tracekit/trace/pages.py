"""The bytes a Parquet column chunk decompresses to, from its page headers rather than its metadata.

A column chunk's ``total_uncompressed_size`` in the footer is the writer's claim,
and a hostile file can understate it; what Arrow allocates is each page's
``uncompressed_page_size``, from the page's own header. ``decompressed_bytes``
walks the chunk's pages (the dictionary page, then the data pages, each a
header followed by ``compressed_page_size`` bytes, within
``total_compressed_size``: all that Arrow reads of the chunk) and sums those
sizes. The headers are Thrift compact-protocol structs; this module reads
just enough of that protocol to take two integer fields (2: uncompressed,
3: compressed page size) and skip every other field, nested ones included.
"""

from __future__ import annotations

from typing import BinaryIO

MAX_PAGES = 1 << 20  # pages walked per file: about 1 TB of text at Arrow's 1 MiB pages
_MAX_NESTING = 32

# Compact-protocol field types.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


class PageError(ValueError):
    """The page headers cannot be read (truncated, malformed, or too many pages)."""


class _Compact:
    """Reads Thrift's compact protocol from a binary file."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def byte(self) -> int:
        b = self.f.read(1)
        if not b:
            raise PageError("a page header ends with the file")
        return b[0]

    def varint(self) -> int:
        shift = value = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 70:
                raise PageError("a varint longer than 10 bytes")

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def struct(self, depth: int = 0) -> dict[int, int]:
        """Skip one struct; return its integer (i32/i64) fields by field id."""
        if depth > _MAX_NESTING:
            raise PageError("page header structs nested too deeply")
        ints: dict[int, int] = {}
        last = 0
        while (head := self.byte()) != 0:  # 0: the struct's stop field
            kind, delta = head & 0x0F, head >> 4
            last = last + delta if delta else self.zigzag()
            if kind in (_I32, _I64):
                ints[last] = self.zigzag()
            else:
                self.skip(kind, depth)
        return ints

    def skip(self, kind: int, depth: int) -> None:
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self.byte()
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.f.seek(8, 1)
        elif kind == _BINARY:
            self.f.seek(self.varint(), 1)
        elif kind in (_LIST, _SET):
            head = self.byte()
            n, elem = head >> 4, head & 0x0F
            n = self.varint() if n == 15 else n
            self._skip_items(n, (elem,), depth)
        elif kind == _MAP:
            n = self.varint()
            if n:
                types = self.byte()
                self._skip_items(n, (types >> 4, types & 0x0F), depth)
        elif kind == _STRUCT:
            self.struct(depth + 1)
        else:
            raise PageError(f"unknown field type {kind} in a page header")

    def _skip_items(self, n: int, kinds: tuple[int, ...], depth: int) -> None:
        if all(k in (_TRUE, _FALSE) for k in kinds):  # a boolean in a container is one byte
            self.f.seek(n * len(kinds), 1)
            return
        for _ in range(n):  # each item takes at least a byte: a false count ends at the file's end
            for k in kinds:
                self.skip(k, depth + 1)


def decompressed_bytes(f: BinaryIO, start: int, length: int, budget: list[int]) -> int:
    """Sum of ``uncompressed_page_size`` over the pages in ``[start, start + length)`` of ``f``.

    ``budget`` holds the pages that may still be walked (shared across chunks); PageError when it
    runs out, or when a header cannot be read.
    """
    total, pos, end = 0, start, start + length
    reader = _Compact(f)
    while pos < end:
        budget[0] -= 1
        if budget[0] < 0:
            raise PageError(f"more than {MAX_PAGES:,} pages of text")
        f.seek(pos)
        header = reader.struct()
        uncompressed, compressed = header.get(2, -1), header.get(3, -1)
        if uncompressed < 0 or compressed < 0:
            raise PageError("a page header without its sizes")
        total += uncompressed
        pos = f.tell() + compressed
    return total
