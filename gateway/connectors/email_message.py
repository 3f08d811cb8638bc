"""The email connector's mail: what an inbound mail says, and the one reply it gets.

A thread is one conversation: its root is the first Message-ID of References (else In-Reply-To, else the
mail's own), so every mail of a thread lands in the same channel and a new subject starts another.
Mails no person wrote (bounces, auto-replies, lists, our own) are recognised here and never answered:
that, and the reply's own `Auto-Submitted: auto-replied`, is what keeps two robots from a mail loop.
"""

from __future__ import annotations

import email.policy
import email.utils
import hashlib
import json
import re
from dataclasses import asdict, dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from mibyan.config.paths import write_private

_ID = re.compile(r"<([^<>\s]+)>")
_ATTRIBUTION = re.compile(r"^(On .*wrote:|Le .*a écrit\s?:|Am .*schrieb.*:)\s*$", re.IGNORECASE)
_ORIGINAL = re.compile(r"^-{2,}\s*(Original Message|Forwarded message)\s*-{2,}\s*$", re.IGNORECASE)
_OUTLOOK_FROM = re.compile(r"^(From|De|Von):\s.+$")
_ROBOT_SENDERS = ("mailer-daemon", "postmaster", "mail-daemon", "mailerdaemon")
_REFERENCES_KEPT = 20  # a long thread's References: the root and the most recent ids


@dataclass(frozen=True)
class Inbound:
    """What the connector needs of one mail to admit it and, later (after a restart too), answer it.

    Attributes:
        message_id: its Message-ID without the angle brackets.
        root: the thread's root Message-ID (the conversation).
        sender: the From address, lower-cased.
        subject: its Subject.
        references: the References a reply carries: the mail's own, then its Message-ID.
    """

    message_id: str
    root: str
    sender: str
    subject: str
    references: tuple[str, ...]

    def save(self, folder: Path) -> None:
        """Kept before the mail is admitted, so a reply after a restart still knows where it goes."""
        write_private(meta_path(folder, self.message_id), json.dumps(asdict(self)).encode())

    @staticmethod
    def load(folder: Path, message_id: str) -> Inbound | None:
        try:
            data: dict[str, Any] = json.loads(meta_path(folder, message_id).read_text())
            return Inbound(**{**data, "references": tuple(data["references"])})
        except (OSError, ValueError, TypeError, KeyError):
            return None


def meta_path(folder: Path, message_id: str) -> Path:
    return folder / "mail" / f"{hashlib.sha256(message_id.encode()).hexdigest()[:32]}.json"


def parse(raw: bytes) -> EmailMessage:
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    return message


def ids(value: object) -> list[str]:
    """The message ids a header holds, in order, without angle brackets."""
    return _ID.findall(str(value or ""))


def address(value: object) -> str:
    return email.utils.parseaddr(str(value or ""))[1].strip().lower()


def inbound(message: EmailMessage, fallback_id: str) -> Inbound:
    """The mail's thread and reply details (`fallback_id` when it has no Message-ID)."""
    own = next(iter(ids(message["Message-ID"])), fallback_id)
    references = ids(message["References"])
    replied = ids(message["In-Reply-To"])
    root = next(iter(references or replied), own)
    chain = references or replied
    if len(chain) > _REFERENCES_KEPT:
        chain = [chain[0], *chain[-(_REFERENCES_KEPT - 1) :]]
    subject = " ".join(str(message["Subject"] or "").split())
    return Inbound(own, root, address(message["From"]), subject, (*chain, own))


def automatic(message: EmailMessage, own_address: str) -> str | None:
    """Why no person wrote this mail (so it is never answered), or None for a person's mail."""
    sender = address(message["From"])
    if sender == own_address.lower():
        return "it is from the agent's own address"
    auto = str(message["Auto-Submitted"] or "no").strip().lower()
    if auto != "no":
        return f"Auto-Submitted: {auto}"
    precedence = str(message["Precedence"] or "").strip().lower()
    if precedence in ("bulk", "junk", "list", "auto_reply"):
        return f"Precedence: {precedence}"
    for header in ("X-Autoreply", "X-Autorespond", "X-Auto-Response-Suppress", "List-Id"):
        if message[header] is not None:
            return f"{header}: {message[header]}"
    if str(message["Return-Path"] or "").strip() == "<>":
        return "a bounce (empty Return-Path)"
    if sender.split("@", 1)[0] in _ROBOT_SENDERS:
        return f"a bounce (from {sender})"
    if message.get_content_type() == "multipart/report":
        return "a delivery report"
    return None


def body_text(message: EmailMessage) -> str:
    """The new text of the mail: its plain text (else its HTML as text), without the quoted history and
    the signature."""
    part = message.get_body(preferencelist=("plain", "html"))
    if part is None:
        return ""
    try:
        text = str(part.get_content())
    except (LookupError, ValueError):  # an unknown charset: what can be read of it
        payload = part.get_payload(decode=True)
        text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
    if part.get_content_type() == "text/html":
        text = _html_text(text)
    return unquoted(text)


def unquoted(text: str) -> str:
    """The lines a person wrote: quoted lines (`>`), the "On … wrote:" above them, a forwarded or
    top-posted original and the signature (after `-- `) left out."""
    kept: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        stripped = line.rstrip()
        if (stripped == "--" and line.startswith("-- ")) or _ORIGINAL.match(stripped):
            break
        if _OUTLOOK_FROM.match(stripped) and kept and not kept[-1].strip():
            break  # Outlook's top-posted reply: the original follows a "From:" line after a blank one
        if stripped.startswith(">") or _ATTRIBUTION.match(stripped):
            continue
        kept.append(stripped)
    return "\n".join(kept).strip()


def _html_text(html_text: str) -> str:
    import html

    text = re.sub(r"(?is)<(script|style|blockquote)\b.*?</\1>", "", html_text)
    text = re.sub(r"(?i)<br\s*/?>|</p>|</div>|</li>", "\n", text)
    return html.unescape(re.sub(r"<[^>]+>", "", text))


def reply_subject(subject: str) -> str:
    return subject if re.match(r"(?i)^re\s*:", subject) else f"Re: {subject}".rstrip()


def reply(to: Inbound, text: str, *, sender: str, message_id: str, possible_repeat: bool) -> EmailMessage:
    """The one reply to `to`: threaded under it, plain text (the model's Markdown reads as it is)."""
    mail = EmailMessage(policy=email.policy.SMTP)
    mail["From"] = sender
    mail["To"] = to.sender
    mail["Subject"] = reply_subject(to.subject)
    mail["Date"] = email.utils.formatdate(localtime=False)
    mail["Message-ID"] = f"<{message_id}>"
    mail["In-Reply-To"] = f"<{to.message_id}>"
    mail["References"] = " ".join(f"<{i}>" for i in to.references)
    mail["Auto-Submitted"] = "auto-replied"  # RFC 3834: no robot, ours included, answers this mail
    if possible_repeat:  # a crash left its first sending unknown: the same Message-ID, said out loud
        mail["X-Mibyan-Possible-Repeat"] = "yes"
    mail.set_content(text)
    return mail


def attachments(message: EmailMessage) -> list[tuple[str, bytes]]:
    """The files the mail carries (name, content), in order."""
    found = []
    for number, part in enumerate(message.iter_attachments()):
        payload = part.get_payload(decode=True)
        if isinstance(payload, bytes):
            found.append((part.get_filename() or f"attachment-{number}", payload))
    return found
