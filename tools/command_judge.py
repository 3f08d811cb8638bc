"""The command judge: reads a shell command with bash's grammar and judges every command it would run.

The command is parsed by tree-sitter-bash, and the tree is walked whole. Each simple command is judged
wherever it sits: in pipelines and lists, subshells and groups, `$(...)`, backticks and `<(...)`,
function bodies, loops and `case` arms, heredocs. Its words are read the way bash reads them (quotes,
escapes, `$'...'`, brace expansion, `${IFS}` splitting, `~` and `$HOME`), then handed to the rules
(tools/command_rules.py), which look through wrappers and re-enter the judge for the code a command
runs: `sh -c` strings and `eval` (parsed in turn), text fed to a shell or interpreter on its standard
input (a heredoc, a here-string, `echo ... |`), `find -exec`, `xargs`, inline `python -c` code.

What cannot be known before the command runs is judged for what it may be: a command name computed at
run time (`$a`, `$(echo rm)`, `/bin/r?`) is its own kind, "dynamic_command", and the values the
command itself offers for it (`a=rm`, `for c in rm`) are tried in turn so that a hardline one is
caught. A parse error or a construct the judge does not know is "ask", never "safe"; a broken tree is
also read a second, looser way (tools/command_loose.py) so that a hardline command hidden behind a
syntax error still never runs. The command is judged once as written and once with Unicode folded
(NFKC, invisible characters and line continuations removed), and the worse reading wins.
"""

from __future__ import annotations

import fnmatch
import os
import re
import threading
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mibyan.tools.approval import SAFE, Verdict
from mibyan.tools.command_paths import judge_write_word
from mibyan.tools.command_reader import WordReader, static_output
from mibyan.tools.command_rules import KNOWN_NAMES, judge_invocation
from mibyan.tools.command_words import Feed, Stream, Word, combine, command_name

if TYPE_CHECKING:
    from tree_sitter import Node, Parser

MAX_DEPTH = 8  # scripts inside scripts (`sh -c "eval '...'"`) deeper than this are not read: ask
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e"))
_UNREADABLE = Verdict(
    "dangerous", "cannot be fully read by mibyan (a syntax error or an unusual construct)", "unreadable"
)
_TOO_DEEP = Verdict("dangerous", "nests scripts too deeply for mibyan to read", "unreadable")

# Nodes whose children are walked and that judge nothing themselves.
_CONTAINERS = {
    "program",
    "list",
    "compound_statement",
    "subshell",
    "do_group",
    "if_statement",
    "elif_clause",
    "else_clause",
    "while_statement",
    "case_statement",
    "case_item",
    "negated_command",
    "for_statement",
    "c_style_for_statement",
    "test_command",
    "binary_expression",
    "unary_expression",
    "parenthesized_expression",
    "ternary_expression",
    "postfix_expression",
    "string",
    "translated_string",
    "concatenation",
    "expansion",
    "arithmetic_expansion",
    "heredoc_body",
    "array",
    "subscript",
    "variable_assignments",
    "declaration_command",
    "unset_command",
    "command_name",
}
_LEAVES = {
    "word",
    "number",
    "raw_string",
    "ansi_c_string",
    "string_content",
    "simple_expansion",
    "variable_name",
    "special_variable_name",
    "comment",
    "heredoc_start",
    "heredoc_end",
    "heredoc_content",
    "file_descriptor",
    "test_operator",
    "regex",
    "extglob_pattern",
    "brace_expression",
}

_COMMAND_VARIABLES = {
    "GIT_SSH_COMMAND",
    "GIT_SSH",
    "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR",
    "GIT_PAGER",
    "GIT_EXTERNAL_DIFF",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "SUDO_ASKPASS",
    "EDITOR",
    "VISUAL",
    "PAGER",
    "MANPAGER",
    "LESSOPEN",
    "LESSCLOSE",
    "PROMPT_COMMAND",
    "FCEDIT",
}
_FILLS = {"writes to", "writes into", "edits", "patches", "creates or changes"}
_local = threading.local()  # tree-sitter parsers are not thread-safe: one per thread


def _parser() -> Parser:
    parser: Parser | None = getattr(_local, "parser", None)
    if parser is None:
        import tree_sitter
        import tree_sitter_bash

        parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))
        _local.parser = parser
    return parser


def fold(command: str) -> str:
    """The command with the disguises that change nothing for a reader removed."""
    text = unicodedata.normalize("NFKC", command).translate(_INVISIBLE)
    return text.replace("\\\n", "")


class CommandJudge:
    """Judges one command line; `judge()` is the entry point. Implements the rules' `Judge` protocol."""

    def __init__(self, *, home: Path, cwd: Path, user_home: Path) -> None:
        self.home = home
        self.user_home = user_home
        self.cwds: list[Path] = [cwd]
        self.cwd_unknown = False
        self.depth = 0
        self.files: dict[Path, Feed] = {}  # what the command writes to files before it may run them
        self.reader = WordReader(user_home=user_home, cwd=cwd)

    # -- the Judge protocol ---------------------------------------------------------------------------

    def script(self, text: str, feed: Feed = None) -> Verdict:
        if self.depth >= MAX_DEPTH:
            return _TOO_DEEP
        self.depth += 1
        try:
            return self._judge_text(text, feed)
        finally:
            self.depth -= 1

    def run(self, words: Sequence[Word], feed: Feed = None) -> Verdict:
        # every wrapper consumes a word, so this recursion ends without a depth count
        return self._judge_words(list(words), feed) if words else SAFE

    def write(self, word: Word, action: str) -> Verdict:
        if action in _FILLS:
            self.wrote(word, None)  # what goes in is unknown unless the caller says (see remember_output)
        return judge_write_word(self, word, action, cwd_unknown=self.cwd_unknown)

    def wrote(self, word: Word, content: Feed, *, append: bool = False) -> None:
        if word.dynamic:
            return
        for path in self.resolve(word.text):
            before = self.files.get(path)
            if append and isinstance(before, str) and isinstance(content, str):
                content = before + content
            self.files[path] = content if content is not None else Stream("")

    def written(self, word: Word) -> Feed:
        if word.dynamic:
            return None
        return next((self.files[p] for p in self.resolve(word.text) if p in self.files), None)

    def resolve(self, text: str) -> list[Path]:
        path = Path(re.sub(r"^//+", "/", text))  # normpath keeps a leading "//", which is "/" on Linux
        if path.is_absolute():
            return [Path(os.path.normpath(path))]
        return [Path(os.path.normpath(cwd / path)) for cwd in self.cwds]

    # -- reading the command ----------------------------------------------------------------------------

    def _judge_text(self, text: str, feed: Feed) -> Verdict:
        readings = [text]
        folded = fold(text)
        if folded != text:
            readings.append(folded)
        return combine(self._judge_reading(reading, feed) for reading in readings)

    def _judge_reading(self, text: str, feed: Feed) -> Verdict:
        source = text.encode("utf-8", "surrogatepass")
        tree = _parser().parse(source)
        walk = _Walk(self)
        outer = (self.reader.misread, self.reader.source, self.reader.cache)
        self.reader.misread, self.reader.source, self.reader.cache = False, source, {}
        walk.prepare(tree.root_node)
        walk.node(tree.root_node, feed)
        misread = self.reader.misread
        self.reader.misread, self.reader.source, self.reader.cache = outer
        if tree.root_node.has_error or misread:
            from mibyan.tools.command_loose import loose_verdicts

            walk.findings.append(_UNREADABLE)
            walk.findings.extend(loose_verdicts(self, text))
        return combine(walk.findings)

    def _judge_words(self, words: list[Word], feed: Feed) -> Verdict:
        head = words[0]
        if not (head.dynamic or head.pattern):
            return judge_invocation(self, words, feed)
        return self._judge_dynamic(words, feed)

    def _judge_dynamic(self, words: list[Word], feed: Feed) -> Verdict:
        """A command whose name is only known at run time: its own kind, unless a guess is hardline."""
        head = words[0]
        guesses = list(head.guesses) or _pattern_guesses(head)
        # the script may give the name other values than those the judge saw: assume the worst as well
        for guess in [*guesses[:16], "rm", "dd"]:
            verdict = judge_invocation(self, [Word(guess), *words[1:]], feed)
            if verdict.tier == "hardline":
                return verdict
        shown = head.text if len(head.text) <= 40 else head.text[:40] + "…"
        return Verdict(
            "dangerous", f"runs a command whose name is only known when it runs ({shown})", "dynamic_command"
        )


class _Walk:
    """One walk over one parsed reading: collects a finding for everything that is not safe."""

    def __init__(self, judge: CommandJudge) -> None:
        self.judge = judge
        self.reader = judge.reader
        self.findings: list[Verdict] = []
        self.functions: dict[str, Node] = {}  # name -> body, of the functions the script defines
        self.calling: set[int] = set()

    def prepare(self, root: Node) -> None:
        """Before judging: learn the values variables are given and the directories the script enters."""
        stack = [root]
        while stack:
            node = stack.pop()
            kind = node.type
            if kind == "variable_assignment":
                self.reader.learn_assignment(node)
            elif kind == "for_statement":
                self.reader.learn_loop(node)
            elif kind == "command":
                self._learn_cd(node)
            elif kind == "function_definition":
                name, body = node.child_by_field_name("name"), node.child_by_field_name("body")
                if name is not None and body is not None:
                    self.functions[(name.text or b"").decode(errors="replace")] = body
            stack.extend(reversed(node.children))

    def _learn_cd(self, node: Node) -> None:
        head = node.child_by_field_name("name")
        plain = head is not None and head.named_children[0].type == "word" and b"\\" not in (head.text or b"")
        if head is None or (plain and not (head.text or b"").endswith((b"cd", b"pushd"))):
            return  # a plain name that is not cd: no need to read the words
        words = self.reader.command_words(node)
        if not words or command_name(words[0]) not in ("cd", "pushd"):
            return
        targets = [w for w in words[1:] if not w.text.startswith("-")]
        if not targets:
            self.judge.cwds.append(self.judge.user_home)
        elif targets[0].dynamic or targets[0].pattern:
            self.judge.cwd_unknown = True
        else:
            self.judge.cwds.extend(self.judge.resolve(targets[0].text))

    # -- the walk -------------------------------------------------------------------------------------

    def node(self, node: Node, feed: Feed) -> None:
        kind = node.type
        if node.is_error or node.is_missing:
            self.findings.append(_UNREADABLE)
            return
        if not node.is_named:
            return
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, node, feed)
        elif kind in _CONTAINERS:
            self.children(node, feed)
        elif kind not in _LEAVES:
            self.findings.append(_UNREADABLE)

    def children(self, node: Node, feed: Feed) -> None:
        for child in node.children:
            self.node(child, feed)

    def command(self, node: Node, feed: Feed) -> None:
        words = self.reader.command_words(node)
        for child in node.children:
            if child.type == "herestring_redirect":
                feed = self.reader.herestring(child)
            elif child.type == "file_redirect":
                feed = self.redirect(child) or feed
            else:
                self.node(child, None)
        if not words:
            return
        self.findings.append(self.judge.run(words, feed))
        body = self.functions.get(words[0].text)
        if body is not None and feed is not None and body.id not in self.calling:
            self.calling.add(body.id)  # a function reading stdin: judge its body with what it reads
            self.node(body, feed)
            self.calling.discard(body.id)

    def pipeline(self, node: Node, feed: Feed) -> None:
        stages = [child for child in node.children if child.is_named]
        for stage in stages:
            self.node(stage, feed)
            feed = self.piped(stage, feed)

    def piped(self, upstream: Node, feed: Feed) -> Feed:
        """What the next pipeline stage reads: the text `upstream` writes, when that is known."""
        words = self.reader.statement_words(upstream)
        own = self.reader.statement_feed(upstream)
        text = static_output(words, feed if own is None else own) if words else None
        if text is not None:
            return text
        return Stream(command_name(words[0]) if words else "")

    def redirected(self, node: Node, feed: Feed) -> None:
        body: Node | None = None
        for child in node.children:
            if child.type == "file_redirect":
                feed = self.redirect(child) or feed
            elif child.type == "herestring_redirect":
                feed = self.reader.herestring(child)
            elif child.type == "heredoc_redirect":
                feed = self.reader.heredoc_text(child)
                self.heredoc_tail(child, node)
            elif body is None and child.is_named:
                body = child
            else:
                self.node(child, None)
        self.remember_output(node, body, feed)
        if body is not None:
            self.node(body, feed)

    def remember_output(self, node: Node, body: Node | None, feed: Feed) -> None:
        """`echo ... > run.sh; sh run.sh`: note what is written, so a later run of the file is judged."""
        words = self.reader.statement_words(body) if body is not None else []
        own = next((self.reader.heredoc_text(c) for c in node.children if c.type == "heredoc_redirect"), None)
        content = static_output(words, own if own is not None else feed) if words else None
        for child in node.children:
            operator = next((c.type for c in child.children if not c.is_named), "")
            target = child.child_by_field_name("destination")
            if child.type == "file_redirect" and operator in (">", ">>", ">|", "&>", "&>>") and target:
                for word in self.reader.words(target):
                    self.judge.wrote(word, content, append=operator.endswith(">>"))

    def heredoc_tail(self, heredoc: Node, statement: Node) -> None:
        """`cat <<EOF | sh` puts `| sh` inside the heredoc node: its stages read the statement's output."""
        for child in heredoc.children:
            if child.type in ("heredoc_body", "heredoc_start", "heredoc_end") or not child.is_named:
                if child.type == "heredoc_body":
                    self.node(child, None)
                continue
            if child.type == "pipeline":
                feed = self.piped(statement, None)
                for stage in child.children:
                    if stage.is_named:
                        self.node(stage, feed)
                        feed = self.piped(stage, feed)
            else:
                self.node(child, None)

    def redirect(self, node: Node) -> Feed:
        """Judge a redirection's write target; returns what it feeds the command (`< <(curl ...)`)."""
        operator = next((c.type for c in node.children if not c.is_named), "")
        targets = [c for c in node.children if c.is_named and c.type != "file_descriptor"]
        for target in targets:
            self.node(target, None)
        if targets and operator == "<" and targets[0].type == "process_substitution":
            inner = [c for c in targets[0].named_children if c.type != "comment"]
            words = self.reader.statement_words(inner[0]) if len(inner) == 1 else []
            return Stream(command_name(words[0]) if words else "")
        if not targets or not any(ch in operator for ch in ">"):
            return None
        if operator in (">&", "<&") and targets[0].type == "number":
            return None
        for word in self.reader.words(targets[0]):
            if operator.endswith("&") and word.text.lstrip("-").isdigit():
                continue
            self.findings.append(self.judge.write(word, "writes to"))
        return None

    def function(self, node: Node, feed: Feed) -> None:
        name_node = node.child_by_field_name("name")
        body = node.child_by_field_name("body")
        if name_node is not None and body is not None and _forks_itself(name_node.text or b"", body):
            self.findings.append(
                Verdict("hardline", "is a fork bomb, which freezes the machine", "fork_bomb")
            )
        if body is not None:
            self.node(body, None)

    def substitution(self, node: Node, feed: Feed) -> None:
        raw = (node.text or b"").decode(errors="replace")
        if raw.startswith("`") and "\\" in raw:
            # inside backticks bash first unescapes \` \\ \$, which the grammar does not: read it again
            inner = re.sub(r"\\([`\\$])", r"\1", raw[1:-1])
            self.findings.append(self.judge.script(inner))
            return
        self.children(node, None)

    def assignment(self, node: Node, feed: Feed) -> None:
        """`GIT_SSH_COMMAND='...' git fetch`, `PROMPT_COMMAND=...`: variables whose value is run as code."""
        name = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        if name is not None and value is not None and (name.text or b"").decode() in _COMMAND_VARIABLES:
            for word in self.reader.words(value):
                if not word.dynamic:
                    self.findings.append(self.judge.script(word.text))
        self.children(node, None)

    def process_substitution(self, node: Node, feed: Feed) -> None:
        # `>(cmd)` reads what the outer command writes, which the judge cannot know
        writes_in = any(c.type == ">(" for c in node.children)
        inner = Stream("") if writes_in else None
        for child in node.children:
            self.node(child, inner)


def _pattern_guesses(word: Word) -> list[str]:
    """The commands the judge knows of that a glob used as a command name (`/bin/r?`) may run."""
    if not word.pattern:
        return []
    pattern = command_name(word)
    return sorted(name for name in KNOWN_NAMES if fnmatch.fnmatchcase(name, pattern))


def _forks_itself(name: bytes, body: Node) -> bool:
    """A function that calls itself twice, or once in the background or a pipeline, multiplies forever."""
    calls = 0
    backgrounded = False
    stack = [body]
    while stack:
        node = stack.pop()
        if node.type == "command":
            head = node.child_by_field_name("name")
            if head is not None and (head.text or b"").strip() == name:
                calls += 1
        if not node.is_named and node.type in ("&", "|", "|&"):
            backgrounded = True
        stack.extend(node.children)
    return calls >= 2 or (calls >= 1 and backgrounded)


_HANDLERS: dict[str, Any] = {
    "command": _Walk.command,
    "pipeline": _Walk.pipeline,
    "redirected_statement": _Walk.redirected,
    "function_definition": _Walk.function,
    "process_substitution": _Walk.process_substitution,
    "command_substitution": _Walk.substitution,
    "variable_assignment": _Walk.assignment,
    "file_redirect": lambda walk, node, feed: walk.redirect(node),
    "herestring_redirect": lambda walk, node, feed: walk.children(node, None),
    "heredoc_redirect": lambda walk, node, feed: walk.heredoc_tail(node, node),
}


def judge(command: str, *, home: Path, cwd: Path, user_home: Path | None = None) -> Verdict:
    """Judge a shell command line: "safe", "dangerous" (ask first) or "hardline" (never run).

    Args:
        command: the command line, as bash will receive it.
        home: the mibyan home, whose files no command may change.
        cwd: the directory the command runs in.
        user_home: the user's home directory (`~`, `$HOME`); the process's own when omitted.
    """
    judge = CommandJudge(home=home, cwd=cwd, user_home=user_home or Path.home())
    return judge.script(command)
