"""The pure-Python WordPiece steps (what aotx_trio/native/_wordpiece.py ran before the C
tokenizer, csrc/tokenizer/tokenizer_wordpiece.c): the oracle the C one is tested against,
next to the `tokenizers` library.  It reuses the package class for reading
tokenizer.json and replaces only the tokenization."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from aotx_trio.native.embed import WordPiece

# Unicode White_Space (what the Rust tokenizers' char::is_whitespace tests).
_WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
                        "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_ASCII_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK)


def _is_control(ch: str) -> bool:
    # Cc, Cf, Co, Cs; unassigned code points (Cn) are kept, as the reference does
    cat = unicodedata.category(ch)
    return cat[0] == "C" and cat != "Cn"


def _is_punct(ch: str) -> bool:
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


class OracleWordPiece(WordPiece):
    def __init__(self, path: Path, max_len: int) -> None:
        super().__init__(path, max_len)
        words = sorted(self.added, key=len, reverse=True)
        self._added_re = re.compile("|".join(map(re.escape, words))) if words else None
        self._cache: dict[str, list[int]] = {}

    def normalize(self, text: str) -> str:
        if self.clean_text:
            text = "".join(" " if c in _WHITESPACE else c for c in text
                           if c in "\t\n\r" or not (c == "\ufffd" or _is_control(c)))
        if self.chinese:
            text = "".join(f" {c} " if _is_cjk(ord(c)) else c for c in text)
        if self.strip_accents:
            text = "".join(c for c in unicodedata.normalize("NFD", text)
                           if unicodedata.category(c) != "Mn")
        if self.lowercase:
            # per character, like the reference (str.lower() would apply final-sigma rules)
            text = "".join(c.lower() for c in text) if "\u03a3" in text else text.lower()
        return text

    @staticmethod
    def pre_tokenize(text: str) -> list[str]:
        words: list[str] = []
        for chunk in "".join(" " if c in _WHITESPACE else c for c in text).split(" "):
            start = 0
            for i, c in enumerate(chunk):
                if _is_punct(c):
                    if i > start:
                        words.append(chunk[start:i])
                    words.append(c)
                    start = i + 1
            if start < len(chunk):
                words.append(chunk[start:])
        return words

    def word_ids(self, word: str) -> list[int]:
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        ids = self._greedy(word)
        if len(self._cache) < 200_000:
            self._cache[word] = ids
        return ids

    def _greedy(self, word: str) -> list[int]:
        if len(word) > self.max_chars:
            return [self.unk]
        ids: list[int] = []
        start, n = 0, len(word)
        while start < n:
            end = n
            found = -1
            while end > start:
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                found = self.vocab.get(piece, -1)
                if found >= 0:
                    break
                end -= 1
            if found < 0:
                return [self.unk]
            ids.append(found)
            start = end
        return ids

    def pieces(self, text: str, limit: int | None = None) -> list[int]:
        """Word-piece ids of ``text`` without [CLS]/[SEP]; the first ``limit`` (all if None)."""
        ids: list[int] = []
        parts = [text] if self._added_re is None else self._split_added(text)
        for part in parts:
            if limit is not None and len(ids) >= limit:
                break
            if part in self.added:
                ids.append(self.added[part])
                continue
            for word in self.pre_tokenize(self.normalize(part)):
                ids.extend(self.word_ids(word))
                if limit is not None and len(ids) >= limit:
                    break
        return ids if limit is None else ids[:limit]

    def _split_added(self, text: str) -> list[str]:
        assert self._added_re is not None
        out: list[str] = []
        pos = 0
        for m in self._added_re.finditer(text):
            if m.start() > pos:
                out.append(text[pos:m.start()])
            out.append(m.group())
            pos = m.end()
        if pos < len(text):
            out.append(text[pos:])
        return out
