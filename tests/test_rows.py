"""mars.decoding.rows: how a pass's accepted run is taken into a row, the rule the host loop and the device
step's host side share (their records are compared token for token in test_decoding and test_device_step)."""

from __future__ import annotations

from mars.decoding.rows import RowText, cut_at_stop, take


class _Chars:
    """A tokenizer whose id i is the character chr(i); id 0 is special (dropped when decoding)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == 0))


class _Merging(_Chars):
    """Ids 1 and 2 together read as one character, each alone as '?': a character split across passes."""

    def decode(self, ids, skip_special_tokens=False):
        return super().decode(ids, skip_special_tokens).replace("\x01\x02", "é").replace("\x01", "?")


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_take_appends_the_run_and_returns_its_text():
    row = RowText(3, [0, 7])  # a prompt of two ids: never part of the text
    assert take(_Chars(), row, ids("abc"), 2, (), None) == (2, None, "ab")
    assert (row.index, row.generated, row.text, row.finish_reason) == (3, ids("ab"), "ab", None)
    assert take(_Chars(), row, ids("cd"), 2, (), "length") == (2, "length", "cd")
    assert row.tokens == [0, 7] + ids("abcd") and row.text == "abcd" and row.finish_reason == "length"


def test_a_stop_string_cuts_right_after_the_token_that_completes_it():
    row = RowText(0, [])
    take(_Chars(), row, ids("xy#"), 3, ("##",), None)  # half a stop string: no cut
    assert row.finish_reason is None
    # the stop string spans the two passes; it ends at the run's first token, whatever EOS said after it
    assert take(_Chars(), row, ids("#zz"), 3, ("##",), "eos") == (1, "stop", "#")
    assert row.text == "xy##" and row.finish_reason == "stop"
    assert cut_at_stop(_Chars(), RowText(0, []), ids("abc"), 0, ("a",), None) == (0, None)  # nothing to cut
    assert cut_at_stop(_Chars(), RowText(0, []), ids("abc"), 3, (), "eos") == (3, "eos")


def test_a_character_split_across_passes_reads_right():
    row = RowText(0, [])
    assert take(_Merging(), row, [ord("a"), 1], 2, (), None) == (2, None, "a?")
    # decoding again changed the text already shown: the piece is the whole text
    assert take(_Merging(), row, [2], 1, (), None) == (1, None, "aé")
    assert row.text == "aé"
