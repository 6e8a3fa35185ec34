"""Header handling of the bus client: the parser gives the stock nats-py result for any block, and a header that would break the protocol or a message over the limit is refused before sending."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client

from trainyard.bus.client import PayloadTooLarge, ResilientClient, check_publishable

stock = Client._parse_header_lines
ours = ResilientClient._parse_header_lines

LINE_PARTS = st.sampled_from(
    [
        b"Nats-Msg-Id",
        b"Trainyard-Reason",
        b":",
        b": ",
        b" ",
        b"\t",
        b"\r\n",
        b"\x1c",
        b"a b",
        b"\xff",
        b"\xc3\xa9",
        b"v",
    ]
)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"Nats-Msg-Id: abc\r\nNats-Expected-Last-Subject-Sequence: 7\r\n\r\n", id="what events carry"),
        pytest.param(b"Name:Value\r\nName2:\tValue2\r\n", id="no space after the colon"),
        pytest.param(b"Bad Name: x\r\nGood: y\r\n", id="a name with a space inside is skipped"),
        pytest.param(b"\x1cName: x\r\n\x1c: y\r\n: z\r\n", id="separator characters and an empty name"),
        pytest.param(b"N\xffame: x\r\nUtf: \xff\xc3\xa9\r\n", id="a name that is not ASCII, a value that is not UTF-8"),
        pytest.param(b"no colon here\r\n\r\n", id="a line without a colon"),
    ],
)
def test_known_blocks_parse_as_the_stock_client_parses_them(raw: bytes) -> None:
    assert ours(raw) == stock(raw)


@given(st.lists(LINE_PARTS, max_size=30).map(b"".join) | st.binary(max_size=200))
def test_any_block_parses_as_the_stock_client_parses_it(raw: bytes) -> None:
    assert ours(raw) == stock(raw)


class _Connection:
    max_payload = 1024


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"Trainyard-Reason": "a\nb"}, id="a line feed in a value"),
        pytest.param({"Trainyard-Reason": "a\rb"}, id="a carriage return in a value"),
        pytest.param({"Bad\nName": "x"}, id="a line feed in a name"),
    ],
)
def test_a_header_with_a_line_break_is_refused_before_sending(headers: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="line break"):
        check_publishable(_Connection(), "s", b"", headers)  # type: ignore[arg-type]


def test_a_message_over_the_payload_limit_is_refused_with_its_size() -> None:
    with pytest.raises(PayloadTooLarge):
        check_publishable(_Connection(), "s", b"x" * 1000, {"Nats-Msg-Id": "m" * 100})  # type: ignore[arg-type]
    check_publishable(_Connection(), "s", b"x" * 900, {"Nats-Msg-Id": "m"})  # type: ignore[arg-type]
