"""The project's own code a script pulls in as it starts, judged with the script.

A Python script's `import helper` runs `helper.py` when one lies in the folder it starts from (the
working directory, for `python3 x.py` and `python3 -m x`), before any installed module of that name; a
JavaScript file's `require("./lib")` and `import ... from "./lib.js"` run those files. Such modules
are found from the working directory and judged as script files are (tools/command_files.py); an
import cycle adds nothing. Modules found elsewhere (installed packages) are not read.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from mibyan.tools.command_files import Reader, script_file
from mibyan.tools.command_words import Judge, Word
from mibyan.tools.verdict import SAFE, Verdict

_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import[ \t]+\(?([\w, \t]*)|import[ \t]+([\w., \t]+))", re.MULTILINE
)


_NODE_IMPORT = re.compile(r"(?:require\s*\(\s*|\bfrom\s+|\bimport\s*\(?\s*)['\"](\.{1,2}/[^'\"\n]+)['\"]")


#: The reader of a language's script files (tools/command_code.py's `code_reader`), passed in: this module
#: sits below the one that judges code.
ReaderFor = Callable[[str], Reader]


def imports(j: Judge, language: str, code: str, reader_for: ReaderFor) -> list[tuple[int, Verdict]]:
    """The verdicts of the project's own modules `code` imports, with the line of each import: Python's
    modules beside it, JavaScript's `./` and `../` files (found from the working directory)."""
    if language == "node":
        return _node_imports(j, code, reader_for)
    if language != "python":
        return []
    found: list[tuple[int, Verdict]] = []
    for match in _IMPORT.finditer(code):
        if match.group(1):  # `from pkg import a, b`: pkg, and its submodules a and b
            names = [
                match.group(1),
                *(f"{match.group(1)}.{n}" for n in match.group(2).split(",") if n.strip()),
            ]
        else:
            names = match.group(3).split(",")
        for name in names:
            module = name.split()[0] if name.split() else ""  # `import a as b`
            verdict = local_module(j, "python", module, reader_for, imported=True)
            if verdict.tier != "safe":
                found.append((code.count("\n", 0, match.start()) + 1, verdict))
    return found


def _node_imports(j: Judge, code: str, reader_for: ReaderFor) -> list[tuple[int, Verdict]]:
    found: list[tuple[int, Verdict]] = []
    for match in _NODE_IMPORT.finditer(code):
        base = match.group(1)
        for candidate in (base, f"{base}.js", f"{base}.mjs", f"{base}.cjs", f"{base}/index.js"):
            if any(path.is_file() for path in j.resolve(candidate)):
                verdict = script_file(j, "node", Word(candidate), reader_for("node"), again=SAFE)
                if verdict.tier != "safe":
                    found.append((code.count("\n", 0, match.start()) + 1, verdict))
                break
    return found


def local_module(
    j: Judge, name: str, module: str, reader_for: ReaderFor, *, imported: bool = False
) -> Verdict:
    """`python3 -m NAME` (or `import NAME`) runs the project's own NAME.py, or NAME/__main__.py (or
    NAME/__init__.py), before an installed module of that name."""
    if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
        return SAFE
    base = module.replace(".", "/")
    top = base.partition("/")[0]
    candidates = [f"{base}.py", f"{base}/__init__.py" if imported else f"{base}/__main__.py"]
    if top != base:
        candidates.append(f"{top}/__init__.py")
    for candidate in candidates:
        if any(path.is_file() for path in j.resolve(candidate)):
            # an import cycle (the module is being judged already) adds nothing: safe
            again = SAFE if imported else None
            return script_file(j, name, Word(candidate), reader_for("python"), again=again)
    return SAFE  # runs an installed module
