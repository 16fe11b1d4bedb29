"""Redaction: secrets out of memory text before it goes to a remote model, and back after.

What a remote provider sees, and what any log line about the request may contain, is
`redact(text).text`: each secret in it is replaced by a placeholder such as `[API_KEY_1]`. The
map from placeholders to originals (`Redacted.secrets`) stays in this process. The model's
answer goes through `Redacted.restore` before it is stored, so the stored facts hold the
originals again.

Secrets are found by regular expressions alone: tokens with a well-known prefix (OpenAI,
Anthropic, GitHub, Slack, AWS, Google, Stripe), JWTs, `Bearer` tokens, PEM private-key blocks,
the password in `scheme://user:password@host`, the value of a `password=`, `secret:`,
`api_key=`, `token=` (and similar) assignment, and the caller's own sensitive terms. Prose that
only talks about secrets ("my password is in the drawer") is left alone. No pattern nests one
quantifier inside another, and the unbounded ones are possessive, so no input can make matching
backtrack without bound: the cost grows with the text's length times the number of terms and of
distinct secrets found.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

# A placeholder is `[KIND_N]`, numbered from 1 per kind in order of first appearance. A short
# upper-case word in brackets is what small models copy verbatim most reliably; a random id or
# a `{{...}}` template tends to be paraphrased or "filled in".
_PLACEHOLDER = re.compile(r"\[([A-Z][A-Z_]{0,31})_([0-9]{1,9})\]")

# A secret found again elsewhere in the text without its label ("password=Tr0ub4dor ... I typed
# Tr0ub4dor") is redacted there too, if it is at least this long: shorter values ("token: 5")
# would take ordinary words and numbers with them.
MIN_REPEATED_CHARS = 6

_Span = tuple[int, int, str]  # start, end, kind


@dataclass(frozen=True)
class Redacted:
    """Text with its secrets replaced by placeholders, and the way back.

    `text` is safe to send and to log. `secrets` maps each placeholder to the original it
    stands for; it must stay local, and is left out of `repr` so that logging a `Redacted`
    cannot leak it.
    """

    text: str
    secrets: dict[str, str] = field(repr=False)

    @property
    def kinds(self) -> dict[str, int]:
        """How many distinct secrets of each kind were redacted, e.g. `{"API_KEY": 2}`: for logs."""
        return dict(Counter(placeholder[1:].rsplit("_", 1)[0] for placeholder in self.secrets))

    def restore(self, text: str) -> str:
        """`text` with every placeholder of this redaction replaced by its original.

        Meant for the model's answer, which may quote placeholders anywhere and in any order.
        Anything else is left as it is, including placeholders the model altered (`[api_key_1]`)
        or made up, and placeholder-like text that was already in the input. Never raises.
        """
        if not self.secrets:
            return text
        return _PLACEHOLDER.sub(lambda match: self.secrets.get(match[0], match[0]), text)


def redact(text: str, terms: Sequence[str] = ()) -> Redacted:
    """`text` with every secret found in it replaced by a placeholder.

    `terms` are extra sensitive words or phrases (client names, project code names), matched
    case-insensitively as whole words, longest first; blank terms are ignored. The same
    original always gets the same placeholder. Numbering skips any placeholder-like text already
    in `text` (`[API_KEY_1]` there makes the first key `[API_KEY_2]`), so `restore` can tell the
    two apart. After, `result.restore(result.text) == text`, and no redacted original appears in
    `result.text`.
    """
    spans = _merged([*_found(text), *_terms_found(text, terms)])
    originals = {text[start:end]: kind for start, end, kind in spans if end - start >= MIN_REPEATED_CHARS}
    if originals:
        spans = _merged([*spans, *_repeats_found(text, originals)])
    return _replaced(text, spans)


# ---------------------------------------------------------------------------------------------
# What counts as a secret. Every pattern starts after a character that cannot be part of the
# secret, so a key is never found in the middle of a longer word.

_PREFIXED_KEYS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # OpenAI (`sk-`, `sk-proj-`, `sk-svcacct-`) and Anthropic (`sk-ant-api03-`): 20 key
    # characters or more, one of them a digit, so "sk-learn-compatible-estimators" is not a key.
    ("API_KEY", re.compile(r"(?<![A-Za-z0-9_-])sk-(?=[A-Za-z0-9_-]{20})(?=[A-Za-z_-]*+[0-9])[A-Za-z0-9_-]++")),
    # GitHub: classic tokens (ghp_ personal, gho_ OAuth, ghu_/ghs_ app, ghr_ refresh), fine-grained.
    ("API_KEY", re.compile(r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{30,}+|github_pat_[A-Za-z0-9_]{22,}+)")),
    ("API_KEY", re.compile(r"(?<![A-Za-z0-9_-])xox[abeprs]-[A-Za-z0-9-]{10,}+")),  # Slack
    ("API_KEY", re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])")),  # AWS key id
    ("API_KEY", re.compile(r"(?<![A-Za-z0-9_-])AIza[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])")),  # Google
    ("API_KEY", re.compile(r"(?<![A-Za-z0-9_])(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}+")),  # Stripe
    # JWT: two base64url JSON objects (`{"` encodes to `eyJ`) and a signature, which `alg: none`
    # leaves empty.
    ("TOKEN", re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{4,}+\.eyJ[A-Za-z0-9_-]{4,}+\.[A-Za-z0-9_-]*+")),
)

# `Bearer <token>`. The token must hold a digit: "Bearer instruments" is prose.
_BEARER = re.compile(r"(?<![A-Za-z0-9_-])[Bb]earer[ \t]+([A-Za-z0-9._~+/-]{8,}+=*+)")

# The whole block, armour lines included. A block with no END line runs to the end of the text:
# a key cut short is still a key.
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")

# `scheme://user:password@host`: the password runs to the last `@` of the authority, since
# people write `p@ss` unescaped. The user name stays: it is what makes the fact useful.
_URL_PASSWORD = re.compile(
    r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}+://[^\s:/?#@]{0,256}+:([^\s/?#]{1,256})@"
)

# `name = value`, `name: value`, `"name": "value"`, `name => value`, `--name=value`. Any name
# matches here; `_assignment_kind` decides from its words whether the value is a secret.
_ASSIGNMENT = re.compile(r"""(?<![A-Za-z0-9_.])([A-Za-z_][A-Za-z0-9_.-]{0,63}+)["'`]?[ \t]*(?:=>|==|:=|[:=])[ \t]*""")
_NAME_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")  # OPENAI_API_KEY, apiKey, X-Api-Key
_PASSWORD_WORDS = frozenset({"password", "passwd", "pwd", "pass", "passphrase"})
_TOKEN_WORDS = frozenset({"token", "authorization"})
_SECRET_WORDS = frozenset({"secret", "credential", "credentials"})
_KEY_QUALIFIERS = frozenset({"access", "secret", "private", "signing", "encryption", "master", "client", "app",
                             "account", "license", "auth"})
_AUTH_SCHEME = re.compile(r"(?:[Bb]earer|[Bb]asic|[Tt]oken|[Dd]igest)[ \t]+")
_QUOTED = re.compile(r""""([^"\n]*+)"|'([^'\n]*+)'|`([^`\n]*+)`""")
_BARE = re.compile(r"""[^\s"'`]++""")
_OPENERS = {")": "(", "]": "[", "}": "{"}


def _found(text: str) -> Iterator[_Span]:
    """Every secret the patterns find, more specific patterns first (they win ties)."""
    for kind, pattern in _PREFIXED_KEYS:
        for match in pattern.finditer(text):
            yield match.start(), match.end(), kind
    for match in _BEARER.finditer(text):
        span = _trimmed(text, match.start(1), match.end(1))
        if span and any(char.isdigit() for char in text[span[0]:span[1]]):
            yield *span, "TOKEN"
    yield from _pem_blocks(text)
    for match in _URL_PASSWORD.finditer(text):
        yield match.start(1), match.end(1), "PASSWORD"
    yield from _assignments(text)


def _pem_blocks(text: str) -> Iterator[_Span]:
    position = 0
    while begin := _PEM_BEGIN.search(text, position):
        end = _PEM_END.search(text, begin.end())
        position = end.end() if end else len(text)
        yield begin.start(), position, "PRIVATE_KEY"


def _assignments(text: str) -> Iterator[_Span]:
    covered = 0  # the end of the last value: an assignment inside it is hidden already
    for match in _ASSIGNMENT.finditer(text):
        kind = _assignment_kind(match[1])
        if kind is None or match.start() < covered:
            continue
        span = _assigned_value(text, match.end())
        # A value that is already a placeholder ("password: [PASSWORD_1]") is nothing to hide.
        if span and not _PLACEHOLDER.fullmatch(text, *span):
            covered = span[1]
            yield *span, kind


def _assignment_kind(name: str) -> str | None:
    """The kind of secret a value assigned to `name` is, judged by the name's last word(s).

    Only the last word counts, so `auth_token` and `client_secret` are secrets while
    `max_tokens`, `token_count` and `secret_name` are not.
    """
    words = [word.lower() for word in _NAME_WORDS.findall(name)]
    if not words:
        return None
    last, before = words[-1], words[-2] if len(words) > 1 else ""
    if last in _PASSWORD_WORDS:
        return "PASSWORD"
    if last in _TOKEN_WORDS:
        return "TOKEN"
    if last == "apikey" or (last == "key" and before == "api"):
        return "API_KEY"
    if last in _SECRET_WORDS or (last == "key" and before in _KEY_QUALIFIERS):
        return "SECRET"
    return None


def _assigned_value(text: str, position: int) -> tuple[int, int] | None:
    """The span of the value that starts at `position`: quoted on one line, or up to whitespace."""
    if scheme := _AUTH_SCHEME.match(text, position):  # Authorization: Bearer <token>
        position = scheme.end()
    if quoted := _QUOTED.match(text, position):
        start, end = quoted.span(quoted.lastindex)
        return (start, end) if end > start else None
    if position < len(text) and text[position] in "\"'`":
        position += 1  # an unclosed quote: the value is the word after it
    if bare := _BARE.match(text, position):
        return _trimmed(text, bare.start(), bare.end())
    return None


def _trimmed(text: str, start: int, end: int) -> tuple[int, int] | None:
    """`start:end` without the sentence's trailing punctuation or an unopened closing bracket."""
    value = text[start:end].rstrip(".,;:!?")
    if value and value[-1] in _OPENERS and _OPENERS[value[-1]] not in value:
        value = value[:-1]
    return (start, start + len(value)) if value else None


def _terms_found(text: str, terms: Sequence[str]) -> Iterator[_Span]:
    """Each whole-word, any-case occurrence of a non-blank term. Longer terms are tried first,
    so with both "Falcon" and "Falcon Nine" configured, "Falcon Nine" is one match."""
    cleaned = sorted({term.strip().casefold(): term.strip() for term in terms if term.strip()}.values(),
                     key=len, reverse=True)
    if not cleaned:
        return
    pattern = re.compile("|".join(_whole_word(re.escape(term), term) for term in cleaned), re.IGNORECASE)
    for match in pattern.finditer(text):
        yield match.start(), match.end(), "REDACTED"


def _whole_word(pattern: str, literal: str) -> str:
    # A literal that starts (ends) with punctuation, such as "#ops" or "C++", needs no boundary
    # on that side.
    before = r"(?<!\w)" if _is_word_char(literal[0]) else ""
    after = r"(?!\w)" if _is_word_char(literal[-1]) else ""
    return f"{before}{pattern}{after}"


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def _repeats_found(text: str, kinds: dict[str, str]) -> Iterator[_Span]:
    """Each whole-word occurrence, in the same case, of an original already found.

    Plain `str.find` rather than a pattern built from the secrets: nothing to compile, and no
    secret kept in the `re` module's pattern cache.
    """
    for original, kind in kinds.items():
        start = text.find(original)
        while start != -1:
            end = start + len(original)
            clear_before = not (_is_word_char(original[0]) and start > 0 and _is_word_char(text[start - 1]))
            clear_after = not (_is_word_char(original[-1]) and end < len(text) and _is_word_char(text[end]))
            if clear_before and clear_after:
                yield start, end, kind
            start = text.find(original, start + 1)


def _merged(spans: list[_Span]) -> list[_Span]:
    """`spans` in text order, overlapping ones joined: hiding a little too much beats a leak.

    A joined span keeps the kind of the one that starts first (the longest, if several do;
    the earliest found, if they are also as long).
    """
    merged: list[_Span] = []
    for start, end, kind in sorted(spans, key=lambda span: (span[0], -span[1])):
        if merged and start < merged[-1][1]:
            first_start, first_end, first_kind = merged[-1]
            merged[-1] = (first_start, max(first_end, end), first_kind)
        else:
            merged.append((start, end, kind))
    return merged


def _replaced(text: str, spans: list[_Span]) -> Redacted:
    """`text` with each span replaced by its placeholder; `spans` are in order and disjoint."""
    in_use: dict[str, int] = {}
    for match in _PLACEHOLDER.finditer(text):
        in_use[match[1]] = max(in_use.get(match[1], 0), int(match[2]))
    placeholders: dict[str, str] = {}  # original -> placeholder
    pieces: list[str] = []
    position = 0
    for start, end, kind in spans:
        original = text[start:end]
        if original not in placeholders:
            in_use[kind] = in_use.get(kind, 0) + 1
            placeholders[original] = f"[{kind}_{in_use[kind]}]"
        pieces += [text[position:start], placeholders[original]]
        position = end
    pieces.append(text[position:])
    secrets = {placeholder: original for original, placeholder in placeholders.items()}
    return Redacted(text="".join(pieces), secrets=secrets)
