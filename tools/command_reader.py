"""Reads the words of a parsed command the way bash will: quotes, escapes, expansions, splitting.

Static parts are resolved exactly (`r''m`, `\\rm`, `$'\\x72m'`, `{rm,-rf,/}`, `rm${IFS}-rf`); `~` and
`$HOME` become the user's home. What only the running shell knows (`$a`, `$(cmd)`, `$((...))`) makes the
word dynamic, with the values the script itself offers for it as guesses.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mibyan.tools.command_words import Feed, Stream, Word, command_name

if TYPE_CHECKING:
    from tree_sitter import Node

_MAX_GUESSES = 16
_MAX_BRACE_WORDS = 64
_NOT_WORDS = {"variable_assignment", "file_redirect", "herestring_redirect", "heredoc_redirect", "comment"}
_GLOB = re.compile(r"[*?\[]")
_NOT_PLAIN = re.compile(r"[\\~{]")
_ASSIGNED_TILDE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*=)~")
_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}
_UNQUOTED_ESCAPE = re.compile(r"\\(.)", re.S)
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}|[0-7]{1,3}|c.|.)", re.S)


def decode_escapes(text: str) -> str:
    """Resolve backslash escapes as `$'...'` and `echo -e` do."""

    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        head = code[0]
        if head in "xuU" and len(code) > 1:
            return chr(min(int(code[1:], 16), 0x10FFFF))
        if head in "01234567":
            return chr(int(code, 8))
        if head == "c" and len(code) == 2:
            return chr(ord(code[1].upper()) ^ 0x40)
        return _SIMPLE_ESCAPES.get(code, "\\" + code)

    return _ESCAPE.sub(one, text)


@dataclass(frozen=True)
class _Piece:
    text: str
    quoted: bool = False
    dynamic: bool = False
    guesses: tuple[str, ...] = ()
    split: bool = False  # an unquoted $IFS: the word ends here


def _unescape_unquoted(text: str) -> list[_Piece]:
    """An unquoted word's pieces: each escaped character quoted, a line continuation dropped. One pass
    of a regular expression: a character at a time in Python made a word of 100 KB cost a second."""
    if "\\" not in text:
        return [_Piece(text)] if text else []
    pieces: list[_Piece] = []
    start = 0
    for escape in _UNQUOTED_ESCAPE.finditer(text):
        if escape.start() > start:
            pieces.append(_Piece(text[start : escape.start()]))
        if escape.group(1) != "\n":
            pieces.append(_Piece(escape.group(1), quoted=True))
        start = escape.end()
    if start < len(text):
        pieces.append(_Piece(text[start:]))
    return pieces


def _unescape_double(text: str) -> str:
    return re.sub(r"\\([$`\"\\\n])", lambda m: "" if m.group(1) == "\n" else m.group(1), text)


def brace_expand(chars: list[tuple[str, bool]]) -> list[list[tuple[str, bool]]]:
    """Bash brace expansion over (character, quoted) pairs: `{a,b}c` is `ac bc`."""
    for start, (char, quoted) in enumerate(chars):
        if char != "{" or quoted:
            continue
        depth = 0
        commas: list[int] = []
        for end in range(start, len(chars)):
            c, q = chars[end]
            if q:
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    break
            elif c == "," and depth == 1:
                commas.append(end)
        else:
            return [chars]
        if not commas:
            continue
        bounds = [start, *commas, end]
        prefix, suffix = chars[:start], chars[end + 1 :]
        results: list[list[tuple[str, bool]]] = []
        for left, right in itertools.pairwise(bounds):
            for expanded in brace_expand(prefix + chars[left + 1 : right] + suffix):
                results.append(expanded)
                if len(results) >= _MAX_BRACE_WORDS:
                    return results
        return results
    return [chars]


class WordReader:
    """Turns word nodes into `Word`s, remembering what the script assigns to its variables."""

    def __init__(self, *, user_home: Path, cwd: Path) -> None:
        self.user_home = user_home
        self.cwd = cwd
        self.values: dict[str, list[str]] = {}
        self.misread = False
        self.source = b""  # the reading being judged, for what the grammar drops
        self.cache: dict[int, list[Word]] = {}  # command words by node, for the reading being judged

    # -- what the script tells about its variables -----------------------------------------------------

    def learn_assignment(self, node: Node) -> None:
        name = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        if name is None:
            return
        texts: list[str] = []
        if value is not None:
            for word in self.words(value):
                texts.extend(word.guesses if word.dynamic else [word.text])
        else:
            texts.append("")
        self._remember((name.text or b"").decode(errors="replace").split("[")[0], texts)

    def learn_loop(self, node: Node) -> None:
        variable = node.child_by_field_name("variable")
        if variable is None:
            return
        texts: list[str] = []
        for value in node.children_by_field_name("value"):
            for word in self.words(value):
                texts.extend(word.guesses if word.dynamic else [word.text])
        self._remember((variable.text or b"").decode(errors="replace"), texts)

    def _remember(self, name: str, texts: list[str]) -> None:
        known = self.values.setdefault(name, [])
        known.extend(t for t in texts if t not in known)
        del known[_MAX_GUESSES:]

    # -- commands ---------------------------------------------------------------------------------------

    def command_words(self, node: Node) -> list[Word]:
        known = self.cache.get(node.id)
        if known is not None:
            return known
        words: list[Word] = []
        for child in node.children:
            if child.is_named and child.type not in _NOT_WORDS:
                target = child.named_children[0] if child.type == "command_name" else child
                words.extend(self.words(target))
        self.cache[node.id] = words
        return words

    def statement_words(self, node: Node) -> list[Word]:
        """The words of a statement that is one simple command (possibly redirected), else none."""
        if node.type == "redirected_statement":
            body = node.child_by_field_name("body")
            return self.statement_words(body) if body is not None else []
        return self.command_words(node) if node.type == "command" else []

    def statement_feed(self, node: Node) -> Feed:
        for child in node.children:
            if child.type == "herestring_redirect":
                return self.herestring(child)
            if child.type == "heredoc_redirect":
                return self.heredoc_text(child)
        return None

    def herestring(self, node: Node) -> Feed:
        texts = [w for c in node.named_children for w in self.words(c)]
        if any(w.dynamic for w in texts):
            lines = itertools.product(*(w.guesses if w.dynamic else (w.text,) for w in texts))
            return Stream("", tuple(" ".join(line) + "\n" for line in itertools.islice(lines, _MAX_GUESSES)))
        return " ".join(w.text for w in texts) + "\n"

    def heredoc_text(self, node: Node) -> Feed:
        """The heredoc's lines, cut from the source: the grammar loses some (a body starting with `\\`)."""
        start = next((c for c in node.children if c.type == "heredoc_start"), None)
        end = next((c for c in node.children if c.type == "heredoc_end"), None)
        if start is None:
            return ""
        line_end = self.source.find(b"\n", start.end_byte)
        stop = end.start_byte if end is not None else len(self.source)
        return self.source[line_end + 1 : stop].decode(errors="replace") if 0 <= line_end < stop else ""

    # -- words ------------------------------------------------------------------------------------------

    def words(self, node: Node) -> list[Word]:
        """The fields one word node becomes: one, or several after `$IFS` splitting or brace expansion."""
        if node.type == "word":
            raw = (node.text or b"").decode(errors="replace")
            if raw and not _NOT_PLAIN.search(raw):  # most words: no escape, `~` or braces to resolve
                return [Word(raw, pattern=_GLOB.search(raw) is not None)]
        pieces = self._pieces(node, quoted=False)
        groups: list[list[_Piece]] = [[]]
        for piece in pieces:
            if piece.split:
                groups.append([])
            else:
                groups[-1].append(piece)
        words: list[Word] = []
        for group in groups:
            if group:
                words.extend(self._word(self._tilde(group)))
        return words

    def _tilde(self, pieces: list[_Piece]) -> list[_Piece]:
        first = pieces[0]
        if first.quoted or first.dynamic:
            return pieces
        # bash also expands a `~` after the `=` of an argument shaped as an assignment (`dd of=~/x`)
        assigned = _ASSIGNED_TILDE.match(first.text)
        before = assigned.group(1) if assigned else ""
        text = first.text[len(before) :]
        if not text.startswith("~"):
            return pieces
        head, slash, rest = text.partition("/")
        home = str(self.user_home) if head == "~" else os.path.expanduser(head)
        return [_Piece(before + home + slash + rest), *pieces[1:]]

    def _word(self, pieces: list[_Piece]) -> list[Word]:
        pattern = any(not p.quoted and not p.dynamic and _GLOB.search(p.text) for p in pieces)
        text = "".join(p.text for p in pieces)
        if any(p.dynamic for p in pieces):
            options = [p.guesses if p.dynamic else (p.text,) for p in pieces]
            guesses: tuple[str, ...] = ()
            if all(options):
                combos = itertools.islice(itertools.product(*options), _MAX_GUESSES)
                guesses = tuple("".join(combo) for combo in combos)
            return [Word(text, dynamic=True, pattern=pattern, guesses=guesses)]
        if "{" not in text:
            return [Word(text, pattern=pattern)]
        chars = [(c, p.quoted) for p in pieces for c in p.text]
        expanded = brace_expand(chars)
        if len(expanded) == 1:
            return [Word(text, pattern=pattern)]
        return [Word("".join(c for c, _ in group), pattern=pattern) for group in expanded]

    def _pieces(self, node: Node, *, quoted: bool) -> list[_Piece]:
        kind = node.type
        raw = (node.text or b"").decode(errors="replace")
        if kind in ("word", "number", "brace_expression", "extglob_pattern", "regex"):
            return [_Piece(raw, quoted=True)] if quoted else _unescape_unquoted(raw)
        if kind == "raw_string":
            return [_Piece(raw[1:-1], quoted=True)]
        if kind == "ansi_c_string":
            return [_Piece(decode_escapes(raw[2:-1]), quoted=True)]
        if kind == "string_content" or kind == "heredoc_content":
            return [_Piece(_unescape_double(raw), quoted=True)]
        if kind in ("string", "translated_string"):
            return [p for c in node.named_children for p in self._pieces(c, quoted=True)] or [
                _Piece("", quoted=True)
            ]
        if kind == "concatenation":
            return [p for c in node.children for p in self._pieces(c, quoted=quoted)]
        if kind in ("simple_expansion", "expansion"):
            return [self._expansion(node, raw, quoted=quoted)]
        if kind == "command_substitution":
            return [_Piece(raw, quoted=quoted, dynamic=True, guesses=self._substitution_guesses(node))]
        if kind == "process_substitution":
            return [_Piece("/dev/fd/63", quoted=True, dynamic=True)]
        if not node.is_named:
            # a lone `$` inside a word is where the grammar lost track (`rm$IFS-rf$IFS/`)
            self.misread |= raw == "$"
            return [_Piece(raw, quoted=True)]
        return [_Piece(raw, quoted=quoted, dynamic=True)]

    def _expansion(self, node: Node, raw: str, *, quoted: bool) -> _Piece:
        names = [c for c in node.named_children if c.type in ("variable_name", "special_variable_name")]
        operators = [c.type for c in node.children if not c.is_named and c.type not in ("$", "${", "}")]
        if len(names) != 1 or any(op not in (":-", "-", ":=", "=") for op in operators):
            return _Piece(raw, quoted=quoted, dynamic=True)
        name = (names[0].text or b"").decode(errors="replace")
        if name == "HOME" and not operators:
            return _Piece(str(self.user_home), quoted=True)
        if name == "IFS" and not operators:
            return _Piece(" ", quoted=True) if quoted else _Piece("", split=True)
        guesses = list(self.values.get(name, []))
        guesses += {"PWD": [str(self.cwd)], "SHELL": ["bash"], "BASH": ["bash"], "0": ["bash"]}.get(name, [])
        if name == "HOME":
            guesses.append(str(self.user_home))
        if name in os.environ and os.environ[name] not in guesses:
            # the shell inherits this process's environment: `>> $MIBYAN_HOME/config.yaml` is seen as it is
            guesses.append(os.environ[name])
        if operators:
            for default in node.named_children[1:]:
                guesses.extend(w.text for w in self.words(default) if not w.dynamic)
        return _Piece(raw, quoted=quoted, dynamic=True, guesses=tuple(guesses[:_MAX_GUESSES]))

    def _substitution_guesses(self, node: Node) -> tuple[str, ...]:
        statements = [c for c in node.named_children if c.type != "comment"]
        if len(statements) != 1:
            return ()
        words = self.statement_words(statements[0])
        if not words:
            return ()
        feed = self.statement_feed(statements[0])
        output = static_output(words, feed)
        outputs = (output,) if output is not None else output_guesses(words, feed)
        return tuple(text.rstrip("\n") for text in outputs)


def _printf(template: str, values: list[str]) -> str:
    """printf's output: escapes of the format resolved, `%s` as given, `%b` with its escapes resolved.

    Like printf, the format is used again while values are left (`printf '%s\\n' a b`).
    """
    pieces = re.findall(r"((?:[^%]|%%)*)(%[-+ #0-9.]*[sbdciouxXfgeEq])?", template)
    specs = sum(1 for _, spec in pieces if spec)
    rest = list(values)
    parts: list[str] = []
    for _ in range(64):
        for literal, spec in pieces:
            parts.append(decode_escapes(literal.replace("%%", "%")))
            if spec:
                value = rest.pop(0) if rest else ""
                parts.append(decode_escapes(value) if spec.endswith("b") else value)
        if not rest or not specs:
            break
    return "".join(parts)


def output_guesses(words: Sequence[Word], feed: Feed) -> tuple[str, ...]:
    """What a command whose words have guesses may print: `static_output` of each reading."""
    inputs = feed.guesses if isinstance(feed, Stream) and feed.guesses else (feed,)
    if len(inputs) == 1 and not any(w.dynamic for w in words):  # one reading: the words themselves
        text = static_output(words, inputs[0])
        return () if text is None else (text,)
    options = [w.guesses if w.dynamic else (w.text,) for w in words]
    found: list[str] = []
    for combo in itertools.islice(itertools.product(*options), _MAX_GUESSES):
        for given in inputs[:4]:
            text = static_output([Word(t) for t in combo], given)
            if text is not None and text not in found:
                found.append(text)
    return tuple(found)


def static_output(words: Sequence[Word], feed: Feed) -> str | None:
    """What a command prints, when that is plain from its words (`echo`, `printf`, `cat <<EOF`, ...)."""
    if any(w.dynamic for w in words):
        return None
    name = command_name(words[0])
    args = [w.text for w in words[1:]]
    if name == "echo":
        flags: set[str] = set()
        while args and re.fullmatch(r"-[neE]+", args[0]):
            flags.update(args.pop(0)[1:])
        text = " ".join(args)
        return (decode_escapes(text) if "e" in flags else text) + ("" if "n" in flags else "\n")
    if name == "printf" and args:
        return _printf(args[0], args[1:])
    if name in ("which", "type") or (name == "command" and args[:1] in (["-v"], ["-V"])):
        found = [a for a in args if not a.startswith("-")]
        return found[0] + "\n" if found else None
    paths = [a for a in args if not a.startswith("-")]
    if name in ("dirname", "basename", "realpath", "readlink") and paths:
        if name == "dirname":
            return (os.path.dirname(paths[0].rstrip("/")) or ".") + "\n"
        if name == "basename":
            return os.path.basename(paths[0].rstrip("/")) + "\n"
        return os.path.normpath(paths[0]) + "\n"
    if not isinstance(feed, str):
        return None
    if name == "cat" and all(a == "-" for a in args):
        return feed
    if name == "base64" and any(a in ("-d", "--decode", "-D") for a in args):
        try:
            return base64.b64decode("".join(feed.split()), validate=False).decode(errors="replace")
        except (binascii.Error, ValueError):
            return None
    if name == "rev":
        return "\n".join(line[::-1] for line in feed.split("\n"))
    return None
