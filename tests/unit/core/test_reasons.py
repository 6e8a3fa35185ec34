"""Every reason a job can wait has words a person can act on."""

from __future__ import annotations

import pytest

from trainyard.core.reasons import REASON_TEXT, PendingReason


@pytest.mark.parametrize("reason", list(PendingReason), ids=[r.value for r in PendingReason])
def test_every_pending_reason_has_text(reason: PendingReason) -> None:
    assert len(REASON_TEXT[reason]) > 10
