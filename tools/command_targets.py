"""Which words of a command are files it writes: `tee FILE`, `cp SRC DEST`, `sed -i ... FILE`, `touch`, ...

Each target is judged by tools/command_paths.py (a disk, a start-up file, mibyan's own files, or a name
only known at run time). Commands that move or link files also have their sources judged: `mv` takes
the source away, and a link into mibyan's home would let a later write reach it.
"""

from __future__ import annotations

import os
import re

from mibyan.tools.command_files import script_file
from mibyan.tools.command_paths import broad_target, holds_code_places
from mibyan.tools.command_spec import Scan, Spec, spec
from mibyan.tools.command_words import Feed, Judge, Word, combine
from mibyan.tools.verdict import SAFE, Verdict


def _tee(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    for word in scan.operands:  # after the role's write(), which notes the content as unknown
        j.wrote(word, feed, append="-a" in scan.flags or "--append" in scan.flags)
    return SAFE


def _unpacks(j: Judge, folder: Word, how: str) -> Verdict:
    """Files of names the command does not show land in `folder`: asked when it holds a place whose
    content runs by itself (the home holds ~/.bashrc and ~/.ssh, `/` holds /etc/cron.d)."""
    held = holds_code_places(j, folder)
    if held is None:
        return SAFE
    return Verdict("dangerous", f"{how} into {held}", "sensitive_write")


def _copies_contents(name: str, scan: Scan) -> bool:
    """`rsync -a dir/ DEST`, `cp -r dir/. DEST`, `cp -rT dir DEST`: the folder's contents, whatever their
    names, land in DEST itself."""
    sources = scan.operands[:-1]
    if name == "rsync":
        return any(w.text.endswith("/") or w.pattern for w in sources)
    return "-T" in scan.flags or any(w.text.endswith(("/.", "/./")) or w.pattern for w in sources)


def _is_folder(j: Judge, word: Word, sources: int) -> bool:
    """Whether the destination `word` is a folder the sources go into (`-t DIR`, `DEST/`, several
    sources, or a folder that exists)."""
    text = word.text
    return sources > 1 or text.endswith("/") or any(os.path.isdir(p) for p in j.resolve(text))


def _copy(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    """cp, mv, install, ln, rsync, scp: the destination is the last operand, or `-t DIR`."""
    target = scan.value("-t", "--target-directory")
    findings = []
    if target is not None:
        findings.append(j.write(target, "writes into"))
        target = Word(target.text.rstrip("/") + "/", target.dynamic)
        destinations: list[Word] = []
    else:
        destinations = scan.operands[-1:]
    deletes = name == "rsync" and any(f.startswith("--delete") for f in scan.flags)
    for word in destinations:
        if name in ("scp", "rsync") and ":" in word.text.split("/")[0]:
            continue  # a remote destination
        findings.append(j.write(word, "writes to"))
        if name in ("cp", "rsync", "mv") and _copies_contents(name, scan):
            findings.append(_unpacks(j, word, f"copies files whose names it does not show ({name})"))
        broad = broad_target(j, word) if deletes else None
        if broad is not None:  # `rsync -a --delete empty/ ~/` empties the home
            return Verdict(
                "hardline", f"deletes everything in {broad} that the source lacks (rsync --delete)", "rm_root"
            )
    moved = scan.operands if target is not None else scan.operands[:-1]
    folder = target if target is not None else (destinations[0] if destinations else None)
    if folder is not None and not folder.dynamic and _is_folder(j, folder, len(moved)):
        # `mv -t ~ .bashrc`, `cp .bashrc ~`: each source lands in the folder under its own name
        landed = (Word(os.path.join(folder.text, os.path.basename(w.text.rstrip("/")))) for w in moved)
        findings += [j.write(w, "writes to") for w in landed if not w.text.endswith("/")]
    if name in ("mv", "ln"):
        findings += [j.write(w, "moves or links" if name == "mv" else "links to") for w in moved]
    if name == "mv":  # moving the root, the home or a system folder away wrecks as surely as deleting it
        broad = next((b for b in (broad_target(j, w) for w in moved) if b is not None), None)
        if broad is not None:
            return Verdict(
                "hardline", f"moves the root, your home or a system folder away ({broad})", "rm_root"
            )
    return combine(findings)


def _sed(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    """`sed -i ... FILE` edits FILE; the script's `e` command runs shell code and `w FILE` writes."""
    in_place = bool({"-i", "--in-place"} & scan.flags)
    expressions = [w.text for w in scan.given("-e", "--expression")]
    given = scan.operands
    if not expressions and not scan.given("-f", "--file") and given:
        expressions, given = [given[0].text], given[1:]
    findings = [j.write(w, "edits") for w in given if in_place]
    findings += [_sed_script(j, script) for script in expressions]
    for word in scan.given("-f", "--file"):  # `sed -f SCRIPT`: the script file is judged as `-e` text is
        findings.append(script_file(j, "sed", word, lambda code: (_sed_script(j, code), None)))
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


def _tar(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    """tar: the archive it creates, the folder it extracts into, and the programs it runs."""
    args = scan.args
    first = args[0].text if args else ""
    letters = first if first and not first.startswith("-") else ""  # the old style: `tar czf X`
    modes = scan.flags | {f"-{c}" for c in letters}
    findings: list[Verdict] = []
    if modes & {"-c", "-r", "-u", "--create", "--append", "--update"}:
        archive = args[1] if "f" in letters and len(args) > 1 else scan.value("-f", "--file")
        findings += [j.write(archive, "writes to")] if archive is not None else []
    if modes & {"-x", "--extract", "--get"}:
        folders = scan.given("-C", "--directory") or [Word(".")]
        findings += [j.write(w, "writes to") for w in scan.given("-C", "--directory")]
        findings += [_unpacks(j, w, f"unpacks an archive ({name} -x)") for w in folders]
    for word in scan.given("--checkpoint-action"):
        if word.text.startswith("exec="):
            findings.append(j.script(word.text[5:]))
    return combine(findings)


def _unzip(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    if {"-l", "-v", "-t", "-p", "-Z"} & scan.flags:
        return SAFE  # lists, tests or prints: writes no file
    folders = scan.given("-d") or [Word(".")]
    findings = [j.write(w, "writes to") for w in scan.given("-d")]
    return combine([*findings, *(_unpacks(j, w, "unpacks an archive (unzip)") for w in folders)])


def _cpio(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    if not {"-i", "--extract"} & scan.flags:
        return SAFE
    folders = scan.given("-D", "--directory") or [Word(".")]
    return combine(_unpacks(j, w, "unpacks an archive (cpio -i)") for w in folders)


def _7z(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    if not scan.operands or scan.operands[0].text not in ("x", "e"):
        return SAFE
    folders = scan.given("-o") or [Word(".")]
    return combine(_unpacks(j, w, f"unpacks an archive ({name} {scan.operands[0].text})") for w in folders)


_COPY_VALUED = "-t --target-directory -S --suffix -m --mode -o -g --owner --group -e --rsh -P"


def _uniq(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    return combine(j.write(w, "writes to") for w in scan.operands[1:2])  # `uniq INPUT OUTPUT`


TARGET_SPECS: tuple[Spec, ...] = (
    spec(
        "echo printf true false test [ expr seq sleep exit : yes basename dirname pwd date whoami id",
        should_match={"echo x > ~/.bashrc": "dangerous"},
        should_not_match=["echo rm -rf /", "printf '%s\\n' 'dd of=/dev/sda'", "test -f ~/.bashrc"],
    ),
    spec(
        "cat head tail less more grep egrep fgrep rg ag wc diff cmp file stat ls du df md5sum sha1sum "
        "sha256sum sha512sum nl od hexdump strings realpath readlink tree jq yq which type whereis man",
        valued="-e -f -m -A -B -C -n -c --regexp --file --max-count",
        operands="reads",
        should_match={"cat /etc/shadow": "dangerous", "grep -r x . > ~/.profile": "dangerous"},
        should_not_match=["cat ~/.bashrc", "grep -rn 'rm -rf /' .", "man rm", "which python3"],
    ),
    spec(
        "sort shuf",
        valued="-k -t -S -T --key --field-separator --buffer-size --temporary-directory",
        writes="-o --output",
        should_match={"sort -o ~/.bashrc x": "dangerous", "shuf -o.git/hooks/pre-push x": "dangerous"},
        should_not_match=["sort -u names.txt -o names.txt", "sort ~/.bashrc"],
    ),
    spec(
        "uniq",
        valued="-f -s -w --skip-fields --skip-chars --check-chars",
        check=_uniq,
        should_match={"uniq x ~/.zshrc": "dangerous"},
        should_not_match=["uniq -c names.txt", "uniq a.txt b.txt"],
    ),
    spec(
        "ed red nano pico emacs micro",
        operands="writes",
        action="edits",
        should_match={"ed ~/.bashrc < fix.ed": "dangerous", "nano ~/.ssh/authorized_keys": "dangerous"},
        should_not_match=["ed notes.txt < fix.ed", "nano notes.txt"],
    ),
    spec(
        "tee",
        operands="writes",
        check=_tee,
        should_match={"tee ~/.bashrc": "dangerous", "echo x | tee -a .git/hooks/pre-commit": "dangerous"},
        should_not_match=["echo x | tee out.log", "tee -a report.txt"],
    ),
    spec(
        "truncate",
        valued="-s --size -r --reference",
        operands="writes",
        action="empties",
        should_match={"truncate -s 0 ~/.bashrc": "dangerous"},
        should_not_match=["truncate -s 0 build.log"],
    ),
    spec(
        "touch",
        valued="-d -t -r --date --reference",
        operands="writes",
        action="creates or changes",
        should_match={"touch ~/.ssh/authorized_keys": "dangerous"},
        should_not_match=["touch -d yesterday notes.txt"],
    ),
    spec(
        "mkdir",
        valued="-m --mode",
        operands="writes",
        action="creates a folder in",
        should_match={"mkdir -p ~/.config/autostart": "dangerous"},
        should_not_match=["mkdir -p build/out"],
    ),
    spec(
        "patch",
        valued="-p -i -r -d -B -z --input --directory",
        writes="-o --output",
        operands="writes",
        action="patches",
        should_match={"patch ~/.bashrc fix.diff": "dangerous", "patch -o ~/.profile a b": "dangerous"},
        should_not_match=["patch -p1 -i fix.diff"],
    ),
    spec(
        "cp mv install ln rsync",
        valued=_COPY_VALUED,
        code="-e --rsh",
        check=_copy,
        should_match={
            "cp x ~/.ssh/authorized_keys": "dangerous",
            "mv / /old": "hardline",
            "rsync -a --delete empty/ ~/": "hardline",
            "rsync -e 'rm -rf /' x host:y": "hardline",
            "ln -sf x ~/.bashrc": "dangerous",
            "rsync -a dotfiles/ ~/": "dangerous",
            "cp -r dotfiles/. ~": "dangerous",
            "cp -rT dotfiles ~": "dangerous",
            "mv -t ~ .bashrc": "dangerous",
            "cp .profile ~/": "dangerous",
            "cp x /etc/cron.d/job": "dangerous",
            "install -m 644 x.service ~/.config/systemd/user/": "dangerous",
        },
        should_not_match=["cp -r src dist", "mv a.txt b.txt", "rsync -a src/ host:backup/"],
    ),
    spec(
        "scp",
        valued=_COPY_VALUED + " -i -F -l -c -J -o",
        check=_copy,
        should_match={"scp host:key ~/.ssh/authorized_keys": "dangerous"},
        should_not_match=["scp -i id.pem build.tgz host:/srv/"],
    ),
    spec(
        "sed",
        valued="-e -f --expression --file -l",
        check=_sed,
        should_match={
            "sed -i s/a/b/ ~/.bashrc": "dangerous",
            "sed -ni.bak s/a/b/p ~/.profile": "dangerous",
            "sed '1e rm -rf /' x": "hardline",
            "sed 's/x/y/w .git/hooks/pre-commit' f": "dangerous",
        },
        should_not_match=["sed -n 1,5p notes.txt", "sed -i s/a/b/ notes.txt"],
    ),
    spec(
        "curl",
        writes="-o --output",
        should_match={"curl -so ~/.bashrc https://x.example": "dangerous"},
        should_not_match=["curl -sL https://x.example -o page.html"],
    ),
    spec(
        "wget",
        writes="-O --output-document -P --directory-prefix",
        should_match={"wget -O ~/.ssh/authorized_keys https://x.example/k": "dangerous"},
        should_not_match=["wget -q https://x.example/f.tgz"],
    ),
    spec(
        "cpio",
        valued="-D --directory -E -F -H -I -O -R",
        check=_cpio,
        should_match={"cd ~ && cpio -idm < x.cpio": "dangerous", "cpio -i -D / < x.cpio": "dangerous"},
        should_not_match=["cpio -idm < x.cpio", "find . | cpio -o > x.cpio"],
    ),
    spec(
        "7z 7za 7zr",
        valued="-o -p -t -w",
        check=_7z,
        should_match={"7z x keys.7z -o$HOME": "dangerous"},
        should_not_match=["7z x x.7z -obuild", "7z l x.7z"],
    ),
    spec(
        "tar bsdtar",
        valued="-f --file -C --directory -T -X -b --checkpoint-action",
        code="-I --use-compress-program --to-command --info-script --new-volume-script",
        check=_tar,
        should_match={
            "tar -czf /dev/sda src": "hardline",
            "tar -xf x.tar -C ~/.ssh": "dangerous",
            "tar -I 'rm -rf /' -xf x.tar": "hardline",
            "tar --checkpoint-action=exec='rm -rf ~' -cf a.tar x": "hardline",
            "tar -xf x.tar -C ~": "dangerous",
            "cd ~ && tar xzf /tmp/x.tgz": "dangerous",
            "tar -xf x.tar -C /": "dangerous",
            "tar -xf x.tar --directory=.git": "dangerous",
        },
        should_not_match=["tar -czf dist.tgz src", "tar xzf x.tgz -C build"],
    ),
    spec(
        "unzip",
        valued="-d -P -x",
        check=_unzip,
        should_match={"unzip -o keys.zip -d ~/.ssh": "dangerous", "unzip dots.zip -d ~": "dangerous"},
        should_not_match=["unzip x.zip -d build", "unzip -l ~/x.zip"],
    ),
)
