"""JSON text a user wrote to a value, its syntax errors in the user's words: the one reader of every JSON file the
CLI is given (run files, spot-traces files, interruption items, a model's config.json, a safetensors index, a
dataset's index.json).

`loads` is `json.loads` whose `JSONDecodeError` (the decoder's wording: "Expecting ',' delimiter: line 3 column 5
(char 40)") becomes a `JsonSyntaxError`: the line and column, what the file needs there ("a ',' between two
fields, or '}' to end the object"), and `excerpt`, that line's text with a caret under the column. Callers put
their file's name and what the file should hold around `exc.where_what` and append `exc.excerpt` on lines of its own.
"""

from __future__ import annotations

import json
from typing import Any

EXCERPT_WIDTH = 72  # characters of a long line shown around the column
INDENT = "    "

VALUE = 'a value (a "string", a number, an object {...}, an array [...], true, false or null)'
NUL_TEXT = ("text without NUL bytes (this file has some: UTF-16 or UTF-32 without a byte-order mark, or a binary file; "
            "save it as UTF-8)")
ESCAPES = "one of the escapes \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX after a '\\' (a Windows path: write \\\\ or /)"


class JsonSyntaxError(ValueError):
    """Text that is not JSON. `line`, `column`: 1-based, where the text stops being JSON; `expected`: what it needs
    there, in words; `excerpt`: that line (or its part around the column) and a caret under the column, two
    indented lines ("" for an empty file)."""

    def __init__(self, line: int, column: int, expected: str, excerpt: str):
        self.line, self.column, self.expected, self.excerpt = line, column, expected, excerpt
        super().__init__(self.where_what)

    @property
    def at(self) -> str:
        """`line L column C`."""
        return f"line {self.line} column {self.column}"

    @property
    def where_what(self) -> str:
        """`at line L column C: expected WHAT` (one line)."""
        return f"at {self.at}: expected {self.expected}"


def loads(text: str, **options: Any) -> Any:
    """`json.loads(text, **options)`; JsonSyntaxError in the user's words when `text` is not JSON (RecursionError,
    for text nested deeper than Python recurses, is left to the caller)."""
    try:
        return json.loads(text, **options)
    except json.JSONDecodeError as exc:
        raise syntax_error(exc.msg, text, exc.pos) from None


def with_excerpt(message: str, excerpt: str) -> str:
    """`message` followed by the excerpt's lines (the message alone when there is none)."""
    return f"{message}\n{excerpt}" if excerpt else message


def syntax_error(decoder_message: str, text: str, pos: int) -> JsonSyntaxError:
    """The JsonSyntaxError of json's error `decoder_message` at character `pos` of `text`."""
    pos = max(0, min(pos, len(text)))
    if not text[pos:].strip():  # the text ends too soon: shown just after its last character, not on a blank line
        pos = len(text.rstrip())
    line = text.count("\n", 0, pos) + 1
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    line_text = text[start:] if end < 0 else text[start:end]
    column = pos - start + 1
    if not text.strip():
        return JsonSyntaxError(line, column, "a JSON value (the file is empty)", "")
    if "\x00" in text:  # valid UTF-8, but no text file holds NUL: the caret would point into noise
        return JsonSyntaxError(line, column, NUL_TEXT, "")
    return JsonSyntaxError(line, column, _expected(decoder_message, text, pos), _excerpt(line_text.rstrip("\r"),
                                                                                          pos - start))


def _expected(decoder_message: str, text: str, pos: int) -> str:
    """What the text needs at `pos`, from json's message (its wording is stable across CPython 3.11-3.13)."""
    here = text[pos] if pos < len(text) else ""
    before = text[:pos].rstrip()[-1:]
    message = decoder_message.removesuffix(" at")
    if message == "Expecting value":
        if not text[pos:].strip():
            return f"{VALUE}, but the text ends here (is the file cut short?)"
        if here == "]" and before == ",":
            return "another item after the ',' (JSON allows no ',' before ']')"
        if here == "," and before in (",", "["):
            return f"{VALUE} before this ',' (two ',' in a row, or one first in the array?)"
        if here == "'":
            return f"{VALUE}: strings take double quotes (\"text\"), not single ones"
        if here in ("/", "#"):
            return f"{VALUE}: JSON has no comments"
        if here.isalpha():
            return f"{VALUE}: a word other than true, false or null is a string, in double quotes"
        return VALUE
    if message == "Expecting ',' delimiter":
        if not text[pos:].strip():
            return "more: the text ends inside an object or array (is the file cut short, or a '}' or ']' missing?)"
        closing = "'}' to end the object" if _open_bracket(text, pos) == "{" else "']' to end the array"
        if here in ("/", "#"):
            return f"a ',' or {closing}: JSON has no comments"
        return f"a ',' between this and what comes before it, or {closing}"
    if message == "Expecting ':' delimiter":
        return "a ':' between the field's name and its value"
    if message == "Expecting property name enclosed in double quotes" or message.startswith("Illegal trailing comma"):
        if here == "}" and before == ",":
            return "another field after the ',' (JSON allows no ',' before '}')"
        if here == "]" and before == ",":
            return "another item after the ',' (JSON allows no ',' before ']')"
        if here == "'":
            return "a field name in double quotes (\"name\"), not single ones"
        if here == "," and before in (",", "{"):
            return ("a field name in double quotes (\"name\") before this ',' (two ',' in a row, or one first in "
                    "the object?)")
        if not text[pos:].strip():
            return "a field name in double quotes or '}', but the text ends here (is the file cut short?)"
        return "a field name in double quotes (\"name\") or '}'"
    if message == "Unterminated string starting":
        return "a '\"' to end the string that starts here (the text ends inside it)"
    if message == "Invalid control character":
        if here in ("\n", "\r"):
            return "a '\"' to end the string before the line ends (a line break inside a string is written \\n)"
        if here == "\t":
            return "no tab inside a string (written \\t)"
        return "no control character inside a string (written \\uXXXX)"
    if message.startswith(("Invalid \\escape", "Invalid \\uXXXX")):
        return ESCAPES
    if message == "Extra data":
        return "the end of the text: one JSON value ended before this (a second value, or a stray character?)"
    return "valid JSON"


def _open_bracket(text: str, pos: int) -> str:
    """The innermost '{' or '[' open at `pos` ("" if none); the text before `pos` is valid JSON so far, so brackets
    are only counted outside strings."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text[:pos]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def _excerpt(line_text: str, offset: int) -> str:
    """The line (at most EXCERPT_WIDTH characters of it, around `offset`) and a caret under `offset`, indented;
    tabs and other control characters shown as one space each so the caret stays under its character."""
    shown = "".join(ch if ch.isprintable() else " " for ch in line_text)
    lead = trail = ""
    if len(shown) > EXCERPT_WIDTH:
        first = max(0, min(offset - EXCERPT_WIDTH // 2, len(shown) - EXCERPT_WIDTH))
        lead = "..." if first > 0 else ""
        trail = "..." if first + EXCERPT_WIDTH < len(shown) else ""
        shown, offset = shown[first:first + EXCERPT_WIDTH], offset - first
    return f"{INDENT}{lead}{shown}{trail}\n{INDENT}{' ' * (len(lead) + offset)}^"
