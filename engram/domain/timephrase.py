"""Time phrases in search filters: "yesterday", "last 3 months", "since 2024-05-01", ..."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from engram.domain.errors import ValidationFailed

EARLIEST = datetime(1, 1, 1, tzinfo=timezone.utc)
_MAX_COUNT_DIGITS = 9  # "last 999999999 days" already reaches back past year 1
_UNITS = {"minute": 60, "hour": 3_600, "day": 86_400, "week": 7 * 86_400}
_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
          "seven": 7, "eight": 8, "nine": 9, "ten": 10, "twelve": 12}
_LAST_N = re.compile(r"^(?:last|past|previous|in the last|in the past)\s+(\w+)\s+(minute|hour|day|week|month|year)s?$")
_LAST_ONE = re.compile(r"^(?:last|past|previous)\s+(minute|hour|day|week|month|year)$")
_THIS = re.compile(r"^this\s+(week|month|year)$")
_AGO = re.compile(r"^(\w+)\s+(minute|hour|day|week|month|year)s?\s+ago$")
_SINCE = re.compile(r"^(?:since|after)\s+(\d{4}-\d{2}-\d{2})$")
_BEFORE = re.compile(r"^(?:before|until)\s+(\d{4}-\d{2}-\d{2})$")
_OLDER = re.compile(r"^older than\s+(\w+)\s+(minute|hour|day|week|month|year)s?$")


def _shift_months(when: datetime, months: int) -> datetime:
    month = when.month - 1 - months
    year = when.year + month // 12
    month = month % 12 + 1
    day = min(when.day, [31, 29 if year % 4 == 0 and (year % 100 or year % 400 == 0) else 28,
                         31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1])
    return when.replace(year=year, month=month, day=day)


def _ago(now: datetime, count: int, unit: str) -> datetime:
    """`count` units before `now`; the earliest instant there is when that lies before year 1."""
    try:
        if unit == "month":
            return _shift_months(now, count)
        if unit == "year":
            return _shift_months(now, 12 * count)
        return now - timedelta(seconds=count * _UNITS[unit])
    except (OverflowError, ValueError):  # a year below 1
        return EARLIEST


def _count(word: str, phrase: str) -> int:
    # ASCII only: "²" passes str.isdigit but is no number int() reads.
    if word.isascii() and word.isdigit():
        if len(word) > _MAX_COUNT_DIGITS:
            raise ValidationFailed(f"the number in time phrase {phrase[:40]!r}... has over {_MAX_COUNT_DIGITS} digits")
        return int(word)
    if word in _WORDS:
        return _WORDS[word]
    raise ValidationFailed(f"cannot read the number {word!r} in time phrase {phrase!r}")


def _day(text: str, phrase: str) -> datetime:
    try:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    except ValueError:
        raise ValidationFailed(f"bad date {text!r} in time phrase {phrase!r}") from None


def parse_time_phrase(phrase: str, now: datetime) -> tuple[datetime | None, datetime | None]:
    """The [start, end) window a phrase names, relative to `now` (UTC; days start at midnight).
    A window reaching back past year 1 is cut there ("last 5000 years" is everything).

    Raises ValidationFailed for a phrase it does not understand, never guesses.
    """
    text = " ".join(phrase.lower().split())
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if text == "today":
        return midnight, None
    if text == "yesterday":
        return midnight - timedelta(days=1), midnight
    if m := _LAST_N.match(text):
        return _ago(now, _count(m.group(1), phrase), m.group(2)), None
    if m := _LAST_ONE.match(text):
        return _ago(now, 1, m.group(1)), None
    if m := _THIS.match(text):
        unit = m.group(1)
        if unit == "week":
            return midnight - timedelta(days=midnight.weekday()), None
        if unit == "month":
            return midnight.replace(day=1), None
        return midnight.replace(month=1, day=1), None
    if m := _AGO.match(text):
        point = _ago(now, _count(m.group(1), phrase), m.group(2))
        start = point.replace(hour=0, minute=0, second=0, microsecond=0)
        return start, start + timedelta(days=1)
    if m := _SINCE.match(text):
        return _day(m.group(1), phrase), None
    if m := _BEFORE.match(text):
        return None, _day(m.group(1), phrase)
    if m := _OLDER.match(text):
        return None, _ago(now, _count(m.group(1), phrase), m.group(2))
    raise ValidationFailed(
        f"cannot understand time phrase {phrase!r}; try 'today', 'yesterday', 'last 3 months', "
        "'past 2 weeks', 'this month', '3 days ago', 'since 2024-05-01', 'older than 1 year'"
    )
