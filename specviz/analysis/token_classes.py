"""What kind of content a token is: the Atlas's token classes, from the token's text alone.

Every token falls in exactly one content class, tried in this order (the first that fits wins):

    special      a special or control token (`<|im_end|>`, `</s>`, an id the tokenizer lists as special,
                 control characters)
    whitespace   only spaces, tabs and newlines: indentation, line breaks
    number       digits, with . , _ between them (" 42", "3.14", "1_000")
    punctuation  only punctuation and symbols (" (", "):", " ->", "==")
    code         identifiers and code words: snake_case, camelCase, with digits, a keyword rarely used in
                 English, or letters mixed with code punctuation ("_intervals", " self", "isEmpty", ".split")
    word         the rest: natural-language words and pieces of words (" the", "ing", " café")

A token the draft cannot propose at all (a draft of another family, whose vocabulary lacks it) is counted
apart, on top of its content class: `EmittedToken.draftable` says so where the target chose the token.
"""

from __future__ import annotations

import re
import unicodedata

CLASSES = ("whitespace", "punctuation", "code", "number", "word", "special")
UNDRAFTABLE = "cannot propose"

SPECIAL_TEXT = re.compile(r"<\|[^|<>]*\|>|</?(s|eos|bos|unk|pad|mask|sep|cls)>", re.IGNORECASE)
NUMBER = re.compile(r"[+-]?\d[\d_.,]*")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CAMEL = re.compile(r"[a-z][A-Z]")
CODE_MARKS = set("_.()[]{}=<>:;/\\*&|#@$`^~")
# keywords and builtins that are rarely English words: " return" or " class" could be either, so they stay words
KEYWORDS = frozenset("""def elif lambda self None True False async await const typeof null undefined nil void
struct enum impl fn mut pub println printf namespace std isinstance len str int bool dict tuple kwargs args
SELECT FROM WHERE JOIN INSERT UPDATE DELETE""".split())


def is_control(text: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cf") and c not in "\n\t\r" for c in text)


def is_punctuation(text: str) -> bool:
    return all(unicodedata.category(c)[0] in "PS" for c in text)


def is_code(text: str) -> bool:
    if IDENTIFIER.fullmatch(text):
        return "_" in text or any(c.isdigit() for c in text) or bool(CAMEL.search(text)) or text in KEYWORDS
    return any(c.isalpha() for c in text) and any(c in CODE_MARKS for c in text)


def token_class(text: str, special: bool = False) -> str:
    """The content class of a token's text; `special`: the tokenizer lists its id as a special token."""
    if special or SPECIAL_TEXT.fullmatch(text.strip()) or is_control(text):
        return "special"
    core = text.strip()
    if not core:
        return "whitespace"
    if NUMBER.fullmatch(core):
        return "number"
    if is_punctuation(core.replace(" ", "")):
        return "punctuation"
    return "code" if is_code(core) else "word"
