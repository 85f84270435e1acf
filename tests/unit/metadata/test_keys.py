"""Key rules: valid keys pass untouched; anything else is an InvalidKeyError, never a crash."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.common.errors import InvalidKeyError
from metadata.keys import MAX_KEY_BYTES, check_key, check_prefix, join

segment = st.text(
    alphabet=st.characters(
        blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp"), blacklist_characters="/"
    ),
    min_size=1,
    max_size=20,
).filter(lambda s: s not in (".", "..") and not any(c.isspace() for c in s))


@given(st.lists(segment, min_size=1, max_size=8))
def test_well_formed_keys_are_accepted(segments: list[str]) -> None:
    key = "/" + "/".join(segments)
    if len(key.encode()) <= MAX_KEY_BYTES:
        assert check_key(key) == key
        assert check_prefix(key + "/") == key + "/"
        assert join(*segments) == key


@given(st.text(max_size=60))
def test_any_text_is_either_a_key_or_a_clear_error(text: str) -> None:
    error: InvalidKeyError | None = None
    try:
        accepted = check_key(text)
    except InvalidKeyError as e:
        error = e
    if error is None:
        assert accepted == text
    else:
        assert repr(text) in str(error)


@pytest.mark.parametrize("prefix", ["/", "/a", "/a/", "/a/b/"])
def test_prefixes_may_end_with_a_slash(prefix: str) -> None:
    assert check_prefix(prefix) == prefix


def test_keys_at_the_size_limit() -> None:
    at_limit = "/" + "k" * (MAX_KEY_BYTES - 1)
    assert check_key(at_limit) == at_limit
    with pytest.raises(InvalidKeyError, match=f"at most {MAX_KEY_BYTES} bytes"):
        check_key(at_limit + "k")
    with pytest.raises(InvalidKeyError, match="UTF-8"):
        check_key("/a\ud800")
