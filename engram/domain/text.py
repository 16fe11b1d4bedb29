"""Text handling shared by the write and read paths: normalisation, hashing, BM25 tokens."""

from __future__ import annotations

import hashlib
import re
import sys
import unicodedata
from collections import Counter
from functools import lru_cache

import snowballstemmer

_WS = re.compile(r"\s+")

# The version of bm25_terms's own rules (splitting, lower-casing, stopwords) and of the pinned
# snowballstemmer. Bump it with any change to either: stored postings name the analyzer that
# built them, and a start-up with another analyzer rebuilds them (see bm25_analyzer).
# 1: [a-z0-9] runs ("café" -> "caf"). 3: NFC text, runs of letters, combining marks and digits
# in any script ("हिन्दी" is one term), each cut to MAX_TERM_CHARS.
TOKENIZER_VERSION = 3
# A term is a btree key in memory_terms and bm25_term_stats; a run of unspaced script (Chinese,
# Japanese) could otherwise pass the index row limit.
MAX_TERM_CHARS = 64

# The 179-word English stopword list (NLTK's), the one the LoCoMo baselines use.
STOPWORDS = frozenset("""
i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself yourselves
he him his himself she she's her hers herself it it's its itself they them their theirs themselves
what which who whom this that that'll these those am is are was were be been being have has had
having do does did doing a an the and but if or because as until while of at by for with about
against between into through during before after above below to from up down in out on off over
under again further then once here there when where why how all any both each few more most other
some such no nor not only own same so than too very s t can will just don don't should should've
now d ll m o re ve y ain aren aren't couldn couldn't didn didn't doesn doesn't hadn hadn't hasn
hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't needn needn't shan shan't shouldn
shouldn't wasn wasn't weren weren't won won't wouldn wouldn't
""".split())


# Characters that render as nothing: categories Cc, Cf, Zs, Zl and Zp, and the blank letters
# U+115F, U+1160, U+3164, U+FFA0 and U+2800 (Hangul fillers, the blank Braille cell). Written out
# so that the OpenAPI schema states the same rule as a pattern; tests/test_bad_input.py checks
# them against unicodedata.
BLANK_RANGES = (
    (0x0000, 0x0020), (0x007F, 0x00A0), (0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C),
    (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2), (0x115F, 0x1160),
    (0x1680, 0x1680), (0x180E, 0x180E), (0x2000, 0x200F), (0x2028, 0x202F), (0x205F, 0x2064),
    (0x2066, 0x206F), (0x2800, 0x2800), (0x3000, 0x3000), (0x3164, 0x3164), (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x13438),
    (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)


def _escape(cp: int) -> str:
    return f"\\u{cp:04X}" if cp <= 0xFFFF else f"\\U{cp:08X}"


# A regex (Python and JSON Schema alike) matching one character that shows.
VISIBLE_CHAR = "[^" + "".join(_escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in BLANK_RANGES) + "]"
_VISIBLE = re.compile(VISIBLE_CHAR)


def is_blank(text: str) -> bool:
    """True when `text` shows nothing: white space, zero-width and other format characters only."""
    return _VISIBLE.search(text) is None


def unstorable(text: str) -> str | None:
    """Why Postgres cannot store `text` as given, or None: a NUL character (text columns refuse
    it) or a lone surrogate (no UTF-8 encoding exists for it)."""
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode)"
    return None


def normalize(content: str) -> str:
    """NFKC, lower case, runs of white space folded to one space, trimmed.

    Two texts that differ only in these ways are the same memory (same content hash).
    """
    return _WS.sub(" ", unicodedata.normalize("NFKC", content)).strip().lower()


def content_hash(normalized: str) -> str:
    """SHA-256 hex of the normalised content."""
    return hashlib.sha256(normalized.encode("utf-8")).hexdigest()


@lru_cache(maxsize=4)
def _stemmer(language: str):
    return snowballstemmer.stemmer(language)


@lru_cache(maxsize=200_000)
def _stem(language: str, word: str) -> str:
    """One word's stem, remembered: words follow Zipf's law, so nearly every token of a new
    text was stemmed before, and the pure-Python Snowball run was a sixth of a remember's CPU."""
    return _stemmer(language).stemWord(word)


@lru_cache(maxsize=1)
def _token_pattern() -> re.Pattern:
    """Runs of letters, digits and combining marks (the vowel signs of Devanagari or Tamil, the
    harakat of Arabic), which `\\w` leaves out. Built once per process (about 0.15 s)."""
    ranges, start = [], None
    for cp in range(sys.maxunicode + 2):
        mark = cp <= sys.maxunicode and unicodedata.category(chr(cp)).startswith("M")
        if mark and start is None:
            start = cp
        elif not mark and start is not None:
            ranges.append(f"{re.escape(chr(start))}-{re.escape(chr(cp - 1))}")
            start = None
    return re.compile(f"(?:[^\\W_]|[{''.join(ranges)}])+")


def bm25_terms(text: str, stemmer: str = "english") -> list[str]:
    """BM25 tokens: runs of letters, marks and digits of the NFC, lower-cased text (each cut to
    MAX_TERM_CHARS), stopwords removed, then stemmed.

    `stemmer` is a Snowball language name or "none". The same function must tokenise
    documents and queries, or their terms will not meet. Unspaced scripts (Chinese, Japanese)
    come out as one term per run, so BM25 helps them little; the dense leg carries them.
    """
    text = unicodedata.normalize("NFC", text).lower()
    tokens = [t[:MAX_TERM_CHARS] for t in _token_pattern().findall(text) if t not in STOPWORDS]
    if stemmer == "none":
        return tokens
    return [_stem(stemmer, t) for t in tokens]


def bm25_analyzer(stemmer: str) -> str:
    """The name of what `bm25_terms(text, stemmer)` computes, e.g. "v3/english".

    Equal names mean equal terms for every text. Raises ValueError when `stemmer` is neither
    "none" nor a Snowball language.
    """
    if stemmer != "none" and stemmer not in snowballstemmer.algorithms():
        raise ValueError(f"unknown stemmer {stemmer!r}: use a Snowball language "
                         f"({', '.join(snowballstemmer.algorithms())}) or 'none'")
    return f"v{TOKENIZER_VERSION}/{stemmer}"


def term_frequencies(text: str, stemmer: str = "english") -> tuple[Counter[str], int]:
    """(term -> count, document length in terms) for one document."""
    terms = bm25_terms(text, stemmer)
    return Counter(terms), len(terms)


# -- the lexical index's sparse vectors ---------------------------------------------------------
# Okapi BM25 splits into a query side and a document side: score(q, d) = Σ idf(t) · w(t, d), with
# w(t, d) = tf·(k1+1) / (tf + k1·(1 − b + b·|d|/avgdl)). A memory's sparse vector holds its w by
# term id, with its scope's `lexical_avgdl` (engram.store.lexical_index.rebase); a query's holds
# the idf. Their dot product
# is BM25 while avgdl holds, and picks the candidates. Three reserved dimensions, which no query
# holds, keep what was used to compute the w (|d|, k1·(1 − b + b·|d|/avgdl) and k1), so each
# term's tf, and with it the memory's exact score under today's statistics, is recovered from
# the vector the index returns (`bm25_score`), as Postgres would compute it.

LENGTH_DIM, NORM_DIM, K1_DIM = 0, 1, 2
_RESERVED = 3


def term_id(term: str) -> int:
    """A term's id in the sparse vectors: a stable 32-bit hash, the same in every process and
    release, never a reserved dimension. Two terms may share an id (~1 pair among 100k terms);
    the lexical index records which ids are shared (engram.store.lexical_index.register_terms)
    and search scores a query holding one in Postgres."""
    h = int.from_bytes(hashlib.blake2b(term.encode(), digest_size=4).digest(), "little")
    return h if h >= _RESERVED else h + _RESERVED


def _length_norm(length: float, avgdl: float, k1: float, b: float) -> float:
    """k1·(1 − b + b·|d|/avgdl), as Postgres computes it (memories.bm25_scores)."""
    return k1 * (1 - b + b * length / max(avgdl, 1.0))


def bm25_document_vector(tf: dict[str, int], length: int, avgdl: float, *, k1: float, b: float) -> dict[int, float]:
    """A memory's sparse vector: each term's saturated, length-normalised frequency, and the
    reserved dimensions."""
    norm = _length_norm(length, avgdl, k1, b)
    vector: dict[int, float] = {LENGTH_DIM: float(length), NORM_DIM: norm, K1_DIM: k1}
    for term, count in tf.items():
        key = term_id(term)
        vector[key] = vector.get(key, 0.0) + count * (k1 + 1) / (count + norm)
    return vector


def bm25_score(vector: dict[int, float], query: dict[int, float], avgdl: float, *, k1: float, b: float
               ) -> float | None:
    """Okapi BM25 of a memory, from its sparse vector as the index returns it (float32 values),
    for a query's sparse vector (`bm25_query_vector`: no two of its terms sharing an id) and its
    scopes' `avgdl`: the score engram.store.memories.bm25_scores gives it, term by term the same
    arithmetic (a sum may differ in the last bit: the order differs). None for a vector without the reserved
    dimensions (written by an earlier release), or where a term's frequency does not come back
    as a whole number (a frequency in the thousands, where float32 runs out of precision)."""
    if NORM_DIM not in vector:
        return None
    indexed_norm, indexed_k1 = vector[NORM_DIM], vector[K1_DIM]
    norm = _length_norm(vector[LENGTH_DIM], avgdl, k1, b)
    score = 0.0
    for key, weight in query.items():
        w = vector.get(key)
        if w:
            estimate = w * indexed_norm / (indexed_k1 + 1 - w)  # w = tf·(k1+1) / (tf + norm), solved for tf
            tf = round(estimate)
            if tf < 1 or abs(estimate - tf) > 0.01:
                return None
            score += weight * tf * (k1 + 1) / (tf + norm)
    return score


def bm25_query_vector(idf: dict[str, float]) -> dict[int, float]:
    """A query's sparse vector: each distinct term's IDF (terms no memory holds left out)."""
    vector: dict[int, float] = {}
    for term, weight in idf.items():
        if weight > 0:
            key = term_id(term)
            vector[key] = vector.get(key, 0.0) + weight
    return vector
