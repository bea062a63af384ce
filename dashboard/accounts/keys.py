"""The API key format: ``po_<prefix>_<secret>``.

The prefix (16 hex characters) is public and indexed: it finds the key row. The
secret is 32 random bytes (urlsafe base64). Only sha256 of the whole key text is
stored: with 256 bits of randomness nothing can be brute-forced from the hash, so a
fast hash is right and a slow password hash would only tax every ingest request.
"""

from __future__ import annotations

import hashlib
import re
import secrets

KEY_PATTERN = re.compile(r"^po_([0-9a-f]{16})_([A-Za-z0-9_-]{20,128})$")


def new_prefix() -> str:
    return secrets.token_hex(8)


def new_key_text(prefix: str) -> str:
    return f"po_{prefix}_{secrets.token_urlsafe(32)}"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_prefix(key: str) -> str | None:
    """The prefix of a well-formed key text, else None."""
    match = KEY_PATTERN.match(key)
    return match.group(1) if match else None
