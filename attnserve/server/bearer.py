"""The one bearer-token check of every door: `Authorization: Bearer <token>`, compared in constant time."""

from __future__ import annotations

import hmac


def bearer_matches(given: str | bytes, token: str) -> bool:
    """Whether `given` (an authorization header or metadata value) is `Bearer <token>`."""
    raw = given.encode() if isinstance(given, str) else given
    return hmac.compare_digest(raw, f"Bearer {token}".encode())
