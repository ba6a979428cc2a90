"""aotx_trio.runtime.unsaved: the index of admissions not saved yet, by what they change."""

from __future__ import annotations

from aotx_trio.runtime.unsaved import Unsaved


def test_blocks_only_other_readers_of_the_changed_keys_until_saved() -> None:
    u = Unsaved()
    u.add(5, "eve", [("space", "s1"), ("spaces", "*")])
    u.add(9, "eve", [("conversation", "c1")])
    u.add(7, "bob", [("space", "s2")])
    assert len(u) == 3
    assert u.blocking(0, "eve", [("space", "s1")]) is None          # the actor sees it
    assert u.blocking(0, "bob", [("space", "s1")]) == 5
    assert u.blocking(0, "bob", [("space", "s1"), ("conversation", "c1")]) == 9
    assert u.blocking(0, "bob", [("space", "s9")]) is None          # unrelated: no wait
    assert u.blocking(6, "bob", [("space", "s1")]) is None          # record 5 saved
    assert len(u) == 2
    assert u.blocking(6, "eve", [("space", "s2")]) == 7
    assert u.blocking(10, "eve", [("space", "s2"), ("conversation", "c1")]) is None
    assert len(u) == 0


def test_an_admission_that_changes_nothing_visible_is_not_kept() -> None:
    u = Unsaved()
    u.add(3, "eve", [])
    assert len(u) == 0
    assert u.blocking(0, "bob", [("space", "x")]) is None


def test_adding_drops_what_is_saved_even_when_nothing_reads() -> None:
    u = Unsaved()
    for record in range(1000):
        u.add(record, "eve", [("space", f"s{record}")], saved_records=record)
    assert len(u) == 1                        # only the newest is not saved yet
