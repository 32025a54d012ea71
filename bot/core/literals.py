"""Which regexes can match a line, from one multi-keyword pass (pure): the literals every match of a regex must
contain, worked out from the regex itself, and an Aho-Corasick index of them (pyahocorasick).

A line is tested against dozens of signature regexes (bot.core.diagnose.signatures) and redaction rules
(bot.core.redact); most match nothing. Searching each on every line cost most of a check's CPU (about 600 us per
log line for the signatures). Here every regex gets its *required literals*, a set of strings one of which is in
every text it matches (`required_literals`), and ONE pass of an Aho-Corasick automaton over the folded line
(`fold`) says which literals it holds, hence which regexes can match at all (`KeywordIndex.candidates`); only those
are searched. A regex whose requirement cannot be worked out is always a candidate, so the answer is never
wrong, only sometimes slower.

The requirement is read from Python's own parse of the regex (`re._parser`, the module behind `re.compile`):
literal runs of a concatenation, the union over the branches of an alternation, a repeat's body when it repeats at
least once. Everything is lower-cased and compared on a folded line: a superset of what case-sensitive and
case-insensitive matching can find. Only ASCII literals are used (folding non-ASCII text can change its length).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["KeywordIndex", "fold", "required_literals"]

# Case folding: what Python's re takes (case-insensitively) for an ASCII letter, lower-cased. `str.lower` does it for
# every character but these three (re also takes dotless i and long s for i and s; the dotted capital I lower-cases
# to two characters). tests/unit/test_redact_speed.py checks every code point.
_FOLD_FIXES = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s"})
#: Literals shorter than this are not worth a keyword (they are in almost every line).
MIN_LITERAL = 3
#: Lines whose candidates a KeywordIndex remembers (then forgotten all at once: bounded memory).
RECENT = 4096


def fold(text: str) -> str:
    """`text` lower-cased for keyword matching (see _FOLD_FIXES)."""
    return text.lower() if text.isascii() else text.translate(_FOLD_FIXES).lower()


def _parse(pattern: str, flags: int) -> Any:
    try:
        from re import _parser  # type: ignore[attr-defined]  # Python 3.11+: the parser behind re.compile

        return _parser.parse(pattern, flags)
    except Exception:  # another Python, or a pattern the parser refuses: no requirement
        return None


def required_literals(regex: re.Pattern[str] | str, flags: int = 0) -> frozenset[str] | None:
    """The lower-cased ASCII literals (at least MIN_LITERAL characters) one of which every match of `regex`
    contains, or None when no such set can be worked out (then any line may match). Never raises."""
    pattern, flags = (regex.pattern, regex.flags) if isinstance(regex, re.Pattern) else (regex, flags)
    tree = _parse(pattern, flags)
    if tree is None:
        return None
    try:
        req = _seq(list(tree))
    except Exception:
        return None
    return frozenset(req) if req else None


def _best(options: list[set[str]]) -> set[str] | None:
    """The most selective requirement: the one whose shortest literal is longest (fewer, then)."""
    usable = [o for o in options if o]
    if not usable:
        return None
    return max(usable, key=lambda o: (min(len(s) for s in o), -len(o)))


def _seq(items: Sequence[Any]) -> set[str] | None:
    """The requirement of a concatenation: its literal runs, or an element's own requirement."""
    from re import _constants as c  # type: ignore[attr-defined]

    options: list[set[str]] = []
    run: list[str] = []

    def close() -> None:
        text = "".join(run)
        if len(text) >= MIN_LITERAL and text.isascii():
            options.append({text.lower()})
        run.clear()

    for op, arg in items:
        if op is c.LITERAL:
            run.append(chr(arg))
            continue
        close()
        if op is c.SUBPATTERN:
            sub = _seq(list(arg[-1]))
        elif op is c.BRANCH:
            subs = [_seq(list(alt)) for alt in arg[1]]
            sub = None if any(s is None for s in subs) else set().union(*subs)  # type: ignore[arg-type]
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            low, _high, body = arg
            sub = _seq(list(body)) if low >= 1 else None
        elif op is c.ATOMIC_GROUP:
            sub = _seq(list(arg))
        else:  # a class, any character, an anchor, a lookaround, a back reference: no literal of its own
            sub = None
        if sub:
            options.append(sub)
    close()
    return _best(options)


class KeywordIndex:
    """The required literals of many regexes in one Aho-Corasick automaton: `candidates(line)` is the set of the
    ids of the regexes that can match `line` (those whose literals it holds, and those without a requirement).
    Remembers the last line asked about (callers ask about one line many times in a row)."""

    def __init__(self, regexes: Iterable[tuple[int, re.Pattern[str]]]):
        import ahocorasick  # pyahocorasick

        self.always: set[int] = set()
        by_literal: dict[str, set[int]] = {}
        for key, rx in regexes:
            req = required_literals(rx)
            if req is None:
                self.always.add(key)
                continue
            for lit in req:
                by_literal.setdefault(lit, set()).add(key)
        self._automaton: Any = None
        if by_literal:
            automaton = ahocorasick.Automaton()
            for lit, keys in by_literal.items():
                automaton.add_word(lit, frozenset(keys))
            automaton.make_automaton()
            self._automaton = automaton
        self._recent: dict[str, frozenset[int]] = {}
        self._always = frozenset(self.always)

    def candidates(self, line: str) -> frozenset[int]:
        """Ids of the regexes that can match `line` (the answers for the last RECENT lines are remembered: a log
        scan asks about each line several times, and a check's log window is mostly the last one's)."""
        done = self._recent.get(line)
        if done is not None:
            return done
        out = self._always
        if self._automaton is not None:
            seen: set[frozenset[int]] = set()
            for _end, keys in self._automaton.iter(fold(line)):
                seen.add(keys)
            if seen:
                out = out.union(*seen)
        if len(self._recent) >= RECENT:
            self._recent.clear()
        self._recent[line] = out
        return out
