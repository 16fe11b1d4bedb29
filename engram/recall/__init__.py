"""Recall as explicit stages, each a module with one contract:

candidates (dense and BM25, always inside the caller's scope) → fusion (min-max, weighted)
→ context expansion (optional) → rerank of the top N (optional) → final order (access boost).
`pipeline.Recall` runs them and, on request, explains each stage's scores and timings.
"""
