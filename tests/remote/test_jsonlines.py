"""A supervisor's stream arrives in pieces that split lines anywhere; every complete line counts once."""

from __future__ import annotations

import threading

from gpudeploy.remote.jsonlines import json_lines


class Chunks:
    def __init__(self, *pieces: bytes) -> None:
        self.pieces = list(pieces)

    def settimeout(self, timeout: float | None) -> None:
        pass

    def recv(self, nbytes: int) -> bytes:
        if not self.pieces:
            return b""  # EOF
        piece = self.pieces.pop(0)
        if piece == b"TIMEOUT":
            raise TimeoutError
        return piece


def test_lines_split_across_pieces_bad_lines_skipped_eof_ends() -> None:
    chan = Chunks(b'{"unit": "a", "li', b'ne": "x"}\n{"unit"', b"TIMEOUT", b': "b"}\nnot json\n[1]\n{"tail": 1}')
    assert list(json_lines(chan, threading.Event())) == [{"unit": "a", "line": "x"}, {"unit": "b"}, [1]]


def test_done_ends_the_stream_and_a_broken_channel_too() -> None:
    done = threading.Event()
    done.set()
    assert list(json_lines(Chunks(b'{"a": 1}\n'), done)) == []

    class Broken(Chunks):
        def recv(self, nbytes: int) -> bytes:
            raise ConnectionResetError("reset")

    assert list(json_lines(Broken(), threading.Event())) == []
