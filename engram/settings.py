"""One settings object, read once at start-up from ENGRAM_* environment variables and passed down."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engram.domain.models import MAX_PIPELINE_TIMEOUT_MS, MAX_RERANK_TOP_N
from engram.domain.provenance import DEFAULT_SOURCES, DEFAULT_TRUST, Lifetimes, Trust

ProviderName = Literal["ollama", "openai", "local", "none"]
LOCAL_LLM_TIMEOUT_S = 120.0


class Settings(BaseSettings):
    """Every knob Engram reads. The README's configuration table documents each field."""

    model_config = SettingsConfigDict(env_prefix="ENGRAM_", extra="ignore")

    # Where the embedded stack keeps its state.
    data_dir: Path = Path("./data")

    # HTTP gateway.
    http_host: str = "127.0.0.1"
    http_port: int = 8080

    # gRPC gateway, served by the same API process (not Temporal's port: temporal_grpc_port).
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 50051

    # System of record. Empty: `engram up` starts embedded Postgres under data_dir.
    postgres_dsn: str = ""
    embedded_postgres_port: int = 55432
    # Its buffer cache in MB. 0: an eighth of the machine's memory, 128 MB to 1 GB
    # (worker.embedded.default_shared_buffers_mb: why).
    embedded_postgres_shared_buffers_mb: int = Field(default=0, ge=0)
    # pg_stat_statements, whose view in the `postgres` database says which statements take the
    # time (runbooks/SlowSearch.md): on while diagnosing. Off by default: at 10k memories in one
    # scope it cost search p95 1.07x (interval 1.01-1.14) and Postgres 35% more CPU
    # (bench/reports/search-ab-stat-statements.md).
    embedded_postgres_stat_statements: bool = False
    postgres_pool_min: int = 2
    postgres_pool_max: int = 10

    # Temporal. Empty address: `engram up` starts the dev server (SQLite file under data_dir).
    temporal_address: str = ""
    temporal_namespace: str = "default"
    temporal_task_queue: str = "engram"
    temporal_grpc_port: int = 7233
    temporal_ui_port: int = 8233
    # A workflow's next task waits this long for the worker that ran it last (which holds it in
    # memory) before any worker may take it: after that worker died, how long its workflows wait.
    temporal_sticky_queue_timeout_s: float = Field(default=10.0, gt=0)

    # Vectors. Empty URL: the in-process Qdrant edge shard under data_dir.
    qdrant_url: str = ""
    qdrant_api_key: str = ""
    qdrant_collection: str = "engram_memories"
    # The edge shard searches new points by brute force until it is optimised (HNSW graphs,
    # merged segments): once this many more are waiting than after the last optimisation, the
    # process that serves it optimises a copy in a child process (checked every
    # index_optimize_check_s). 0: never.
    index_optimize_after: int = Field(default=10_000, ge=0)
    index_optimize_check_s: float = Field(default=60.0, gt=0)
    # Threads of each edge shard's search pool, which searches the shard's segments side by side
    # (qdrant-edge's max_search_threads). The engine's own default is 8 on 2 CPUs, and each idle
    # thread spins on sched_yield after every search (~300 calls a search at 10k memories). On 2
    # cores, one thread against 8 in two runs each: at 10k memories in one scope search p50
    # 0.93-0.95x, p95 0.92-0.97x, CPU 0.91-0.93x; at 100k p50 0.99-1.00x, p95 0.95-0.98x, CPU
    # 0.96-0.98x (bench/reports/search-ab-search-threads*.md, the later runs). A shard holds one
    # or two segments here.
    index_search_threads: int = Field(default=1, ge=1)

    # Embeddings: a local int8 ONNX model (no network) unless embedding_provider says otherwise.
    # Through the service on LoCoMo dev, bge-small gives R@10 .719 / nDCG@10 .537 and MiniLM
    # .700 / .520 (bench/reports/locomo.md).
    embedding_model: Literal["all-MiniLM-L6-v2", "bge-small-en-v1.5"] = "bge-small-en-v1.5"
    # Local model runs side by side (one thread each) for documents; a query runs in its own thread.
    # Also the cross-encoder's lanes: a rerank's model runs side by side, one thread each.
    embedding_threads: int = Field(default=2, ge=1)
    # Those runs' threads are this much nicer than the rest (Linux), so a search or a remember
    # preempts a backlog's embedding instead of sharing a core with it; 0: same priority.
    embedding_nice: int = Field(default=10, ge=0, le=19)
    # ...and run under SCHED_IDLE (Linux): a waking search thread preempts them at once. A busy
    # machine then leaves a backlog only its spare CPU: it drains when searches pause.
    embedding_idle: bool = True
    # Changing the model re-embeds every memory in batches of this size (a ReembedWorkflow).
    reembed_batch_size: int = 64
    # Or a remote embedder, held to local_only and provider_allowlist like the LLM providers.
    embedding_provider: Literal["local", "ollama", "openai"] = "local"
    ollama_embedding_model: str = "nomic-embed-text"
    openai_embedding_model: str = "text-embedding-3-small"

    # LLM providers: preferred, then secondary, then none (raw save).
    llm_provider: ProviderName = "ollama"
    llm_secondary: ProviderName = "none"
    ollama_url: str = "http://127.0.0.1:11434"
    ollama_model: str = "llama3.2:3b"
    openai_base_url: str = "http://127.0.0.1:8000/v1"
    openai_api_key: str = ""
    openai_model: str = "gpt-4o-mini"
    # "local": `engram up` runs Qwen2.5-Coder-1.5B-Instruct on llama.cpp in a child process of its
    # own (engram.inference.local_llm; `make llm` fetches it), on this loopback port, with this
    # many threads; its model file is local_llm_model_path, or None: <data_dir>/models/.
    local_llm_port: int = 18080
    local_llm_threads: int = Field(default=2, ge=1)
    local_llm_model_path: Path | None = None
    # With the local model as the provider, what is not set says otherwise: it answers one call at
    # a time in 5-15 s on 2 cores (so a call may wait for others), and its decisions are poor
    # (`make test-llm`), so facts are only added (`_local_defaults`).
    llm_timeout_s: float = 20.0
    # Before any call to an LLM provider, secrets in memory text (API keys, tokens, private keys,
    # passwords in URLs and assignments, and these terms) are replaced by placeholders; the map
    # back stays in the process, and stored facts get the originals back (engram.domain.redaction).
    redact_outbound: bool = True
    redact_terms: list[str] = Field(default_factory=list)
    local_only: bool = True
    provider_allowlist: list[str] = Field(default_factory=list)

    # Remember pipeline. How long `auto` mode waits for the first pass when a request does not
    # say (pipeline_timeout_ms; at most engram.domain.models.MAX_PIPELINE_TIMEOUT_MS, `sync`'s wait).
    pipeline_timeout_ms_default: int = Field(default=2_000, ge=0, le=MAX_PIPELINE_TIMEOUT_MS)
    # Attempts at extracting one memory that fail for its own sake (a malformed answer); an
    # outage uses none. Between them the job is parked for backoff_initial_s, doubling to max_s.
    extraction_max_attempts: int = 8
    extraction_backoff_initial_s: float = 30.0
    extraction_backoff_max_s: float = 3_600.0
    # The semantic write pipeline (engram.fact_steps): each extracted fact becomes a memory of
    # kind "fact", or changes one, as a model decides beside its scope's nearest facts.
    # off: facts stay on the raw memory only; shadow: decisions are recorded, nothing written;
    # add_only: facts are added, no UPDATE or DELETE; full: every decision, within the thresholds.
    write_pipeline: Literal["off", "shadow", "add_only", "full"] = "full"
    decision_candidates: int = Field(default=5, ge=1, le=20)  # nearest facts shown per new fact
    # A new fact this close (cosine) to an existing one, saying the same (no negation or number
    # differs), is MERGEd onto it without a model. bge-small: a paraphrase scores 0.96-0.99,
    # "lives in Paris"/"in Berlin" 0.83, "allergic"/"not allergic" 0.94.
    merge_similarity: float = Field(default=0.95, ge=0.5, le=1.0)
    # Two facts of one extraction this close (cosine) that differ by a negation or a number oppose
    # each other ("allergic"/"not allergic" 0.94, "2"/"3 children" 0.91): both kept, for review.
    batch_contradiction_similarity: float = Field(default=0.85, ge=0.5, le=1.0)
    # The confidence a model's UPDATE or DELETE needs; below it, its fact is added instead.
    decision_min_confidence_update: float = Field(default=0.6, ge=0.0, le=1.0)
    decision_min_confidence_delete: float = Field(default=0.8, ge=0.0, le=1.0)
    # A model's UPDATE, DELETE or CONTRADICT acts only on a memory this close (cosine) to the fact
    # it decides about, and an UPDATE's new content must stay content_similarity close to the fact,
    # as must a NONE's memory (it stands for the fact from then on).
    # bench/reports/write-pipeline.md: real changes of one subject score 0.63-0.90 ("moved to
    # Mombasa" / "lives in Oslo" 0.69), an injected "delete everything" 0.43-0.55.
    decision_min_similarity: float = Field(default=0.6, ge=0.0, le=1.0)
    decision_min_content_similarity: float = Field(default=0.8, ge=0.0, le=1.0)
    # A contradiction (opposing facts) waits this long for a person, then the default applies.
    review_ttl_s: float = Field(default=7 * 86_400, gt=0)
    review_default: Literal["keep_both", "keep_existing", "replace"] = "keep_both"
    # Provenance (engram.domain.provenance). A write's trust is its source type's class in
    # trust_sources (JSON; it replaces the default table), else trust_default; a relayed one's
    # (origin) the lower of the two. PATTERN, CONTEXT and LEARNED memories expire after their
    # lifetime, a STATE when its scope's next session begins or after lifetime_state_s. A FACT
    # from an UNTRUSTED source, and any LEARNED, wait as pending until an operator approves,
    # rejects or quarantines them; after write_approval_ttl_s, write_approval_timeout applies.
    # trust_and_lifetimes=false: every write TRUSTED, permanent and unreviewed (as before them).
    trust_and_lifetimes: bool = True
    trust_sources: dict[str, Trust] = Field(default_factory=lambda: dict(DEFAULT_SOURCES))
    trust_default: Trust = DEFAULT_TRUST
    lifetime_pattern_s: float = Field(default=90 * 86_400, gt=0)
    lifetime_context_s: float = Field(default=86_400, gt=0)
    lifetime_learned_s: float = Field(default=30 * 86_400, gt=0)
    lifetime_state_s: float = Field(default=86_400, gt=0)
    write_approval_ttl_s: float = Field(default=7 * 86_400, gt=0)
    write_approval_timeout: Literal["reject", "quarantine"] = "reject"
    # Search ranks a raw memory below the facts taken from it: its score is multiplied by this
    # while it has a live fact (1: no preference).
    rank_raw_with_facts: float = Field(default=0.9, ge=0.0, le=1.0)
    # Extractions one worker runs at once (in a batch, and in the drain).
    extraction_concurrency: int = Field(default=4, ge=1)
    # The dispatcher: it wakes on every new job and every interval_s, waits batch_window_ms for a
    # burst to gather, and keeps at most inflight_batches batches of batch_size memories running.
    dispatcher_interval_s: float = 1.0
    ingest_batch_size: int = Field(default=128, ge=1, le=1000)
    ingest_batch_window_ms: int = Field(default=20, ge=0)
    ingest_inflight_batches: int = Field(default=4, ge=1)
    # `auto` answers at once (`queued`, with a warning) instead of waiting for the first pass
    # while more remember jobs than this wait for their batch.
    write_queue_bound: int = Field(default=2_000, ge=0)
    # ...or while the oldest of them has waited longer than this (the worker or Temporal is down).
    pipeline_stall_s: float = Field(default=10.0, gt=0)
    # A bulk remember (POST /api/memory/remember/batch) takes at most this many items.
    remember_batch_max: int = Field(default=500, ge=1, le=5_000)
    # A bulk remember's items are staged in one statement and a worker writes them (at most
    # import_writers at once, at its niceness), so that the API keeps its CPU for searches; one
    # no worker has taken after import_handoff_s, the API writes itself. 0: the API writes every
    # one itself, as it arrives.
    import_handoff_s: float = Field(default=2.0, ge=0)
    import_writers: int = Field(default=4, ge=0)
    # Single remembers that arrive while others are being written share a transaction (group
    # commit, engram.group_commit). False: a transaction each.
    remember_group_commit: bool = True
    # The drain of parked extractions: probe a down provider after probe_initial_s, doubling to
    # probe_max_s; take drain_batch_size parked jobs at a time, at most drain_rate_per_s a second;
    # look for due work every drain_idle_s.
    provider_probe_initial_s: float = 5.0
    provider_probe_max_s: float = 300.0
    drain_batch_size: int = Field(default=32, ge=1)
    drain_rate_per_s: float = Field(default=20.0, gt=0)
    drain_idle_s: float = Field(default=5.0, gt=0)
    # How long a step whose worker died goes unnoticed before Temporal retries it on another: a
    # batch's embed and extract, a drain step and a batch forget's chunk heartbeat every 5 s (so
    # at least 8 s); a re-embed batch heartbeats as it starts, so it must end within its timeout.
    # Read when a run starts; a run keeps the values it started with.
    ingest_heartbeat_timeout_s: float = Field(default=15.0, ge=8)
    drain_heartbeat_timeout_s: float = Field(default=15.0, ge=8)
    forget_heartbeat_timeout_s: float = Field(default=20.0, ge=8)
    reembed_heartbeat_timeout_s: float = Field(default=10.0, gt=0)
    # The worker process runs at this CPU niceness (0-19) under `engram up` and `engram worker`,
    # so that a backlog being worked off yields the CPU to searches.
    worker_niceness: int = Field(default=10, ge=0, le=19)
    # glibc's malloc in the API and worker processes asks for transparent huge pages, so the
    # embedding model's weights are read through fewer page translations (worker.huge_pages).
    malloc_huge_pages: bool = True

    # Ranking: a*vector + b*BM25 + c*log(1+access_count). The access boost is off by default:
    # it makes a search's results depend on which searches came before (each one counts an
    # access), and on LoCoMo dev through the service it cost R@10 .004 (bench/reports/locomo.md).
    rank_vector_weight: float = 0.5
    rank_bm25_weight: float = 0.5
    rank_access_weight: float = 0.0
    bm25_k1: float = 1.2
    # Less length normalisation than the textbook 0.75: a conversation's longer turns carry
    # more of its facts. On LoCoMo dev through the service, in three ingests, 0.5 raised R@10 /
    # nDCG@10 by .003 / .009, .003 / .003 and .001 / .005 (0.3: nDCG up, R@10 not). Changing k1 or b has
    # the lexical index's points reweighed at the index owner's next start (lexical_steps.settle).
    bm25_b: float = 0.5
    # Changing it (or a release that bumps engram.domain.text.TOKENIZER_VERSION) rebuilds every memory's
    # BM25 postings and statistics once, at the next start-up, in one transaction: searches use
    # the old ones until it commits and writes wait for it.
    bm25_stemmer: str = "english"
    # Candidates from each leg before fusion; every stage after the legs works per candidate.
    # LoCoMo dev scores the same at 30 as at 50 (R@10 .726 / nDCG@10 .545 against .725 / .546),
    # and at 10k memories in one scope 30 took search p50 0.86x and p95 0.88x, CPU 0.87x
    # (bench/reports/search-ab-search-candidates-30.md).
    search_candidates: int = Field(default=30, ge=1)
    # ...and when the search reranks: the cross-encoder reorders more than fusion kept at 30 (its
    # R@10 .758 against .764 at 50), and takes ~15x a search's time anyway.
    rerank_candidates: int = Field(default=50, ge=1)
    # Context expansion: lift by this times the fused scores of the turns before and after
    # in the same session; 0 turns it off.
    expansion_weight: float = 0.1
    # Cross-encoder rerank of the fused top N: opt-in per request, or on by default here.
    # "llm": the primary LLM provider scores the passages instead, if llm_rerank vouches for it.
    rerank_model: Literal["ms-marco-MiniLM-L-12-v2", "llm", "none"] = "ms-marco-MiniLM-L-12-v2"
    rerank_default: bool = False
    rerank_top_n: int = Field(default=20, ge=1, le=MAX_RERANK_TOP_N)
    rerank_timeout_ms: int = 2_000
    # The cross-encoder reorders as many of the top N as it expects to score in this time (at
    # least one; the rest keep their fused order below them), so a slower machine or a queue of
    # reranks shortens the list, not the answer's time. 0: always the whole top N.
    rerank_budget_ms: int = Field(default=350, ge=0)
    # The reranker judges a memory with the one before it in its session ("<memory> (after:
    # <previous>)"): a reply often makes sense only next to what it answers (recall.rerank.with_context).
    rerank_session_context: bool = True
    # Declares the primary LLM provider's model able to judge relevance (its `rerank` capability).
    llm_rerank: bool = False

    # Changes by id (engram.changes). A deleted memory can be recovered for tombstone_days; a
    # person's edit (any role but agent) locks a memory against automatic changes (agents,
    # the pipeline) for manual_override_s unless an operator forces them; modify and forget
    # are limited per caller to change_rate_per_s with bursts of change_burst (429 beyond).
    tombstone_days: float = Field(default=30.0, gt=0)
    manual_override_s: float = Field(default=7 * 24 * 3600.0, ge=0)
    change_rate_per_s: float = Field(default=50.0, gt=0)
    change_burst: int = Field(default=200, ge=1)
    # Batch forget (engram.forget): at most forget_max_items per operation; above
    # approval_threshold items (or with a pinned one) an operator other than the requester must
    # approve within approval_ttl_s; a preview's confirm token lasts forget_confirm_ttl_s;
    # forget_dry_run makes every execute a preview (canaries).
    forget_max_items: int = Field(default=1_000, ge=1, le=1_000)
    approval_threshold: int = Field(default=25, ge=0)
    approval_ttl_s: float = Field(default=24 * 3600.0, gt=0)
    forget_confirm_ttl_s: float = Field(default=900.0, gt=0)
    forget_dry_run: bool = False
    # A delete spike: more single deletes than this in one scope within the window freeze that
    # scope (engram.control) until an operator lifts it.
    delete_spike_threshold: int = Field(default=100, ge=1)
    delete_spike_window_s: float = Field(default=60.0, gt=0)
    # The chain sealer: how many history events it chains into their scopes' chains per pass.
    seal_batch: int = Field(default=1_000, ge=1)

    # Security baseline.
    dev_api_key: str = ""

    @property
    def lifetimes(self) -> Lifetimes:
        return Lifetimes(pattern=self.lifetime_pattern_s, context=self.lifetime_context_s,
                         learned=self.lifetime_learned_s, state=self.lifetime_state_s)

    @model_validator(mode="after")
    def _local_defaults(self) -> "Settings":
        """The local model's defaults, for the fields neither the environment nor the caller set."""
        if self.llm_provider == "local":
            if "llm_timeout_s" not in self.model_fields_set:
                self.llm_timeout_s = LOCAL_LLM_TIMEOUT_S
            if "write_pipeline" not in self.model_fields_set:
                self.write_pipeline = "add_only"
        return self
