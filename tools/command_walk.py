"""The walk over a parsed command: finds every command it runs and every file it writes.

Every node of the tree is visited. Simple commands go to the judge with what they read on standard
input (a heredoc, a here-string, the known output of the stage before them in a pipeline); redirections
are judged as writes; function bodies are judged where they are defined, and again with the input of
a call that feeds them; a function that calls itself in the background or a pipeline is a fork bomb.
A node type the walk does not know makes the command "ask".
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from mibyan.tools.command_files import script_file
from mibyan.tools.command_git import changes_git_guard
from mibyan.tools.command_reader import output_guesses, static_output
from mibyan.tools.command_words import Feed, Stream, command_name
from mibyan.tools.verdict import Verdict

if TYPE_CHECKING:
    from tree_sitter import Node

    from mibyan.tools.command_judge import CommandJudge

UNREADABLE = Verdict(
    "dangerous", "cannot be fully read by mibyan (a syntax error or an unusual construct)", "unreadable"
)

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


class Walk:
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
            self.judge.enter([self.judge.user_home])
        elif targets[0].dynamic or targets[0].pattern:
            self.judge.cwd_unknown = True
            for guess in targets[0].guesses:
                self.judge.enter(self.judge.resolve(guess))
        else:
            self.judge.enter(self.judge.resolve(targets[0].text))

    # -- the walk -------------------------------------------------------------------------------------

    def statements(self, root: Node, feed: Feed) -> dict[str, int]:
        """Walk a whole script; returns, per tier found, the line (from 1) of the first statement of it."""
        if root.type != "program":
            self.node(root, feed)
            return {}
        lines: dict[str, int] = {}
        for child in root.children:
            before = len(self.findings)
            self.node(child, feed)
            for finding in self.findings[before:]:
                if finding.tier != "safe":
                    lines.setdefault(finding.tier, child.start_point[0] + 1)
        return lines

    def node(self, node: Node, feed: Feed) -> None:
        kind = node.type
        if node.is_error or node.is_missing:
            self.findings.append(UNREADABLE)
            return
        if not node.is_named:
            return
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, node, feed)
        elif kind in _CONTAINERS:
            self.children(node, feed)
        elif kind not in _LEAVES:
            self.findings.append(UNREADABLE)

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
        guesses = output_guesses(words, feed if own is None else own) if words else ()
        return Stream(command_name(words[0]) if words else "", guesses)

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
        while body is not None and body.type in ("list", "pipeline") and body.named_children:
            body = body.named_children[-1]  # `a && b > f`: bash sends only b's output to f
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
        if targets and operator == "<":  # `cat < ~/.ssh/id_rsa` reads the secret as `cat ~/.ssh/id_rsa` does
            words = self.reader.words(targets[0])
            self.findings.extend(self.judge.secrets(words))
            descriptor = next((c.text for c in node.children if c.type == "file_descriptor"), b"0")
            if len(words) == 1 and descriptor == b"0":  # `sh < run.sh`: a shell reading it runs it
                return Stream("<", path="" if words[0].dynamic else words[0].text)
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
        variable = (name.text or b"").decode(errors="replace") if name is not None else ""
        if value is not None and variable in _COMMAND_VARIABLES:
            for word in self.reader.words(value):
                if not word.dynamic:
                    self.findings.append(self.judge.script(word.text))
        if value is not None and variable in ("BASH_ENV", "ENV"):  # a file every new shell runs first
            for word in self.reader.words(value):
                self.findings.append(script_file(self.judge, variable, word, self.judge.script_at))
        if value is not None:
            self.quoted_substitution(value)
        self.findings.append(changes_git_guard([variable]))
        self.children(node, None)

    def unset(self, node: Node, feed: Feed) -> None:
        """`unset GIT_CONFIG_COUNT`: a variable that keeps a repository's git config from running commands."""
        names = [(c.text or b"").decode(errors="replace") for c in node.named_children]
        self.findings.append(changes_git_guard(names))
        self.children(node, feed)

    def quoted_substitution(self, value: Node) -> None:
        """`x='a[$(cmd)]'; echo $((x))`: arithmetic runs the `$(...)` a quoted value hides.

        Only what would never run is kept, since most such values are just text.
        """
        for word in self.reader.words(value):
            if not word.dynamic and ("$(" in word.text or "`" in word.text):
                verdict = self.judge.script(word.text)
                if verdict.tier == "hardline":
                    self.findings.append(verdict)

    def process_substitution(self, node: Node, feed: Feed) -> None:
        # `>(cmd)` reads what the outer command writes, which the judge cannot know
        writes_in = any(c.type == ">(" for c in node.children)
        inner = Stream("") if writes_in else None
        for child in node.children:
            self.node(child, inner)


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
    "command": Walk.command,
    "pipeline": Walk.pipeline,
    "redirected_statement": Walk.redirected,
    "function_definition": Walk.function,
    "process_substitution": Walk.process_substitution,
    "command_substitution": Walk.substitution,
    "variable_assignment": Walk.assignment,
    "unset_command": Walk.unset,
    "file_redirect": lambda walk, node, feed: walk.redirect(node),
    "herestring_redirect": lambda walk, node, feed: walk.children(node, None),
    "heredoc_redirect": lambda walk, node, feed: walk.heredoc_tail(node, node),
}
