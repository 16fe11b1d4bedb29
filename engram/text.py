"""Text handling shared by the write and read paths: normalisation, hashing, BM25 tokens."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from functools import lru_cache

import snowballstemmer

_WS = re.compile(r"\s+")
_TOKEN = re.compile(r"[^\W_]+")  # runs of letters and digits, in any script

# The version of bm25_terms's own rules (splitting, lower-casing, stopwords) and of the pinned
# snowballstemmer. Bump it with any change to either: stored postings name the analyzer that
# built them, and a start-up with another analyzer rebuilds them (see bm25_analyzer).
TOKENIZER_VERSION = 2  # 2: letters of any script, not only a-z (1 split "café" into "caf")

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


def bm25_terms(text: str, stemmer: str = "english") -> list[str]:
    """BM25 tokens: lower-cased runs of letters and digits, stopwords removed, then stemmed.

    `stemmer` is a Snowball language name or "none". The same function must tokenise
    documents and queries, or their terms will not meet.
    """
    tokens = [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]
    if stemmer == "none":
        return tokens
    return _stemmer(stemmer).stemWords(tokens)


def bm25_analyzer(stemmer: str) -> str:
    """The name of what `bm25_terms(text, stemmer)` computes, e.g. "v1/english".

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
