"""Skills: folders with a SKILL.md (YAML front matter: name, description, triggers) and instructions.

They live under `$MIBYAN_HOME/skills/` and `./.mibyan/skills/` (the project's win on a name clash). The
system prompt lists them; a user message containing one of a skill's trigger words brings that skill's
instructions into the turn. Their front matter is kept parsed in the home (see SkillIndex) and a
skill's instructions are read only when a turn needs them.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from mibyan.config.paths import write_private

_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n?(.*)\Z", re.S)
_MAX_SKILL_CHARS = 8000
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: several times faster
_INDEX_VERSION = 1
_INDEX_LIMIT = 2000
log = logging.getLogger("mibyan.skills")


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    triggers: tuple[str, ...]
    path: Path

    @cached_property
    def body(self) -> str:
        """The skill's instructions, read when first needed (most turns need none)."""
        text = _read(self.path)
        match = _FRONT_MATTER.match(text or "")
        return (match.group(2) if match else text or "").strip()[:_MAX_SKILL_CHARS]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _front_matter(text: str) -> dict[str, object]:
    match = _FRONT_MATTER.match(text)
    if not match:
        return {}
    try:
        loaded = yaml.load(match.group(1), Loader=_LOADER)
    except yaml.YAMLError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def load_skill(path: Path) -> Skill | None:
    text = _read(path)
    if text is None:
        return None
    meta = _front_matter(text)
    raw_triggers = meta.get("triggers") or []
    triggers = [raw_triggers] if isinstance(raw_triggers, str) else raw_triggers
    if not isinstance(triggers, list):
        triggers = []
    return Skill(
        name=str(meta.get("name") or path.parent.name),
        description=str(meta.get("description") or "").strip(),
        triggers=tuple(str(t).lower() for t in triggers if str(t).strip()),
        path=path,
    )


class SkillIndex:
    """The parsed front matter of every skill seen, kept in `$MIBYAN_HOME/cache/skills.json` (0600).

    An entry is used while its file keeps its modification time and size; a changed, new or removed file
    is read again. Parsing YAML is what made many skills slow to start with; a stat per file is not.
    """

    def __init__(self, home: Path) -> None:
        self.path = home / "cache" / "skills.json"
        self._entries: dict[str, dict[str, Any]] = {}
        self._changed = False
        try:
            loaded = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            loaded = {}
        if isinstance(loaded, dict) and loaded.get("version") == _INDEX_VERSION:
            self._entries = loaded.get("skills") or {}

    def skill(self, path: Path) -> Skill | None:
        try:
            status = path.stat()
        except OSError:
            return None
        stamp = [status.st_mtime_ns, status.st_size]
        entry = self._entries.get(str(path))
        if entry is not None and entry.get("stamp") == stamp:
            return Skill(entry["name"], entry["description"], tuple(entry["triggers"]), path)
        skill = load_skill(path)
        if skill is not None:
            self._entries[str(path)] = {
                "stamp": stamp,
                "name": skill.name,
                "description": skill.description,
                "triggers": list(skill.triggers),
            }
            self._changed = True
        return skill

    def save(self) -> None:
        """Write the index if anything was parsed anew (a home that cannot be written keeps none)."""
        if not self._changed:
            return
        if len(self._entries) > _INDEX_LIMIT:
            self._entries = {key: self._entries[key] for key in list(self._entries)[-_INDEX_LIMIT:]}
        data = json.dumps({"version": _INDEX_VERSION, "skills": self._entries}, ensure_ascii=False)
        try:
            write_private(self.path, data.encode())
        except OSError as exc:
            log.info("skill index not saved: %s", exc)
        self._changed = False


def discover_skills(home: Path, cwd: Path) -> list[Skill]:
    """Every skill of the home and the project, sorted by name (a stable order for the prompt)."""
    index = SkillIndex(home)
    found: dict[str, Skill] = {}
    for root in (home / "skills", cwd / ".mibyan" / "skills"):
        if root.is_dir():
            for skill_file in sorted(root.glob("*/SKILL.md")):
                skill = index.skill(skill_file)
                if skill is not None:
                    found[skill.name] = skill
    index.save()
    return [found[name] for name in sorted(found)]


def match_skills(skills: list[Skill], message: str) -> list[Skill]:
    """The skills whose trigger words appear in `message` (whole words, any case)."""
    words = set(re.findall(r"[\w-]+", message.lower()))
    text = message.lower()
    return [s for s in skills if any((t in words) if " " not in t else (t in text) for t in s.triggers)]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


class SemanticMatcher:
    """Matches skills to a message by meaning: cosine similarity of embeddings from a configured provider.

    The skills are embedded once (name, description and triggers); each message once. When the
    embedding provider fails, matching falls back to trigger words alone, and the failure is logged.
    """

    def __init__(self, embed: Callable[[list[str]], list[list[float]]], threshold: float) -> None:
        self._embed = embed
        self.threshold = threshold
        self._cache: dict[str, list[float]] = {}

    def _vectors(self, texts: list[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            self._cache.update(zip(missing, self._embed(missing), strict=True))
        return [self._cache[t] for t in texts]

    def match(self, skills: list[Skill], message: str) -> list[Skill]:
        if not skills or not message.strip():
            return []
        try:
            profiles = [f"{s.name}: {s.description} ({', '.join(s.triggers)})" for s in skills]
            vectors = self._vectors([*profiles, message])
        except Exception:  # an optional side service: its failure must not break the turn
            log.warning("skill embeddings failed; matching by trigger words only", exc_info=True)
            return []
        query = vectors[-1]
        return [
            skill
            for skill, vector in zip(skills, vectors, strict=False)
            if cosine(vector, query) >= self.threshold
        ]


def skills_index(skills: list[Skill]) -> str:
    return "\n".join(f"- {s.name}: {s.description}" for s in skills)
