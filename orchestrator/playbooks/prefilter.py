"""The matcher's prefilter: which lines hold a needle, and which needles, in C-level scans.

Every regex of a playbook needs some literal text (its needles); a line that holds none is
rejected by one search of a regex over all of them, factored as a trie
(:func:`trie_regex`). Python's ``re`` skips, without running
the trie, every position whose character starts no needle; so each needle is indexed by its
part that starts at its rarest character (:func:`anchor`), and a healthy line's common
characters (``step=``, ``loss=``, ``[INFO]``) are mostly skipped.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any


def trie_regex(words: Iterable[str], bounded: frozenset[str] = frozenset()) -> str:
    """One regex matching any of ``words``, factored as a trie (shared prefixes once).

    Python's ``re`` tries an alternation's branches one after another; a trie branches on
    one character at each level, so the cost of a search barely grows with the word count.
    A word in ``bounded`` matches only where a word boundary follows it.

    >>> trie_regex(["kill", "killed", "nan"])
    '(?:kill(?:ed)?|nan)'
    >>> re.search(trie_regex(["a.b"]), "axb") is None
    True
    >>> rx = re.compile(trie_regex(["inf", "nan"], bounded=frozenset({"inf"})))
    >>> [bool(rx.search(s)) for s in ("[info]", "loss: inf", "nano")]
    [False, True, True]
    """
    root: dict[str, Any] = {}
    for w in sorted(set(words)):
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node["" if w not in bounded else "\\b"] = {}

    def build(node: dict[str, Any]) -> str:
        ends = "" in node
        alts = [
            ("\\b" if ch == "\\b" else re.escape(ch)) + build(node[ch])
            for ch in sorted(k for k in node if k)
        ]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        if ends:
            return f"(?:{body})?"
        return body

    body = build(root)
    return body if body.startswith("(?:") else f"(?:{body})"


COMMON_CHARS = " etaosinrlp=.:_0123456789-cmdu/,[]()kgfh'"
"""Characters of healthy training-log lines, most frequent first (step=, loss=, lr=, [INFO],
[Rank 0], tok/s): the prefilter's regex skips, in C, every position whose character starts
no needle, so needles are indexed from a rarer character where they hold one."""
_COMMONNESS = {ch: len(COMMON_CHARS) - i for i, ch in enumerate(COMMON_CHARS)}
ANCHOR_MIN = 4
"""An index key is at least this long (or the whole literal, when shorter)."""


def anchor(word: str) -> str:
    """The part of ``word`` the prefilter looks for: its suffix of at least
    :data:`ANCHOR_MIN` characters that starts at its least common character (the longest such).
    Any part of a required literal is required, so the prefilter stays exact.

    >>> anchor("no space left on device"), anchor("nan"), anchor("[errno 28] no space")
    ('vice', 'nan', '] no space')
    """
    if len(word) <= ANCHOR_MIN:
        return word
    start = min(range(len(word) - ANCHOR_MIN + 1), key=lambda i: (_COMMONNESS.get(word[i], 0), i))
    return word[start:]


def index_cost(alts: frozenset[str]) -> tuple[int, int]:
    """Which requirement of a check to index it by: an alternation (nan|inf: usually the
    telling part, where a lone literal may be a word of every line, "loss"), else the longest."""
    return (-(len(alts) > 1), -min(map(len, alts)))


class Prefilter:
    """The compiled trie of the needles: ``quick`` finds whether a line holds one; ``every``
    (the trie in a lookahead) finds, at each position, the longest needle starting there,
    and :meth:`prefixes` maps it to the needles it begins with, so a hit line learns all its
    needles in one C-level scan instead of one ``in`` test per needle.

    Only ``quick`` is built up front (~10 ms for the bundled set's ~570 keys): ``every`` is
    compiled on the first line that ``quick`` lets in (another ~20 ms), and each key's
    prefixes are worked out the first time a line holds it (all of them at once was ~20 ms,
    quadratic in the keys). A check of a healthy fleet needs neither.
    """

    __slots__ = ("_every", "_prefixes", "keys", "quick", "trie")

    def __init__(self, trie: str, keys: tuple[str, ...]) -> None:
        self.trie = trie
        self.keys = keys
        self.quick: re.Pattern[str] = re.compile(trie)
        self._every: re.Pattern[str] | None = None
        self._prefixes: dict[str, tuple[str, ...]] = {}

    @property
    def every(self) -> re.Pattern[str]:
        if self._every is None:
            self._every = re.compile(f"(?=({self.trie}))")
        return self._every

    def prefixes(self, word: str) -> tuple[str, ...]:
        """The keys ``word`` (a key) begins with, itself included.

        >>> prefilter(("kill", "killed", "led"), frozenset()).prefixes("killed")
        ('kill', 'killed')
        """
        got = self._prefixes.get(word)
        if got is None:
            got = self._prefixes[word] = tuple(k for k in self.keys if word.startswith(k))
        return got

    def present(self, low: str) -> set[str]:
        """The needles in lower-cased ``low`` (bounded ones only where a boundary follows).

        >>> p = prefilter(("kill", "killed", "led"), frozenset())
        >>> sorted(p.present("he was killed"))
        ['kill', 'killed', 'led']
        """
        out: set[str] = set()
        for word in set(self.every.findall(low)):
            out.update(self.prefixes(word))
        return out


TrieKey = tuple[tuple[str, ...], frozenset[str]]
_TRIES: dict[TrieKey, str] = {}
"""Tries built (or read back from the playbook cache) in this process, by their keys."""


def tries() -> dict[TrieKey, str]:
    """The tries built so far (the playbook cache keeps them: building the bundled set's
    took ~12 ms a process, reading it back nothing)."""
    return dict(_TRIES)


def remember(known: dict[TrieKey, str]) -> None:
    """Tries built by an earlier process (:func:`tries`), for :func:`prefilter` to use."""
    _TRIES.update(known)


@functools.lru_cache(maxsize=8)
def prefilter(keys: tuple[str, ...], bounded: frozenset[str]) -> Prefilter:
    """The prefilter of ``keys`` (cached: one playbook set builds it once per process)."""
    trie = _TRIES.get((keys, bounded))
    if trie is None:
        trie = _TRIES[(keys, bounded)] = trie_regex(keys, bounded=bounded)
    return Prefilter(trie, keys)
