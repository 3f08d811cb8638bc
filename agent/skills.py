"""Skills: folders with a SKILL.md (YAML front matter: name, description, triggers) and instructions.

They live under `$MIBYAN_HOME/skills/` and `./.mibyan/skills/` (the project's win on a name clash). The
system prompt lists them; a user message containing one of a skill's trigger words brings that skill's
instructions into the turn.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n?(.*)\Z", re.S)
_MAX_SKILL_CHARS = 8000
log = logging.getLogger("mibyan.skills")


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    triggers: tuple[str, ...]
    body: str
    path: Path


def load_skill(path: Path) -> Skill | None:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    match = _FRONT_MATTER.match(text)
    meta: dict[str, object] = {}
    body = text
    if match:
        try:
            loaded = yaml.safe_load(match.group(1))
        except yaml.YAMLError:
            loaded = None
        meta = loaded if isinstance(loaded, dict) else {}
        body = match.group(2)
    raw_triggers = meta.get("triggers") or []
    triggers = [raw_triggers] if isinstance(raw_triggers, str) else raw_triggers
    if not isinstance(triggers, list):
        triggers = []
    return Skill(
        name=str(meta.get("name") or path.parent.name),
        description=str(meta.get("description") or "").strip(),
        triggers=tuple(str(t).lower() for t in triggers if str(t).strip()),
        body=body.strip()[:_MAX_SKILL_CHARS],
        path=path,
    )


def discover_skills(home: Path, cwd: Path) -> list[Skill]:
    """Every skill of the home and the project, sorted by name (a stable order for the prompt)."""
    found: dict[str, Skill] = {}
    for root in (home / "skills", cwd / ".mibyan" / "skills"):
        if root.is_dir():
            for skill_file in sorted(root.glob("*/SKILL.md")):
                skill = load_skill(skill_file)
                if skill is not None:
                    found[skill.name] = skill
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
