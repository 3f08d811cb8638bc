"""Secret masking: the one place that decides what looks like a key, a token or a password.

Everything mibyan keeps goes through `mask_secrets` first: messages, titles, events and facts before the
session store (and so its search index) sees them, and every line of the log file. The model itself
still gets the text as it was; only what is kept is masked.

Two kinds of pattern. Shapes that are secrets wherever they appear (provider keys, tokens with a known
prefix, JWTs, private key blocks) are cut to their first few characters, so a user can still tell
which key it was. Values given to a name that says "secret" (`password=`, `token: `, `"api_key": "..."`,
`https://user:password@host`, `Authorization: Basic ...`) keep the name and lose the whole value.

A maintained scanner (detect-secrets) was weighed: it is built to scan files line by line with
process-wide settings and ships entropy detectors that would mask hashes and base64 in every tool
output, so this list is kept here instead, each entry documented with the shape it catches.
"""

from __future__ import annotations

import re

MASK = "…[masked]"
_KEEP = 6  # characters of a known-shape key left visible

#: Keys and tokens recognisable by their shape alone, each with a literal it must contain: a pattern runs
#: only on text holding its literal (a substring test costs far less than a regex pass).
_SHAPES = [
    ("sk-", r"\bsk-(?:ant-|proj-|or-|svcacct-|admin-)?[A-Za-z0-9_\-]{16,}"),  # OpenAI, Anthropic, OpenRouter
    ("_", r"\bgh[pousr]_[A-Za-z0-9]{20,}"),  # GitHub tokens
    ("github_pat_", r"\bgithub_pat_[A-Za-z0-9_]{22,}"),  # GitHub fine-grained tokens
    ("glpat-", r"\bglpat-[A-Za-z0-9_\-]{20,}"),  # GitLab
    ("IA", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key ids
    ("xox", r"\bxox[a-z]-[A-Za-z0-9\-]{10,}"),  # Slack
    ("AIza", r"\bAIza[0-9A-Za-z_\-]{35}"),  # Google API keys
    ("k_", r"\b(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]{16,}"),  # Stripe
    ("hf_", r"\bhf_[A-Za-z0-9]{30,}"),  # Hugging Face
    ("eyJ", r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),  # JWTs
    ("earer ", r"(?<=[Bb]earer )[A-Za-z0-9_\-\.=+/]{20,}"),  # Authorization: Bearer ...
    ("PRIVATE KEY", r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
]
_SHAPE_PATTERNS = [(literal, re.compile(pattern)) for literal, pattern in _SHAPES]

# A name is a secret word and what follows it in the name (DB_PASSWORD, api_key_2): the part before the
# word is left as it is, and the part after is bounded, so a long run ("token" repeated, base64) is never
# rescanned from each of its positions.
_WORDS = (
    r"password|passwd|passphrase|secret|token|api[_\-]?key|access[_\-]?key|private[_\-]?key|auth[_\-]?key"
    r"|credential"
)
_NAME = rf"(?:{_WORDS})[A-Za-z0-9_\-]{{0,40}}+"
_NAME_LITERALS = ("pass", "secret", "token", "key", "credential", "authoriz", "://")

#: Values given to a secret-sounding name: the "value" group is masked. They run on the lowered text
#: (a case-insensitive pattern would be several times slower), so they are written in lower case.
_ASSIGNMENTS = [
    # "password": "hunter2" (JSON), password = "hunter2" (code), token: 'abc' (YAML, quoted)
    rf"""(?P<name>{_NAME})["']?\s*[:=]\s*(?P<quote>["'])(?P<value>[^"'\n\\]{{3,}})(?P=quote)""",
    # PASSWORD=hunter2 (env files, shells) and ?token=abc&... (URLs)
    rf"(?P<name>{_NAME})=(?P<value>[^\s\"'&;,#<>\\]{{3,}})",
    # token: abc (YAML, unquoted, the whole rest of the line)
    rf"(?m)^[ \t\-]*(?P<name>[a-z0-9_.\-]{{0,40}}?{_NAME}):[ \t]+(?P<value>[^\s\"'#\\][^\n#\"\\]*?)[ \t]*$",
    # ... token: abc123 ... (in the middle of a line, unquoted): one word, holding a digit or a sign and
    # not a web address, so that prose ("the token: it expires", "a token: https://...") keeps its words
    rf"(?P<name>{_NAME}):[ \t]+(?P<value>(?!https?://)(?=[^\s\"'`#\\,;()<>]*?[0-9!$%^*+/=@_\-])[^\s\"'`#\\,;()<>]{{6,}}+)",
    # Authorization: Basic dXNlcjpw... / Authorization: token abc... (any scheme but Bearer's, a shape)
    r"(?P<name>authorization)[\"']?\s*[:=]\s*[\"']?(?:basic|token|digest|negotiate|apikey|key)[ \t]+"
    r"(?P<value>[a-z0-9_\-.=+/:~]{4,}+)",
    # https://user:password@host
    r"(?P<name>(?<![a-z0-9+.\-])[a-z][a-z0-9+.\-]*+://[^/\s:@\"\\]++):(?P<value>[^/\s@\"\\]{3,}+)(?=@)",
]
_ASSIGNMENT_PATTERNS = [re.compile(pattern) for pattern in _ASSIGNMENTS]
_NOT_SECRET_NAMES = re.compile(r"tokens$|token_?(?:count|type|usage|limit)s?$")


def _secret_values(text: str, lowered: str) -> list[tuple[int, int]]:
    """The spans of the values given to secret-sounding names, in order, not overlapping."""
    spans: list[tuple[int, int]] = []
    for pattern in _ASSIGNMENT_PATTERNS:
        for match in pattern.finditer(lowered):
            start, end = match.span("value")
            value = text[start:end]
            if _NOT_SECRET_NAMES.search(match.group("name")) or value.isdigit() or value.startswith(MASK):
                continue  # max_tokens=4096 is a setting, not a secret
            spans.append((start, end))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def mask_secrets(text: str) -> str:
    """Replace anything that looks like a key, a token or a password by a short masked form.

    Masking never removes a backslash or a quote, so text that was valid JSON (a tool call's arguments)
    stays valid JSON.
    """
    for literal, pattern in _SHAPE_PATTERNS:
        if literal in text:
            text = pattern.sub(lambda m: m.group(0)[:_KEEP] + MASK, text)
    lowered = text.lower()
    if len(lowered) != len(text):  # a few characters lower to two: keep offsets aligned
        lowered = "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
    if not any(literal in lowered for literal in _NAME_LITERALS):
        return text  # most text names no secret: the costlier patterns are skipped
    pieces: list[str] = []
    last = 0
    for start, end in _secret_values(text, lowered):
        pieces += [text[last:start], MASK]
        last = end
    pieces.append(text[last:])
    return "".join(pieces)
