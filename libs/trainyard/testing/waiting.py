"""Waiting on a condition in tests: poll it until it holds, never sleep a fixed time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 30.0, what: str | None = None) -> Any:
    """Await ``check()`` every 50 ms until it returns something true, and return that; raise
    ``AssertionError`` naming ``what`` (or the check) after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not true within {timeout}s: {what or getattr(check, '__name__', check)}")
        await asyncio.sleep(0.05)
