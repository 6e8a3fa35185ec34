"""The bounds of a report's window as people write them: a date, an ISO 8601
time or Unix seconds.  One reading for the CLI (``trainyard report``) and the
gateway (``/v1/usage``, ``/v1/reports/capacity``), which name the bad
parameter each in its own way."""

from __future__ import annotations

import datetime as dt
import math


def parse_instant(value: str | None, *, end_of_day: bool = False) -> float | None:
    """A time as Unix seconds from ``YYYY-MM-DD`` (00:00 UTC; with
    ``end_of_day`` the next day's 00:00, so the day is included), an ISO 8601
    date-time (UTC unless it names an offset) or Unix seconds; None for
    nothing given.  Raises ``ValueError`` saying what it accepts."""
    if value is None or value == "":
        return None
    wrong = ValueError(f"{value!r} is not a date (2026-11-01), an ISO 8601 time or Unix seconds")
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise wrong
        return seconds
    try:
        if len(value) == 10:
            day = dt.date.fromisoformat(value) + dt.timedelta(days=1 if end_of_day else 0)
            return dt.datetime.combine(day, dt.time(), dt.UTC).timestamp()
        at = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise wrong from None
    except OverflowError:  # 9999-12-31 to the end of its day
        raise ValueError(f"{value!r} is past the last date this can read (9999-12-30)") from None
    return (at if at.tzinfo else at.replace(tzinfo=dt.UTC)).timestamp()
