"""The rules every metadata key and prefix follows, checked the same way by every backend.

A key is a ``/``-separated path: ``/magnetar/ledgers/00000000000000000042``. Rules:

- it starts with ``/`` and is at most :data:`MAX_KEY_BYTES` bytes of UTF-8;
- it has no empty segment (``//``), no ``.`` or ``..`` segment, and does not end with ``/``;
- it contains no whitespace and no control characters.

A prefix follows the same rules except that it may end with ``/`` (and may be ``/`` itself, the
whole store). Prefix matching is plain string prefix matching, as in etcd: ``/a/b`` matches
``/a/bc``; end a prefix with ``/`` to list one folder.
"""

from __future__ import annotations

from magnetar.common.errors import InvalidKeyError

MAX_KEY_BYTES = 1024
"""Longest key accepted, in UTF-8 bytes."""


def _problem(text: str, *, prefix: bool) -> str | None:
    what = "prefix" if prefix else "key"
    if not text.startswith("/"):
        return f"a {what} must start with '/'"
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_KEY_BYTES:
        return f"a {what} may be at most {MAX_KEY_BYTES} bytes of UTF-8 (this one is {size})"
    for ch in text:
        if ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F:
            return f"a {what} may not contain whitespace or control characters (found {ch!r})"
        if 0xD800 <= ord(ch) <= 0xDFFF:
            return f"a {what} must be valid UTF-8 text (found a lone surrogate)"
    if text == "/":
        return None if prefix else "'/' is the root, not a key"
    body = text[1:-1] if (prefix and text.endswith("/")) else text[1:]
    if not prefix and text.endswith("/"):
        return "a key may not end with '/'"
    for segment in body.split("/"):
        if segment == "":
            return f"a {what} may not contain an empty segment ('//')"
        if segment in (".", ".."):
            return f"a {what} may not contain a '.' or '..' segment"
    return None


def check_key(key: object) -> str:
    """Return ``key`` if it is a valid key, else raise :class:`InvalidKeyError` saying why."""
    if not isinstance(key, str):
        raise InvalidKeyError(
            f"metadata keys are str, got {type(key).__name__}: {key!r}", context={"key": repr(key)}
        )
    problem = _problem(key, prefix=False)
    if problem is not None:
        raise InvalidKeyError(f"invalid metadata key {key!r}: {problem}", context={"key": key})
    return key


def check_prefix(prefix: object) -> str:
    """Return ``prefix`` if it is a valid prefix, else raise :class:`InvalidKeyError`."""
    if not isinstance(prefix, str):
        raise InvalidKeyError(
            f"metadata prefixes are str, got {type(prefix).__name__}: {prefix!r}",
            context={"prefix": repr(prefix)},
        )
    problem = _problem(prefix, prefix=True)
    if problem is not None:
        raise InvalidKeyError(
            f"invalid metadata prefix {prefix!r}: {problem}", context={"prefix": prefix}
        )
    return prefix


def join(*segments: str) -> str:
    """Build a key from segments: ``join("/magnetar", "ledgers", "42")``. Validates the result."""
    return check_key("/".join(s.strip("/") for s in ("", *segments)))
