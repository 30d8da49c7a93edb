"""A shell tokenizer good enough to find the commands a bash script runs.

Not a shell parser: it splits words and operators, understands quoting,
escapes, `$(...)`, backticks, `${...}`, `$((...))`, process substitution and
here-documents, and hands every substitution's text and every here-document
body back to the caller for separate analysis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_OPERATORS = re.compile(r"\|\||&&|;;&|;;|;&|\|&|[|&;()]")
_REDIRECT = re.compile(r"\d*(?:<<<|<<-|<<|>>|>&|<&|>\||&>>|&>|<>|>|<)")
_PLAIN = re.compile(r"[^\s|&;()<>'\"`$\\]+")
_BLANK = re.compile(r"[ \t\r\f\v]+")

MAX_DEPTH = 32


class ShellSyntaxError(ValueError):
    """Unbalanced quotes or substitutions."""


@dataclass
class Token:
    kind: str  # "word", "op", "redirect", "newline"
    text: str
    quoted: bool = False  # any part of a word was quoted or escaped


@dataclass
class Lexed:
    tokens: list[Token] = field(default_factory=list)
    substitutions: list[str] = field(default_factory=list)  # $(...), `...`, <(...)
    heredocs: list[str] = field(default_factory=list)  # bodies


class _Lexer:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.out = Lexed()
        self.pending_heredocs: list[tuple[str, bool]] = []  # (delimiter, strip tabs)

    def run(self) -> Lexed:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if m := _BLANK.match(s, self.i):
                self.i = m.end()
            elif c == "\n":
                self.i += 1
                self.out.tokens.append(Token("newline", "\n"))
                self._read_heredocs()
            elif c == "#" and self._at_word_start():
                end = s.find("\n", self.i)
                self.i = len(s) if end < 0 else end
            elif c == "\\" and s.startswith("\\\n", self.i):
                self.i += 2  # line continuation
            elif c in "<>" and s.startswith("(", self.i + 1):
                self.out.substitutions.append(self._balanced(self.i + 2, "(", ")"))
            elif m := _REDIRECT.match(s, self.i):
                self.i = m.end()
                self.out.tokens.append(Token("redirect", m.group().lstrip("0123456789")))
                if m.group().endswith(("<<", "<<-")):
                    self._heredoc_delimiter(m.group().endswith("-"))
            elif m := _OPERATORS.match(s, self.i):
                if m.group() == "(" and s.startswith("((", self.i):
                    self._balanced(self.i + 2, "((", "))")  # arithmetic: no commands
                    continue
                self.i = m.end()
                self.out.tokens.append(Token("op", m.group()))
            else:
                self.out.tokens.append(self._word())
        if self.pending_heredocs:
            self._read_heredocs()
        return self.out

    def _at_word_start(self) -> bool:
        return self.i == 0 or self.s[self.i - 1] in " \t\n;&|()"

    def _word(self) -> Token:
        s, parts, quoted = self.s, [], False
        while self.i < len(s):
            c = s[self.i]
            if m := _PLAIN.match(s, self.i):
                parts.append(m.group())
                self.i = m.end()
            elif c == "'":
                end = s.find("'", self.i + 1)
                if end < 0:
                    raise ShellSyntaxError("unterminated single quote")
                parts.append(s[self.i + 1 : end])
                self.i, quoted = end + 1, True
            elif c == '"':
                parts.append(self._double_quoted())
                quoted = True
            elif c == "\\":
                parts.append(s[self.i + 1 : self.i + 2])
                self.i, quoted = self.i + 2, True
            elif c == "`":
                end = self._backtick_end(self.i + 1)
                self.out.substitutions.append(s[self.i + 1 : end])
                parts.append("$(…)")
                self.i = end + 1
            elif c == "$":
                parts.append(self._dollar())
            else:
                break
        return Token("word", "".join(parts), quoted)

    def _double_quoted(self) -> str:
        s, parts = self.s, []
        self.i += 1
        while True:
            if self.i >= len(s):
                raise ShellSyntaxError("unterminated double quote")
            c = s[self.i]
            if c == '"':
                self.i += 1
                return "".join(parts)
            if c == "\\":
                parts.append(s[self.i + 1 : self.i + 2])
                self.i += 2
            elif c == "$":
                parts.append(self._dollar())
            elif c == "`":
                end = self._backtick_end(self.i + 1)
                self.out.substitutions.append(s[self.i + 1 : end])
                parts.append("$(…)")
                self.i = end + 1
            else:
                parts.append(c)
                self.i += 1

    def _dollar(self) -> str:
        s, i = self.s, self.i
        if s.startswith("$((", i):
            self._balanced(i + 3, "((", "))")
            return "$((…))"
        if s.startswith("$(", i):
            self.out.substitutions.append(self._balanced(i + 2, "(", ")"))
            return "$(…)"
        if s.startswith("${", i):
            return "${" + self._balanced(i + 2, "{", "}") + "}"
        if s.startswith("$'", i):
            end = i + 2
            while end < len(s) and s[end] != "'":
                end += 2 if s[end] == "\\" else 1
            if end >= len(s):
                raise ShellSyntaxError("unterminated $'...'")
            self.i = end + 1
            return s[i + 2 : end]
        self.i += 1
        return "$"

    def _balanced(self, start: int, open_: str, close: str) -> str:
        """Text up to the matching `close` (quotes respected); sets self.i past it."""
        s, depth, j = self.s, 1, start
        while j < len(s):
            c = s[j]
            if c == "\\":
                j += 2
            elif c == "'" and close != "}":
                end = s.find("'", j + 1)
                if end < 0:
                    raise ShellSyntaxError("unterminated single quote")
                j = end + 1
            elif c == '"':
                j = self._skip_double(j + 1)
            elif s.startswith(close, j):
                depth -= 1
                if depth == 0:
                    self.i = j + len(close)
                    return s[start:j]
                j += len(close)
            elif s.startswith(open_, j) or (open_ == "(" and s.startswith("$(", j)):
                depth += 1
                j += len(open_) + (1 if s.startswith("$(", j) else 0)
            else:
                j += 1
        raise ShellSyntaxError(f"unterminated {open_}")

    def _skip_double(self, j: int) -> int:
        s = self.s
        while j < len(s):
            if s[j] == "\\":
                j += 2
            elif s[j] == '"':
                return j + 1
            else:
                j += 1
        raise ShellSyntaxError("unterminated double quote")

    def _backtick_end(self, j: int) -> int:
        s = self.s
        while j < len(s):
            if s[j] == "\\":
                j += 2
            elif s[j] == "`":
                return j
            else:
                j += 1
        raise ShellSyntaxError("unterminated backtick")

    def _heredoc_delimiter(self, strip_tabs: bool) -> None:
        if m := _BLANK.match(self.s, self.i):
            self.i = m.end()
        token = self._word()
        self.pending_heredocs.append((token.text, strip_tabs))

    def _read_heredocs(self) -> None:
        s = self.s
        for delimiter, strip_tabs in self.pending_heredocs:
            body_start = self.i
            while self.i < len(s):
                end = s.find("\n", self.i)
                end = len(s) if end < 0 else end
                line = s[self.i : end]
                self.i = min(end + 1, len(s))
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    self.out.heredocs.append(s[body_start : self.i - len(line) - 1])
                    break
            else:
                self.out.heredocs.append(s[body_start:])  # bash runs it anyway
        self.pending_heredocs = []


def lex(text: str) -> Lexed:
    return _Lexer(text).run()
