"""Where a memory came from and how far to trust it; what kind of memory it is and how long it
lasts; which writes wait for a person's approval.

Trust is a source's, from the classification in settings (`trust_sources`): a memory relayed
from another source (`origin`) is as trusted as the lower of the two, and a memory derived from
others (a fact) as the lowest of its inputs. An UNTRUSTED memory's confidence is at most
UNTRUSTED_CONFIDENCE_CAP, however sure its writer or the model was.

Types give default lifetimes. An expired memory leaves default recall; it is never deleted, and
`include_expired` finds it. A STATE lasts one session: until the scope's next session begins
(a memory with another session_id) or, at the latest, `state` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, get_args

Trust = Literal["UNTRUSTED", "SEMI_TRUSTED", "TRUSTED"]
TRUST_LEVELS: tuple[str, ...] = get_args(Trust)  # lowest first
UNTRUSTED_CONFIDENCE_CAP = 0.5

MemoryType = Literal["FACT", "PATTERN", "PREFERENCE", "DECISION", "STATE", "CONTEXT", "LEARNED"]
MEMORY_TYPES: tuple[str, ...] = get_args(MemoryType)

# The free-text `type` labels written before types existed (and the extraction's fact types),
# read as the type they name; any other label is a FACT.
_LABELS = {"fact": "FACT", "facts": "FACT", "event": "FACT", "relationship": "FACT", "pattern": "PATTERN",
           "habit": "PATTERN", "preference": "PREFERENCE", "decision": "DECISION", "plan": "DECISION",
           "state": "STATE", "context": "CONTEXT", "learned": "LEARNED", "lesson": "LEARNED"}

# What an unlisted source is, and the default classification (ENGRAM_TRUST_SOURCES replaces it).
DEFAULT_TRUST: Trust = "SEMI_TRUSTED"
DEFAULT_SOURCES: dict[str, Trust] = {
    "user": "TRUSTED", "operator": "TRUSTED", "system": "TRUSTED",
    "agent": "SEMI_TRUSTED", "tool": "SEMI_TRUSTED", "conversation": "SEMI_TRUSTED",
    "web": "UNTRUSTED", "email": "UNTRUSTED", "document": "UNTRUSTED", "external": "UNTRUSTED",
}


def lowest(*levels: str) -> str:
    """The least trusted of `levels` (at least one)."""
    return min(levels, key=TRUST_LEVELS.index)


def classify(source_type: str | None, sources: dict[str, str], default: str) -> str:
    """A source type's trust level: its class in `sources`, else `default` (no source too)."""
    return sources.get(source_type, default) if source_type is not None else default


def capped(confidence: float, trust: str) -> float:
    """`confidence` as a memory of `trust` may hold it."""
    return min(confidence, UNTRUSTED_CONFIDENCE_CAP) if trust == "UNTRUSTED" else confidence


def type_of(label: str | None) -> str:
    """The memory type a free-text label names (case-insensitive); a FACT for any other."""
    if label is None:
        return "FACT"
    upper = label.strip().upper()
    return upper if upper in MEMORY_TYPES else _LABELS.get(label.strip().lower(), "FACT")


@dataclass(frozen=True)
class Lifetimes:
    """Each passing type's default lifetime, in seconds; types not here are permanent."""

    pattern: float
    context: float
    learned: float
    state: float  # a STATE's longest session

    def expires_at(self, memory_type: str, now: datetime) -> datetime | None:
        seconds = {"PATTERN": self.pattern, "CONTEXT": self.context, "LEARNED": self.learned,
                   "STATE": self.state}.get(memory_type)
        return None if seconds is None else now + timedelta(seconds=seconds)


def needs_approval(memory_type: str, trust: str) -> str | None:
    """Why a write of this type and trust waits for a person's approval, or None."""
    if memory_type == "LEARNED":
        return "a LEARNED memory changes how an agent behaves: a person approves it first"
    if memory_type == "FACT" and trust == "UNTRUSTED":
        return "a FACT from an UNTRUSTED source could poison what agents recall: a person approves it first"
    return None
