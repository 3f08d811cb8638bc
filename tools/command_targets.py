"""Which words of a command are files it writes: `tee FILE`, `cp SRC DEST`, `sed -i ... FILE`, `touch`, ...

Each target is judged by tools/command_paths.py (a disk, a start-up file, mibyan's own files, or a name
only known at run time). Commands that move or link files also have their sources judged: `mv` takes
the source away, and a link into mibyan's home would let a later write reach it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from mibyan.tools.approval import Verdict
from mibyan.tools.command_code import script_file
from mibyan.tools.command_paths import broad_target
from mibyan.tools.command_words import Feed, Judge, Word, combine, split_options

_Rule = Callable[[Judge, str, list[Word], Feed], Verdict]


def operands(args: list[Word], valued: set[str]) -> list[Word]:
    """The words that are not options or option values (options may come after operands)."""
    found: list[Word] = []
    i = 0
    ended = False
    while i < len(args):
        text = args[i].text
        if ended or not text.startswith("-") or text == "-":
            found.append(args[i])
        elif text == "--":
            ended = True
        elif text in valued:
            i += 1
        i += 1
    return found


def _tee(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    files = operands(args, set())
    verdict = combine(j.write(w, "writes to") for w in files)
    for word in files:  # after write(), which notes the content as unknown
        j.wrote(word, feed, append="-a" in (w.text for w in args))
    return verdict


def _each(action: str, valued: str = "") -> _Rule:
    options = set(valued.split())

    def rule(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
        return combine(j.write(w, action) for w in operands(args, options))

    return rule


def _copy(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    """cp, mv, install, ln, rsync, scp: the destination is the last operand, or `-t DIR`."""
    valued = {"-S", "--suffix", "-m", "--mode", "-o", "-g", "--owner", "--group", "-e", "--rsh", "-P"}
    valued |= {"-i", "-F", "-l", "-c", "-J", "-o", "--backup"} if name == "scp" else set()
    _, values, _ = split_options(args, valued={"-t", "--target-directory", *valued}, stop_at_positional=False)
    given = operands(args, {"-t", "--target-directory", *valued})
    target = values.get("-t") or values.get("--target-directory")
    findings = []
    if target is not None:
        findings.append(j.write(Word(target), "writes into"))
        destinations: list[Word] = []
    else:
        destinations = given[-1:]
    deletes = name == "rsync" and any(w.text.startswith("--delete") for w in args)
    for word in destinations:
        if name in ("scp", "rsync") and ":" in word.text.split("/")[0]:
            continue  # a remote destination
        findings.append(j.write(word, "writes to"))
        broad = broad_target(j, word) if deletes else None
        if broad is not None:  # `rsync -a --delete empty/ ~/` empties the home
            return Verdict(
                "hardline", f"deletes everything in {broad} that the source lacks (rsync --delete)", "rm_root"
            )
    moved = given if target is not None else given[:-1]
    if name in ("mv", "ln"):
        findings += [j.write(w, "moves or links" if name == "mv" else "links to") for w in moved]
    if name == "mv":  # moving the root, the home or a system folder away wrecks as surely as deleting it
        broad = next((b for b in (broad_target(j, w) for w in moved) if b is not None), None)
        if broad is not None:
            return Verdict(
                "hardline", f"moves the root, your home or a system folder away ({broad})", "rm_root"
            )
    rsh = values.get("-e") or values.get("--rsh")
    if rsh and name == "rsync":
        findings.append(j.script(rsh))
    return combine(findings)


def _sed(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    """`sed -i ... FILE` edits FILE; the script's `e` command runs shell code and `w FILE` writes."""
    in_place = any(
        w.text.startswith(("-i", "--in-place"))
        or (w.text[:1] == "-" and "i" in w.text[1:] and not w.text.startswith("--"))
        for w in args
    )
    texts = [w.text for w in args]
    expressions = [texts[i + 1] for i, t in enumerate(texts[:-1]) if t in ("-e", "--expression")]
    given = operands(args, {"-e", "-f", "--expression", "--file", "-l"})
    scripted = bool(expressions) or "-f" in texts or "--file" in texts
    if not scripted and given:
        expressions, given = [given[0].text], given[1:]
    findings = [j.write(w, "edits") for w in given if in_place]
    findings += [_sed_script(j, script) for script in expressions]
    for i, text in enumerate(texts[:-1]):  # `sed -f SCRIPT`: the script file is judged as `-e` text is
        if text in ("-f", "--file"):
            findings.append(script_file(j, "sed", args[i + 1], lambda code: (_sed_script(j, code), None)))
    return combine(findings)


def _sed_script(j: Judge, script: str) -> Verdict:
    findings = []
    for command in _SED_EXEC.findall(script):
        findings.append(j.script(command) if command.strip() else _SED_RUNS)
    if _SED_EXEC_FLAG.search(script):
        findings.append(_SED_RUNS)
    targets = [*_SED_WRITE.findall(script), *(m[1] for m in _SED_WRITE_FLAG.findall(script))]
    findings += [j.write(Word(target), "writes to") for target in targets]
    return combine(findings)


_SED_ADDRESS = r"(?:\d+|\$|/(?:[^/\\]|\\.)*/)"
_SED_COMMAND_START = rf"(?:^|[;{{}}\n])\s*(?:{_SED_ADDRESS}(?:\s*,\s*{_SED_ADDRESS})?)?\s*!?\s*"
_SED_EXEC = re.compile(_SED_COMMAND_START + r"e(?:[ \t]+([^;}\n]*)|[ \t]*(?=$|[;}\n]))")
_SED_SUBSTITUTE = r"s(.)(?:(?!\1)[^\\\n]|\\.)*\1(?:(?!\1)[^\\\n]|\\.)*\1[gpIiMm0-9]*"
_SED_EXEC_FLAG = re.compile(_SED_SUBSTITUTE + "e")
_SED_WRITE_FLAG = re.compile(_SED_SUBSTITUTE + r"w[ \t]*([^\n]+)")
_SED_WRITE = re.compile(_SED_COMMAND_START + r"[wW][ \t]+([^\n]+)")
_SED_RUNS = Verdict("dangerous", "runs shell commands from a sed script", "inline_code")


def _dd_like_output(option: str) -> _Rule:
    def rule(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
        findings = []
        for i, word in enumerate(args):
            text = word.text
            if text == option and i + 1 < len(args):
                findings.append(j.write(args[i + 1], "writes to"))
            elif text.startswith(option + "=") and option.startswith("--"):
                findings.append(j.write(Word(text.partition("=")[2], word.dynamic), "writes to"))
            elif len(option) == 2 and text.startswith(option) and len(text) > 2:
                findings.append(j.write(Word(text[2:], word.dynamic), "writes to"))
        return combine(findings)

    return rule


def _download(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    options = (
        ("-o", "--output") if name == "curl" else ("-O", "--output-document", "-P", "--directory-prefix")
    )
    return combine(_dd_like_output(option)(j, name, args, feed) for option in options)


def _tar_archive(j: Judge, args: list[Word]) -> Verdict:
    """`tar -cf ARCHIVE` and `tar czf ARCHIVE` write the archive (onto a disk, if that is what it names)."""
    first = args[0].text
    letters = first.lstrip("-") if not first.startswith("--") else ""
    creating = any(c in letters for c in "cru") or any(w.text in ("--create", "--append") for w in args)
    if not creating:
        return combine([])
    if letters and "f" in letters and (not first.startswith("-") or letters.endswith("f")) and len(args) > 1:
        return j.write(args[1], "writes to")
    return _dd_like_output("-f")(j, "tar", args[1:], None)


def _extract(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    first = args[0].text if args else ""
    extracting = name == "unzip" or (
        ("x" in first and not first.startswith("--")) or any(w.text in ("--extract", "--get") for w in args)
    )
    options = ("-C", "--directory") if name == "tar" else ("-d",)
    findings = [_dd_like_output(option)(j, name, args, feed) for option in options] if extracting else []
    if name == "tar" and args:
        findings.append(_tar_archive(j, args))
    texts = [w.text for w in args]
    findings += [j.script(texts[i + 1]) for i, t in enumerate(texts[:-1]) if name == "tar" and t == "-I"]
    for word in args:
        head, _, value = word.text.partition("=")
        if head in ("--to-command", "--use-compress-program", "--info-script", "--new-volume-script"):
            findings.append(j.script(value))
        if head == "--checkpoint-action" and value.startswith("exec="):
            findings.append(j.script(value[5:]))
    return combine(findings)


TARGET_RULES: dict[str, _Rule] = {
    "tee": _tee,
    "truncate": _each("empties", "-s --size -r --reference"),
    "touch": _each("creates or changes", "-d -t -r --date --reference"),
    "mkdir": _each("creates a folder in", "-m --mode"),
    "patch": _each("patches", "-p -i -o -r -d -B -z --input --output --directory"),
    "cp": _copy,
    "mv": _copy,
    "install": _copy,
    "ln": _copy,
    "rsync": _copy,
    "scp": _copy,
    "sed": _sed,
    "curl": _download,
    "wget": _download,
    "tar": _extract,
    "unzip": _extract,
}
