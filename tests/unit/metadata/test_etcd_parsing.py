"""Pure parts of the etcd backend: endpoint lists and prefix ranges."""

from __future__ import annotations

import pytest

from magnetar.common.errors import InvalidMetadataUrlError
from metadata.etcd import parse_endpoints, prefix_range_end


def test_endpoints_get_the_default_port_and_keep_their_order() -> None:
    assert parse_endpoints("h1:2379, h2 ,10.0.0.3:3379,") == ["h1:2379", "h2:2379", "10.0.0.3:3379"]
    assert parse_endpoints("[::1]:2379") == ["[::1]:2379"]


@pytest.mark.parametrize("bad", ["", ",", "h:0", "h:x", ":2379"])
def test_bad_endpoint_lists_are_named(bad: str) -> None:
    with pytest.raises(InvalidMetadataUrlError):
        parse_endpoints(bad)


def test_prefix_range_end_covers_exactly_the_prefix() -> None:
    assert prefix_range_end(b"/a/") == b"/a0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"\xff\xff") == b"\0"
    end = prefix_range_end(b"/a/")
    assert b"/a/" <= b"/a/zzz" < end
    assert not (b"/a/" <= b"/b" < end)
