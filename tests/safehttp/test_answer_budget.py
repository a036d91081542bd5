"""Every byte received for a call counts against its budget and its deadline: the body against
the response cap, and the status line, headers, 1xx answers, chunk-size lines, chunk extensions
and trailers against the 64 KiB head allowance. An answer that passes either is cut off there,
whatever part of it never ends."""

import asyncio
import gzip
import time

import pytest

from dispatch import http1

from .support import answering_forever, answering_once, post, read_request, serving

CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
BUDGET = 65536 + http1.MAX_HEAD_BYTES  # the default cap plus the head allowance


@pytest.fixture
def received(monkeypatch):
    """Bytes handed to the transport per connection, as received from the socket."""
    got: list[int] = []
    real = http1._Connection.data_received

    def counting(self, data):
        got.append(len(data))
        return real(self, data)

    monkeypatch.setattr(http1._Connection, "data_received", counting)
    return got


def assert_cut_off(result, received, fragment):
    assert (result.status, result.outcome, result.error_class) == (None, "failed", "ResponseTooLarge")
    assert (result.retryable, result.sent) == (True, True)  # outcome unknown: the target may have acted
    assert fragment in result.error, result.error
    # Reading stopped at the budget: what was read past it is at most one socket read.
    assert sum(received) < BUDGET + 512 * 1024, sum(received)


def test_an_endless_trailer_value_is_cut_off_at_the_budget(received):
    # The hostile target: a whole body, then a trailer that never ends.
    handler = answering_forever(CHUNKED + b"5\r\nhello\r\n0\r\nX-T: ", b"a" * 65536)
    (result,), _ = serving(handler, lambda c, b: post(c, b, timeout=10))
    assert_cut_off(result, received, "HTTP 200 answer over its byte budget")
    assert result.latency_ms < 2000


def test_endless_trailer_lines_are_cut_off_at_the_budget(received):
    handler = answering_forever(CHUNKED + b"5\r\nhello\r\n0\r\n", b"X-T: a\r\n" * 4096)
    (result,), _ = serving(handler, lambda c, b: post(c, b, timeout=10))
    assert_cut_off(result, received, "trailers")


def test_an_endless_chunk_extension_is_cut_off_at_the_budget(received):
    handler = answering_forever(CHUNKED + b"5;name=", b"a" * 65536)
    (result,), _ = serving(handler, lambda c, b: post(c, b, timeout=10))
    assert_cut_off(result, received, "chunk framing")


def test_chunk_framing_counts_even_when_the_chunks_are_tiny(received):
    # One body byte per six bytes on the wire: the body cap alone would let 390 KB in.
    handler = answering_forever(CHUNKED, b"1\r\na\r\n" * 10000)
    (result,), _ = serving(handler, lambda c, b: post(c, b, timeout=10))
    assert_cut_off(result, received, "chunk framing")


def test_an_endless_header_line_is_cut_off_at_the_head_allowance(received):
    handler = answering_forever(b"HTTP/1.1 200 OK\r\nX-Long: ", b"a" * 65536)
    (result,), _ = serving(handler, lambda c, b: post(c, b, timeout=10))
    assert_cut_off(result, received, "headers over 65536 bytes")


def test_a_flood_of_informational_answers_is_cut_off_at_the_head_allowance(received):
    handler = answering_forever(b"", b"HTTP/1.1 100 Continue\r\n\r\n" * 1000)
    (result,), _ = serving(handler, lambda c, b: post(c, b, timeout=10))
    assert_cut_off(result, received, "1xx answers")


def test_a_content_length_past_any_integer_is_a_malformed_answer():
    handler = answering_forever(b"HTTP/1.1 200 OK\r\nContent-Length: 1" + b"0" * 30 + b"\r\n\r\n", b"a" * 65536)
    (result,), _ = serving(handler, post)
    assert (result.status, result.error_class, result.sent) == (None, "ClientResponseError", True)
    assert "Content-Length" in result.error


def test_an_endless_body_still_ends_at_the_cap_with_its_status(received):
    # The body cap keeps its meaning: the target answered, the rest of its body is not read.
    handler = answering_forever(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n", b"a" * 65536)
    (result,), _ = serving(handler, post, client_kwargs={"max_response_bytes": 4096, "excerpt_bytes": 10})
    assert (result.status, result.outcome, result.body_excerpt) == (200, "succeeded", b"a" * 10)
    assert sum(received) < 4096 + http1.MAX_HEAD_BYTES + 512 * 1024


@pytest.mark.parametrize("first", [
    pytest.param(b"HTTP/1.1 200 OK\r\nX-Slow: ", id="in-the-headers"),
    pytest.param(CHUNKED + b"5\r\nhello\r\n0\r\nX-T: ", id="in-the-trailers"),
    pytest.param(CHUNKED + b"5;x=", id="in-a-chunk-extension"),
])
def test_an_answer_trickled_a_byte_at_a_time_ends_at_the_deadline(first):
    handler = answering_forever(first, b"a", pause=0.05)
    started = time.monotonic()
    (result,), _ = serving(handler, lambda c, b: post(c, b, timeout=0.6))
    elapsed = time.monotonic() - started
    assert (result.error_class, result.retryable, result.sent) == ("TimeoutError", True, True)
    assert 0.55 <= elapsed < 2.0


def test_one_byte_segments_as_fast_as_they_come_are_read_in_fewer_reads(received):
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(CHUNKED + b"5\r\nhello\r\n0\r\nX-T: ")
        try:
            while True:
                writer.write(b"a")
                await writer.drain()
                await asyncio.sleep(0)
        except ConnectionError:
            pass

    (result,), _ = serving(handler, lambda c, b: post(c, b, timeout=3))
    assert result.error_class in ("ResponseTooLarge", "TimeoutError")
    # Without pacing nearly every byte is a read of its own: tens of thousands of reads, each
    # costing what a 64 KiB read costs.
    assert len(received) < 2000, len(received)


def test_a_normal_answer_in_many_small_segments_is_still_read_whole():
    body = b"".join(b"%d," % i for i in range(400))

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), 20):
            writer.write(body[i:i + 20])
            await writer.drain()
            await asyncio.sleep(0.001)
        await asyncio.sleep(1)

    (result,), _ = serving(handler, post, client_kwargs={"excerpt_bytes": 4096})
    assert (result.status, result.body_excerpt) == (200, body)


def test_a_trailer_within_the_budget_is_fine_and_the_connection_is_reused():
    async def handler(reader, writer):
        while True:
            await read_request(reader)
            writer.write(CHUNKED + b"5\r\nhello\r\n0\r\nX-Checksum: abc\r\n\r\n")
            await writer.drain()

    results, server = serving(handler, post, post, post)
    assert [(r.status, r.body_excerpt) for r in results] == [(200, b"hello")] * 3
    assert server.connections == 1


def test_the_budget_is_per_call_not_per_connection():
    # Each answer's head takes most of the allowance; on one kept-alive connection they must not add up.
    filler = b"X-Filler: " + b"f" * 50_000 + b"\r\n"

    async def handler(reader, writer):
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\n" + filler + b"Content-Length: 2\r\n\r\nok")
            await writer.drain()

    results, server = serving(handler, post, post, post, post)
    assert [(r.status, r.body_excerpt) for r in results] == [(200, b"ok")] * 4
    assert server.connections == 1


def test_a_compressed_answer_is_kept_as_sent_and_capped_on_its_wire_bytes():
    # Even when a schedule asks for gzip, nothing is decompressed: a small bomb stays small.
    bomb = gzip.compress(b"\0" * 10_000_000)
    handler = answering_once(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb)
                             + bomb, hold=1)
    (result,), _ = serving(handler, lambda c, b: post(c, b, headers={"Accept-Encoding": "gzip"}),
                           client_kwargs={"max_response_bytes": 4096, "excerpt_bytes": 64})
    assert result.status == 200 and result.body_excerpt == bomb[:64]
    assert result.body_excerpt.startswith(b"\x1f\x8b")
