"""Credentials kept out of every error, log line and report.

A credential can reach a message from several sources: a user name and password in an endpoint
URL (``http://user:secret@host``, which huggingface_hub and requests repeat in their own
errors), a signed URL's query (``X-Amz-Signature=...``, ``token=...``) or a Hugging Face token
(``hf_...``). :func:`redact` replaces each with ``***``; Zephon's exceptions apply it to their
arguments (:class:`zephon.errors.ZephonError`) and its loggers to every record
(:func:`zephon.logs.get_logger`). Cost: one regex pass over a message, a few microseconds;
messages are few. Limits: a credential that looks like none of these (a bare password in a
path) is not recognized.
"""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")
_QUERY = re.compile(r"([?&](?:token|access_token|api_key|apikey|key|password|secret|sig|"
                    r"signature|x-amz-signature|x-amz-credential|x-amz-security-token|"
                    r"x-goog-signature|x-goog-credential)=)[^&\s#\"']+", re.IGNORECASE)
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{16,}")


def redact(text: str) -> str:
    """``text`` with URL user information, secret query values and Hugging Face tokens
    replaced by ``***``."""
    if "://" not in text and "=" not in text and "hf_" not in text:
        return text
    text = _USERINFO.sub(r"\1***@", text)
    text = _QUERY.sub(r"\1***", text)
    return _HF_TOKEN.sub("hf_***", text)
