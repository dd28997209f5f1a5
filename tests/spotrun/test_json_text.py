"""spotrun/contract/json_text.py: JSON a user wrote that is not JSON, in the user's words (line, column, what the
text needs there, the line with a caret), never the decoder's ("Expecting ',' delimiter", "(char 40)")."""

from __future__ import annotations

import pytest

from spotrun.contract.json_text import EXCERPT_WIDTH, JsonSyntaxError, loads

DECODER_WORDS = ("Expecting", "delimiter", "(char ", "enclosed in", "Extra data", "JSONDecodeError", "Unterminated",
                 "Invalid control", "Invalid \\escape")

CASES = [  # (text, line, column, words of what is expected there)
    ('{\n  "version": 1,\n  "name": "x"\n  "model": {}\n}\n', 4, 3, "a ',' between this and what comes before it, "
     "or '}' to end the object"),
    ('{"a": [1, 2}', 1, 12, "or ']' to end the array"),
    ('{"a": 1,}', 1, 9, "JSON allows no ',' before '}'"),
    ('[1, 2,]', 1, 7, "JSON allows no ',' before ']'"),
    ("{'a': 1}", 1, 2, "not single ones"),
    ('{"a": 1 // note\n}', 1, 9, "JSON has no comments"),
    ('{"a": True}', 1, 7, "a word other than true, false or null is a string"),
    ('{"a" 1}', 1, 6, "a ':' between the field's name and its value"),
    ('{"a": "x', 1, 7, "the text ends inside it"),
    ('{"a": "x\ny"}', 1, 9, "a line break inside a string is written \\n"),
    ('{"a": "C:\\path"}', 1, 10, "a Windows path: write \\\\ or /"),
    ('{"a": 1} x', 1, 10, "one JSON value ended before this"),
    ('{"a":', 1, 6, "the text ends here (is the file cut short?)"),
    ('', 1, 1, "the file is empty"),
    ('{"a": 1,, "b": 2}', 1, 9, "two ',' in a row"),
    ('[1,, 2]', 1, 4, "two ',' in a row"),
    ('\x00{\x00"\x00a\x00"\x00:\x001\x00}', 1, 1, "UTF-16 or UTF-32 without a byte-order mark"),
]


@pytest.mark.parametrize("text, line, column, expected", CASES)
def test_a_syntax_error_says_line_column_and_what_is_needed_in_words(text, line, column, expected):
    with pytest.raises(JsonSyntaxError) as caught:
        loads(text)
    exc = caught.value
    assert (exc.line, exc.column) == (line, column), str(exc)
    assert expected in exc.expected and str(exc).startswith(f"at line {line} column {column}: expected "), str(exc)
    assert not any(word in f"{exc}\n{exc.excerpt}" for word in DECODER_WORDS), str(exc)


def test_the_excerpt_is_the_line_with_a_caret_under_the_column():
    with pytest.raises(JsonSyntaxError) as caught:
        loads('{\n\t"name": "x"\n\t"model": {}\n}')
    text, caret = caught.value.excerpt.split("\n")
    assert text.strip() == '"model": {}'  # the tab shown as one space, so that the caret stays under its character
    assert caret.strip() == "^" and text[caret.index("^")] == '"'


def test_a_long_line_is_shown_around_the_column():
    text = '{"data": [' + ", ".join(["1"] * 400) + ", x]}"
    with pytest.raises(JsonSyntaxError) as caught:
        loads(text)
    line, caret = caught.value.excerpt.split("\n")
    assert line.strip().startswith("...") and len(line.strip()) <= EXCERPT_WIDTH + 6
    assert line[caret.index("^")] == "x" and caught.value.column == text.index("x") + 1
