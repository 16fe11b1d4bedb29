from datetime import datetime, timezone

import pytest

from engram.domain.errors import ValidationFailed
from engram.domain.timephrase import parse_time_phrase

NOW = datetime(2025, 5, 31, 15, 30, tzinfo=timezone.utc)  # a Saturday


def d(*args):
    return datetime(*args, tzinfo=timezone.utc)


@pytest.mark.parametrize("phrase, expected", [
    ("today", (d(2025, 5, 31), None)),
    ("yesterday", (d(2025, 5, 30), d(2025, 5, 31))),
    ("Last 3 Months", (d(2025, 2, 28, 15, 30), None)),  # 31 May minus 3 months: the month has no 31st
    ("past 2 weeks", (d(2025, 5, 17, 15, 30), None)),
    ("last week", (d(2025, 5, 24, 15, 30), None)),
    ("in the last seven days", (d(2025, 5, 24, 15, 30), None)),
    ("last year", (d(2024, 5, 31, 15, 30), None)),
    ("this month", (d(2025, 5, 1), None)),
    ("this week", (d(2025, 5, 26), None)),
    ("3 days ago", (d(2025, 5, 28), d(2025, 5, 29))),
    ("since 2024-05-01", (d(2024, 5, 1), None)),
    ("before 2024-05-01", (None, d(2024, 5, 1))),
    ("older than 1 year", (None, d(2024, 5, 31, 15, 30))),
])
def test_phrases_name_a_window(phrase, expected):
    assert parse_time_phrase(phrase, NOW) == expected


@pytest.mark.parametrize("phrase", ["a while back", "last blue moon", "since yesterday-ish", "since 2024-13-45",
                                    "last many days", ""])
def test_unknown_phrases_are_refused_not_guessed(phrase):
    with pytest.raises(ValidationFailed):
        parse_time_phrase(phrase, NOW)
