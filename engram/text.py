"""Text handling shared by the write and read paths: normalisation, hashing, BM25 tokens."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from functools import lru_cache

import snowballstemmer

_WS = re.compile(r"\s+")
_TOKEN = re.compile(r"[a-z0-9]+")

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
    """BM25 tokens: lower-case `[a-z0-9]+` runs, stopwords removed, then stemmed.

    `stemmer` is a Snowball language name or "none". The same function must tokenise
    documents and queries, or their terms will not meet.
    """
    tokens = [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]
    if stemmer == "none":
        return tokens
    return _stemmer(stemmer).stemWords(tokens)


def term_frequencies(text: str, stemmer: str = "english") -> tuple[Counter[str], int]:
    """(term -> count, document length in terms) for one document."""
    terms = bm25_terms(text, stemmer)
    return Counter(terms), len(terms)
