"""How the reply's text and its logprobs are cut as Ollama's runner cuts them (no server needed)."""

from __future__ import annotations

from llmp_frontend_ollama.generation import LogprobsByText


def entries(*tokens: str) -> list[dict]:
    return [{"token": token, "logprob": -1.0, "bytes": list(token.encode())} for token in tokens]


def test_logprobs_wait_for_their_text_and_a_stop_strings_go_with_it():
    by_text = LogprobsByText()
    # "1, 2" sent, then ", " held back by the engine (it may start the stop string ", 3")
    by_text.add(entries("1", ",", " ", "2"), 4, cut=False, final=False)
    assert [e["token"] for e in by_text.release()] == ["1", ",", " ", "2"]
    by_text.add(entries(",", " "), 4, cut=False, final=False)
    assert by_text.release() is None  # their text is not out yet
    by_text.add(entries("3"), 4, cut=True, final=True)  # ", 3" was the stop string: cut from the text
    assert by_text.release() is None
    # a sequence that ends otherwise releases what it held
    other = LogprobsByText()
    other.add(entries("a", "b"), 1, cut=False, final=False)
    assert [e["token"] for e in other.release()] == ["a"]
    other.add([], 1, cut=False, final=True)
    assert [e["token"] for e in other.release()] == ["b"]


def test_tokens_inside_a_character_count_by_their_bytes():
    # "你好" is 6 bytes in 4 byte-level tokens, each decoded alone as U+FFFD: counted by bytes, not by "�"
    parts = [b"\xe4\xbd", b"\xa0", b"\xe5\xa5", b"\xbd"]
    pieces = [{"token": "\ufffd", "logprob": -1.0, "bytes": list(part)} for part in parts]
    stop = [{"token": " STOP", "logprob": -1.0, "bytes": list(b" STOP")}]
    by_text = LogprobsByText()
    by_text.add(pieces[:2], 3, cut=False, final=False)  # the first character is out
    assert len(by_text.release()) == 2
    by_text.add(pieces[2:] + stop, 6, cut=True, final=True)  # the second, then the stop string cut
    assert len(by_text.release()) == 2
