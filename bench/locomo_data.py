"""The LoCoMo dev split as /work/shared/bench/README.md defines it: its conversations, one memory
text per dialogue turn (`[<date>] <speaker>: <text>`), the scorable questions after the evidence
clean-up, and the metrics (Recall@5, Recall@10, nDCG@10, Hit@10, averaged over questions).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DATA = Path("/work/shared/bench/locomo-dev.json")
TOP_K = 10
CATEGORY_NAMES = {1: "1 multi-hop", 2: "2 temporal", 3: "3 open-domain", 4: "4 single-hop",
                  5: "5 adversarial (separate)"}


# -- the data ------------------------------------------------------------------------------------

@dataclass
class Turn:
    dia_id: str
    text: str  # the memory text
    order: int  # position in the conversation
    session: str  # "session_3"


@dataclass
class Question:
    sample_id: str
    index: int  # position in the conversation's qa list
    question: str
    category: int
    evidence: list[str]


@dataclass
class Conversation:
    sample_id: str
    turns: list[Turn]
    questions: list[Question] = field(default_factory=list)


_SESSION = re.compile(r"session_(\d+)")
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")


def evidence_ids(raw: list[str]) -> tuple[list[str], list[str]]:
    """The README's clean-up, up to the check against the turns: split on `;`, `,` and white
    space, read `D:11:26` as `D11:26`, unpad turn numbers, drop duplicates.
    Returns (ids, pieces that are not ids at all)."""
    ids: list[str] = []
    junk: list[str] = []
    for entry in raw:
        for piece in re.split(r"[;,\s]+", entry):
            if not piece:
                continue
            match = _EVIDENCE.fullmatch(piece)
            if not match:
                junk.append(piece)
                continue
            dia_id = f"D{int(match.group(1))}:{int(match.group(2))}"
            if dia_id not in ids:
                ids.append(dia_id)
    return ids, junk


def load(path: Path = DATA) -> tuple[list[Conversation], dict[str, int]]:
    """Conversations with their turns and scorable questions, and counts of what was dropped."""
    conversations = []
    dropped = Counter()
    for sample in json.loads(path.read_text()):
        conv = sample["conversation"]
        sessions = sorted((int(m.group(1)), k) for k in conv if (m := _SESSION.fullmatch(k)))
        turns = []
        for _, key in sessions:
            date = conv[f"{key}_date_time"]
            for turn in conv[key]:
                turns.append(Turn(turn["dia_id"], f"[{date}] {turn['speaker']}: {turn['text']}", len(turns), key))
        known = {t.dia_id for t in turns}
        c = Conversation(sample["sample_id"], turns)
        for index, qa in enumerate(sample["qa"]):
            ids, junk = evidence_ids(qa.get("evidence") or [])
            evidence = [d for d in ids if d in known]
            for d in ids:
                if d not in known:
                    dropped[f"evidence id matching no turn: {c.sample_id} {d}"] += 1
            for piece in junk:
                dropped[f"evidence piece that is no id: {piece!r}"] += 1
            if not evidence:
                dropped[f"category {qa['category']} questions with no evidence"] += 1
                continue
            c.questions.append(Question(c.sample_id, index, qa["question"], int(qa["category"]), evidence))
        conversations.append(c)
    return conversations, dict(dropped)


# -- metrics -------------------------------------------------------------------------------------

def score(ranked: list[str], evidence: list[str]) -> dict[str, float]:
    """Recall@5, Recall@10, nDCG@10 (binary relevance), Hit@10 of one ranked list of dia_ids."""
    e = set(evidence)
    top = ranked[:TOP_K]
    dcg = sum(1 / math.log2(i + 2) for i, d in enumerate(top) if d in e)
    idcg = sum(1 / math.log2(i + 2) for i in range(min(len(e), TOP_K)))
    return {
        "R@5": len(e & set(ranked[:5])) / len(e),
        "R@10": len(e & set(top)) / len(e),
        "nDCG@10": dcg / idcg,
        "Hit@10": 1.0 if e & set(top) else 0.0,
    }


METRICS = ("R@5", "R@10", "nDCG@10", "Hit@10")


def mean_scores(rows: list[dict[str, float]]) -> dict[str, float]:
    return {m: float(np.mean([r[m] for r in rows])) if rows else float("nan") for m in METRICS}


@dataclass
class MethodResult:
    name: str
    per_question: dict[tuple[str, int], dict[str, float]]  # (sample_id, qa index) -> scores

    def summary(self, questions: list[Question], categories: set[int]) -> dict[str, float]:
        return mean_scores([self.per_question[(q.sample_id, q.index)] for q in questions if q.category in categories])
