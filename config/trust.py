"""Which projects' `.mibyan/config.yaml` the user trusts, and what an untrusted one may not set.

A cloned repository's configuration must not run a command, send the user's key to a server of its
choosing, add hooks or loosen approvals, tools or the sandbox. Those keys apply only once the user has
run `mibyan trust PATH`, which records the folder and the sha256 of its config file in the home
(`trusted.json`, 0600); an edited file is untrusted again. The rest of the file (the model's name, the
iteration budget, compression thresholds, ...) applies either way.

What an untrusted file may set is an allow-list: a section mibyan adds later needs trust until it is
listed here. Standard library only, so `mibyan trust` and the loader can use it for free.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mibyan.config.paths import write_private
from mibyan.core.errors import ConfigError
from mibyan.core.sanitize import visible  # the one output sanitiser; the notice is shown on a terminal

TRUST_FILE = "trusted.json"

TrustState = Literal["trusted", "untrusted", "changed"]

#: Per section, the keys an untrusted project may set; None means every key of the section.
_OPEN_KEYS: dict[str, frozenset[str] | None] = {
    "agent": None,
    "compression": frozenset({"enabled", "threshold", "gateway_threshold", "protect_last_n"}),
    "delegation": frozenset({"max_iterations", "max_concurrent", "max_depth", "timeout", "summary_chars"}),
}
#: What an untrusted project may say about a provider: nothing that decides where a key goes, or which.
_OPEN_PROVIDER_KEYS = frozenset({"api_mode"})


_NAMED_AT_MOST = 12  # keys named in the notice; it stays one line however many a file sets


class UntrustedConfigWarning(UserWarning):
    """Parts of a project's config file were ignored because the user has not trusted it."""


@dataclass(frozen=True)
class TrustRecord:
    """One trusted folder and the hash its config file had when the user trusted it."""

    folder: str
    sha256: str
    trusted_at: float


def project_config_path(folder: Path) -> Path:
    return folder / ".mibyan" / "config.yaml"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def folder_key(folder: Path) -> str:
    """How a folder is recorded: absolute, symlinks resolved, so two spellings are one record."""
    return str(folder.expanduser().resolve())


def load_records(home: Path) -> dict[str, TrustRecord]:
    """The trusted folders recorded in the home (none when there is no trust file yet)."""
    path = home / TRUST_FILE
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path}: unreadable trust records ({exc}); remove the file to start over"
        ) from None
    folders = raw.get("folders") if isinstance(raw, dict) else None
    if not isinstance(folders, dict):
        raise ConfigError(f"{path}: malformed trust records; remove the file to start over")
    records = {}
    for folder, entry in folders.items():
        if isinstance(entry, dict) and isinstance(entry.get("sha256"), str):
            records[folder] = TrustRecord(folder, entry["sha256"], float(entry.get("trusted_at") or 0))
    return records


def save_records(home: Path, records: Mapping[str, TrustRecord]) -> None:
    folders = {r.folder: {"sha256": r.sha256, "trusted_at": r.trusted_at} for r in records.values()}
    data = json.dumps({"version": 1, "folders": folders}, indent=2, sort_keys=True) + "\n"
    write_private(home / TRUST_FILE, data.encode())


def trust_folder(home: Path, folder: Path, data: bytes) -> TrustRecord:
    """Record `folder` as trusted with `data`, its config file as the caller read and checked it."""
    records = load_records(home)
    record = TrustRecord(folder_key(folder), digest(data), time.time())
    records[record.folder] = record
    save_records(home, records)
    return record


def forget_folder(home: Path, folder: Path) -> bool:
    """Stop trusting `folder`; False when it was not trusted."""
    records = load_records(home)
    if records.pop(folder_key(folder), None) is None:
        return False
    save_records(home, records)
    return True


def trust_state(home: Path, folder: Path, data: bytes) -> TrustState:
    """Whether the config file of `folder`, whose content is `data`, is the one the user trusted."""
    record = load_records(home).get(folder_key(folder))
    if record is None:
        return "untrusted"
    return "trusted" if record.sha256 == digest(data) else "changed"


def folder_trusted(home: Path, folder: Path) -> bool:
    """Whether the user trusts `folder` (`mibyan trust`) with its config file as it is now."""
    try:
        data = project_config_path(folder).read_bytes()
        return trust_state(home, folder, data) == "trusted"
    except (OSError, ConfigError):
        return False


def split_untrusted(
    layer: Mapping[str, Any], known_providers: Collection[str]
) -> tuple[dict[str, Any], list[str]]:
    """Split an untrusted project layer into what applies anyway and the keys that need trust.

    Args:
        layer: the project's config file, parsed.
        known_providers: the providers the trusted layers define; the project may pick among them
            (model.provider, fallbacks, side tasks) but may not bring its own.

    Returns:
        The layer without the keys that need trust, and those keys as dotted paths, in file order.
    """
    kept: dict[str, Any] = {}
    ignored: list[str] = []
    for section, value in layer.items():
        opener = _SECTIONS.get(section)
        if opener is None:
            ignored.append(section)
        elif not isinstance(value, Mapping | list):
            kept[section] = value  # not a section at all: validation reports it, naming the file
        else:
            kept_value = opener(section, value, known_providers, ignored)
            if kept_value is not None:
                kept[section] = kept_value
    return kept, ignored


def _open_keys(section: str, value: Any, known: Collection[str], ignored: list[str]) -> Any:
    if not isinstance(value, Mapping):
        return value
    allowed = _OPEN_KEYS[section]
    ignored.extend(f"{section}.{k}" for k in value if allowed is not None and k not in allowed)
    return {k: v for k, v in value.items() if allowed is None or k in allowed}


def _names_known(entry: Any, known: Collection[str]) -> bool:
    """A `{provider, model}` reference to a provider the trusted layers define, and nothing more."""
    return (
        isinstance(entry, Mapping) and set(entry) <= {"provider", "model"} and entry.get("provider") in known
    )


def _known_references(section: str, value: Any, known: Collection[str], ignored: list[str]) -> Any:
    """A list of fallbacks: taken whole when every entry names a known provider, else ignored whole."""
    if isinstance(value, list) and all(_names_known(entry, known) for entry in value):
        return value
    ignored.append(section)
    return None


def _pick_known(
    entry: Mapping[str, Any], where: str, known: Collection[str], ignored: list[str]
) -> dict[str, Any]:
    kept = dict(entry)
    if kept.get("provider") is not None and kept["provider"] not in known:
        del kept["provider"]
        ignored.append(f"{where}.provider")
    return kept


def _open_model(section: str, value: Any, known: Collection[str], ignored: list[str]) -> Any:
    return _pick_known(value, section, known, ignored) if isinstance(value, Mapping) else value


def _open_providers(section: str, value: Any, known: Collection[str], ignored: list[str]) -> Any:
    if not isinstance(value, Mapping):
        return value
    kept: dict[str, Any] = {}
    for name, entry in value.items():
        if not isinstance(entry, Mapping):
            ignored.append(f"providers.{name}")
            continue
        kept[name] = {k: v for k, v in entry.items() if k in _OPEN_PROVIDER_KEYS}
        ignored.extend(f"providers.{name}.{k}" for k in entry if k not in _OPEN_PROVIDER_KEYS)
    return kept


def _open_skills(section: str, value: Any, known: Collection[str], ignored: list[str]) -> Any:
    if not isinstance(value, Mapping):
        return value
    kept = dict(value)
    embedding = kept.get("embedding")
    if embedding is not None and not _names_known(embedding, known):
        del kept["embedding"]
        ignored.append("skills.embedding")
    return kept


def _open_auxiliary(section: str, value: Any, known: Collection[str], ignored: list[str]) -> Any:
    if not isinstance(value, Mapping):
        return value
    kept: dict[str, Any] = {}
    for task, entry in value.items():
        where = f"auxiliary.{task}"
        if not isinstance(entry, Mapping):
            kept[task] = entry  # validation reports it
            continue
        ignored.extend(f"{where}.{k}" for k in entry if k not in ("provider", "model", "fallback"))
        kept[task] = _pick_known(
            {k: v for k, v in entry.items() if k in ("provider", "model")}, where, known, ignored
        )
        if "fallback" in entry:
            fallback = _known_references(f"{where}.fallback", entry["fallback"], known, ignored)
            if fallback is not None:
                kept[task]["fallback"] = fallback
    return kept


_Opener = Callable[[str, Any, Collection[str], list[str]], Any]
_SECTIONS: dict[str, _Opener] = {
    "agent": _open_keys,
    "compression": _open_keys,
    "delegation": _open_keys,
    "model": _open_model,
    "providers": _open_providers,
    "skills": _open_skills,
    "auxiliary": _open_auxiliary,
    "fallback_providers": _known_references,
}


def untrusted_notice(path: Path, folder: str, state: TrustState, ignored: list[str]) -> str:
    """The one line that says what was ignored and how to have it applied."""
    why = "changed since you trusted it" if state == "changed" else "untrusted"
    names = [visible(str(key)) for key in ignored[:_NAMED_AT_MOST]]
    if len(ignored) > _NAMED_AT_MOST:
        names.append(f"and {len(ignored) - _NAMED_AT_MOST} more")
    return (
        f"ignored in {visible(str(path))} ({why}): {', '.join(names)}"
        f" — run 'mibyan trust {shlex.quote(visible(folder))}' to use them"
    )
