"""Secret values never leave orch in clear: names that look secret are masked, known values redacted.

Pure functions (no I/O). Used wherever orch writes something a person or a
machine may read: manifests, postmortem bundles, logs, ``--json`` output,
webhooks.

>>> mask_env({"HF_TOKEN": "hf_abc", "NCCL_DEBUG": "INFO"})
{'HF_TOKEN': '***', 'NCCL_DEBUG': 'INFO'}
>>> redact("login with hf_abc failed", ["hf_abc"])
'login with *** failed'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MASK = "***"
"""What a secret value is replaced with."""

SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
"""A name containing one of these (any case) holds a secret."""
SECRET_PARTS = ("PASS", "PWD", "DSN", "AUTH", "COOKIE")
"""A name one of whose ``_``-separated parts is one of these holds a secret (``DB_PASS``,
``REDIS_PWD``, ``SENTRY_DSN``, ``HTTP_AUTH``): whole parts only, so ``PWD`` (the working
directory) and ``BYPASS_CACHE`` stay readable."""

_MIN_SECRET_LEN = 4
"""Shorter values are not redacted from free text: masking "1" would shred every log line."""


def is_secret_name(name: str) -> bool:
    """Whether an environment variable (or setting) called ``name`` holds a secret.

    >>> [is_secret_name(n) for n in ("HF_TOKEN", "wandb_api_key", "DB_Password", "PATH")]
    [True, True, True, False]
    >>> is_secret_name("AWS_CREDENTIALS"), is_secret_name("MONKEY_MODE")
    (True, True)

    ``MONKEY_MODE`` contains ``KEY``: masking a harmless value is the cheap mistake.

    >>> [is_secret_name(n) for n in ("DB_PASS", "SMTP_PASSWD", "DATABASE_DSN", "GCP_CREDENTIALS")]
    [True, True, True, True]
    >>> is_secret_name("PWD"), is_secret_name("BYPASS_CACHE"), is_secret_name("MYSQL_PWD")
    (False, False, True)
    """
    upper = name.upper()
    if any(word in upper for word in SECRET_WORDS):
        return True
    parts = upper.split("_")
    return len(parts) > 1 and any(p in SECRET_PARTS for p in parts)


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with the value of every secret-looking name replaced by ``***``.

    >>> mask_env({"API_KEY": "", "USER": "root"})
    {'API_KEY': '***', 'USER': 'root'}
    """
    return {k: (MASK if is_secret_name(k) else v) for k, v in env.items()}


def mask_argv(argv: Sequence[str]) -> list[str]:
    """A command line with the value of every secret-looking option or assignment masked:
    ``--hf-token=X``, ``--password X`` and ``API_KEY=X`` (a name :func:`is_secret_name` calls
    secret, dashes read as underscores).

    >>> mask_argv(["python", "train.py", "--hf-token=hf_abc", "--password", "pw1", "--lr", "3e-4"])
    ['python', 'train.py', '--hf-token=***', '--password', '***', '--lr', '3e-4']
    >>> mask_argv(["env", "WANDB_API_KEY=k1", "--keyed"])
    ['env', 'WANDB_API_KEY=***', '--keyed']
    """
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("-"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        name, eq, _value = arg.partition("=")
        secret = is_secret_name(name.lstrip("-").replace("-", "_"))
        if eq and secret and (name.startswith("-") or name.isidentifier()):
            out.append(f"{name}={MASK}")
            continue
        hide_next = arg.startswith("-") and not eq and secret
        out.append(arg)
    return out


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of the secret-looking names in ``env`` (input for :func:`redact`).

    >>> secret_values({"HF_TOKEN": "hf_abc", "USER": "root"})
    ['hf_abc']
    """
    return [v for k, v in env.items() if is_secret_name(k) and v]


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret value replaced by ``***``.

    Longer secrets are replaced first, so one secret that contains another is
    masked whole. Values shorter than 4 characters are left alone (they would
    match everywhere and leak nothing worth hiding).

    >>> redact("token=abcd1234 again abcd1234", ["abcd1234"])
    'token=*** again ***'
    >>> redact("a.b*c and xyz", ["a.b*c", "no"])
    '*** and xyz'
    >>> redact("nothing here", [])
    'nothing here'
    """
    values = sorted({s for s in secrets if len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True)
    if not values:
        return text
    pattern = re.compile("|".join(re.escape(v) for v in values))
    return pattern.sub(MASK, text)


def redact_tree(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` (str, list, tuple, dict, nested; JSON-like) with every string :func:`redact`-ed;
    tuples come back as lists, other values unchanged.

    >>> redact_tree({"a": ["x hf_abcd y", 3], "b": ("hf_abcd",)}, ["hf_abcd"])
    {'a': ['x *** y', 3], 'b': ['***']}
    """
    values = list(secrets)
    if isinstance(value, str):
        return redact(value, values)
    if isinstance(value, dict):
        return {k: redact_tree(v, values) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(v, values) for v in value]
    return value
