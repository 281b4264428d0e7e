"""PII redaction in the training text: e-mail addresses, IP addresses, phone numbers, payment card
numbers, IBANs and secrets are replaced by a typed placeholder (``<EMAIL>``, ``<IP_ADDRESS>``,
``<PHONE>``, ``<CARD_NUMBER>``, ``<IBAN>``, ``<SECRET>``), never removed with their document, and
counted per kind and per document (cleaned_text columns ``pii_<kind>``).

The rules, each chosen to keep false positives low on technical text (docs/guides/filtering.md has
the measurement on the kernel docs):

* ``email``: datatrove 0.10.1 PIIFormatter's address pattern (RFC 5322 local part, dotted domain),
  widened to internationalized addresses (RFC 6530/6531: Unicode letters in the local part and the
  domain labels, ``bestellung@käserei-zürich.ch``) and to the fullwidth and small commercial at
  (U+FF20 ``＠``, U+FE6B), which web pages use to dodge harvesters. Not an address: one at the names
  reserved for examples (RFC 2606 / RFC 6761: example.com, .org, .net, and any name under .example,
  .test, .invalid, .localhost), one whose top-level label has no letter (``lodash@4.17.21``, an npm
  version spec) or is a file extension (``icon@2x.png``), and ``user@host:path``, an SSH/scp remote
  (``git@gitlab.com:team/infra.git``).
* ``ipv4``: four decimal octets 0-255 written without leading zeros, not inside a longer dotted or
  alphanumeric run (so ``1.2.3.4.5``, ``v1.2.3.4`` and ``2.6.18.1-rc2`` are no address), not a pinned
  version (after ``==``, ``>=``, ``<=``, ``~=``, ``!=`` or ``@``: ``requests==2.31.0.1``), not a
  section, release, firmware or OID number (after "section", "chapter", "table", "version", "release",
  "firmware", "build", "driver", "package", "attribute", "OID", "arc", "kernel", "Linux", "as of",
  "v", "§" or "~", also with "to"/"from" between: "firmware to 3.10.2.7"; or with "OID", "X.509",
  "ASN.1", "SNMP" or "MIB" in the 60 characters after it: X.509's ``2.5.4.3``), not a heading number
  (at the start of a line, every part under 100, before a capitalized word: "2.1.1.2 Timestamp
  types"; or the first thing of a Markdown heading: "## 4.2.1.3 (2024-01-02)"; a capitalized word
  elsewhere, as in ``Remote-Addr: 91.198.174.192 Status: 403``, is no heading), not a version in a Markdown table row (a row holding "stable", "beta", "LTS",
  "deprecated", ... or a table whose header names a version or release), not a network (last octet
  0), and only a globally routable address (Python's ``ipaddress.is_global``, as datatrove's
  ``only_remove_public_ips`` default): private, loopback, multicast-free documentation ranges
  (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24) are kept.
* ``ipv6``: a valid address (``ipaddress``) in global unicast (2000::/3) that ``is_global`` calls
  global; link-local, unique-local and 2001:db8::/32 (documentation) are kept.
* ``phone``: an international number (``+``, a country code, then at least two groups split by
  spaces, dots or hyphens: 8 to 15 digits, E.164's maximum; or E.164 without separators,
  ``+447911123456``: 10 to 15 digits, so that a signed count such as ``+12345678`` is none) or a North
  American one written ``(555) 123-4567``, ``555-123-4567`` / ``555.123.4567`` (one separator
  throughout) or ``212 555 7788`` (spaces: only with a valid NANP area code and exchange, both
  [2-9]XX, not inside a longer row of numbers, and after a phone word such as "phone", "call",
  "tel", "mobile" in the 40 characters before: Presidio's PhoneRecognizer context words), each optionally after the country code ``1``
  (``1-646-555-9012``); a bare run of digits is never a phone number, nor one inside a longer dotted
  or hyphenated number (dates, versions, ranges).
* ``card``: 13 to 19 digits in one run, or grouped as cards print them (4-4-4-4, 4-4-4-4-3, 4-6-5,
  4-6-4) with one kind of separator (space or hyphen), with an issuer prefix
  (Visa 4, Mastercard 51-55 and 2221-2720, American Express 34/37, Discover 6011/644-649/65, JCB
  3528-3589, Diners 300-305/36/38, UnionPay 62) and a valid Luhn check digit (ISO/IEC 7812-1).
* ``iban``: a country code, two check digits and the account, optionally in groups of four, whose
  length is the country's (SWIFT IBAN registry) and whose mod-97 check is 1 (ISO 13616).
* ``secret``: AWS access key ids (AKIA/ASIA... + 16 characters), an AWS secret key after
  ``aws_secret_access_key``, GitHub tokens (ghp_/gho_/ghu_/ghs_/ghr_ + 36, github_pat_), Slack tokens
  (xoxb-/xoxp-/xoxa-/xoxr-/xoxs-) and webhooks, and PEM/OpenSSH/PGP private-key blocks from BEGIN to END.

Invisible format characters (soft hyphen, zero-width space, ZWJ/ZWNJ, word joiner, BOM) inside a
match hide nothing: every kind is matched on the text without them (``hr.desk@\u200bacme-corp.com``
is an address), and the replacement covers the characters between.

Hex hashes (git commit ids, kernel addresses) are none of these: they hold letters a-f, which no
numeric rule accepts, and no key prefix. Kinds are applied in the order above reversed (secrets
first, so that a key block is one replacement), on the text of kept documents after the quality
rules: the rules' decisions never depend on the PII settings. Documents that cannot hold a match
are found by one vectorized scan per kind (polars); only those run the Python patterns.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import polars as pl


@dataclass(frozen=True)
class Kind:
    """One rule of a kind of PII (a kind may have several, e.g. ``secret``): its ``placeholder``;
    ``pattern`` (Python ``re``) finds candidates, ``group`` is the part replaced; ``valid(that text)``
    returns how many of its leading characters are the PII (0: none; True: all), so that a match
    that ran on into the next word keeps the word; ``scan`` (a polars, i.e. Rust, regex) matches every
    document that can hold one."""

    name: str
    placeholder: str
    pattern: re.Pattern
    scan: str
    valid: Callable[[str], int | bool] | None = None
    group: int = 0
    context: Callable[[str, int, int], bool] | None = None  # (text, start, end) -> whether the match is PII there


# ------------------------------------------------------------------------------------------------ validators

_RESERVED_DOMAINS = ("example.com", "example.org", "example.net")
_RESERVED_TLDS = ("example", "test", "invalid", "localhost")


# file extensions that are no top-level domain: "icon@2x.png" names an image
_FILE_TLDS = frozenset(
    "png jpg jpeg gif svg webp ico bmp tif tiff css js mjs json yaml yml txt html htm xml csv cpp hpp java lock toml".split()
)


def _email_ok(address: str) -> bool:
    domain = re.split("[@\uff20\ufe6b]", address)[-1].lower().rstrip(".")
    tld = domain.rsplit(".", 1)[-1]
    return not (
        domain in _RESERVED_DOMAINS
        or domain.endswith(tuple("." + d for d in _RESERVED_DOMAINS))
        or tld in _RESERVED_TLDS
        or tld in _FILE_TLDS
        or not any(c.isalpha() for c in tld)
    )


def _email_context(text: str, start: int, end: int) -> bool:
    """False for ``user@host:path``, an SSH or scp remote (a ``:`` and a path character right after)."""
    return not _REMOTE_PATH.match(text, end)


_REMOTE_PATH = re.compile(r":[\w~/.\-]")


def _global_ipv4(address: str) -> bool:
    try:
        return ipaddress.IPv4Address(address).is_global and not address.endswith(".0")
    except ValueError:
        return False


def _global_ipv6(address: str) -> bool:
    try:
        ip = ipaddress.IPv6Address(address)
    except ValueError:
        return False
    return ip in _GLOBAL_UNICAST and ip.is_global


_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")


def luhn(digits: str) -> bool:
    """The Luhn check (ISO/IEC 7812-1) of a string of digits."""
    total = 0
    for i, c in enumerate(reversed(digits)):
        d = ord(c) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


_CARD_PREFIX = re.compile(
    r"4|5[1-5]|2(?:22[1-9]|2[3-9]\d|[3-6]\d\d|7[01]\d|720)|3[47]|6(?:011|4[4-9]|5)|35(?:2[89]|[3-8]\d)"
    r"|3(?:0[0-5]|[68])|62"
)


def _card_ok(text: str) -> bool:
    digits = re.sub(r"[ \-]", "", text)
    seps = set(re.findall(r"[ \-]", text))
    return 13 <= len(digits) <= 19 and len(seps) <= 1 and bool(_CARD_PREFIX.match(digits)) and luhn(digits)


# SWIFT IBAN registry: characters per country
IBAN_LENGTHS = {
    "AD": 24,
    "AE": 23,
    "AL": 28,
    "AT": 20,
    "AZ": 28,
    "BA": 20,
    "BE": 16,
    "BG": 22,
    "BH": 22,
    "BR": 29,
    "BY": 28,
    "CH": 21,
    "CR": 22,
    "CY": 28,
    "CZ": 24,
    "DE": 22,
    "DK": 18,
    "DO": 28,
    "EE": 20,
    "EG": 29,
    "ES": 24,
    "FI": 18,
    "FO": 18,
    "FR": 27,
    "GB": 22,
    "GE": 22,
    "GI": 23,
    "GL": 18,
    "GR": 27,
    "GT": 28,
    "HR": 21,
    "HU": 28,
    "IE": 22,
    "IL": 23,
    "IQ": 23,
    "IS": 26,
    "IT": 27,
    "JO": 30,
    "KW": 30,
    "KZ": 20,
    "LB": 28,
    "LC": 32,
    "LI": 21,
    "LT": 20,
    "LU": 20,
    "LV": 21,
    "MC": 27,
    "MD": 24,
    "ME": 22,
    "MK": 19,
    "MR": 27,
    "MT": 31,
    "MU": 30,
    "NL": 18,
    "NO": 15,
    "PK": 24,
    "PL": 28,
    "PS": 29,
    "PT": 25,
    "QA": 29,
    "RO": 24,
    "RS": 22,
    "SA": 24,
    "SC": 31,
    "SE": 24,
    "SI": 19,
    "SK": 24,
    "SM": 27,
    "ST": 25,
    "SV": 28,
    "TL": 23,
    "TN": 24,
    "TR": 26,
    "UA": 29,
    "VA": 22,
    "VG": 24,
    "XK": 20,
}


def iban_ok(text: str) -> bool:
    """Country length (IBAN_LENGTHS) and the ISO 13616 mod-97 check of an IBAN (spaces allowed)."""
    s = text.replace(" ", "")
    if IBAN_LENGTHS.get(s[:2]) != len(s):
        return False
    moved = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _iban_prefix(text: str) -> int:
    """Characters of ``text`` (an IBAN candidate, maybe run on into the next group) that are a valid
    IBAN of its country's length, or 0."""
    want = IBAN_LENGTHS.get(text[:2])
    if want is None:
        return 0
    seen = 0
    for i, c in enumerate(text):
        seen += c != " "
        if seen == want:
            return i + 1 if iban_ok(text[: i + 1]) else 0
    return 0


def _address_context(text: str, start: int, end: int) -> bool:
    """False for a dotted quad that numbers a section, a release, an OID, a heading or a version in a
    table (the ``ipv4`` rule of the module's docstring)."""
    if _NUMBER_WORDS.search(text, max(0, start - 40), start) or _OID_AFTER.search(text, end, end + 60):
        return False
    line_start = text.rfind("\n", 0, start) + 1
    before = text[line_start:start]
    if not before.strip(" \t#*") and (
        (_HEADING.match(text, end) and all(len(p) <= 2 for p in text[start:end].split(".")))
        or before.lstrip().startswith("#")  # a Markdown heading: "## 4.2.1.3 (2024-01-02)"
    ):
        return False
    return not _table_version(text, line_start)


def _table_version(text: str, line_start: int) -> bool:
    """Whether the line at ``line_start`` is a Markdown table row that holds a release-status word, or
    whose table's header row names a version or release."""
    if not text.startswith("|", line_start):
        return False
    end = text.find("\n", line_start)
    if _RELEASE_WORDS.search(text, line_start, len(text) if end < 0 else end):
        return True
    header = line_start
    while header > 0:  # the first row of the table
        prev = text.rfind("\n", 0, header - 1) + 1
        if not text.startswith("|", prev):
            break
        header = prev
    end = text.find("\n", header)
    return bool(_VERSION_HEADER.search(text, header, len(text) if end < 0 else end))


_RELEASE_WORDS = re.compile(
    r"(?i)\b(?:stable|beta|alpha|rc\d*|lts|latest|deprecated|eol|end of life|legacy|(?:un)?supported|"
    r"current|released?|nightly|preview)\b"
)
_VERSION_HEADER = re.compile(r"(?i)\b(?:versions?|releases?|firmware|builds?|tags?)\b")
_OID_AFTER = re.compile(r"\b(?:OID|X\.509|ASN\.1|SNMP|MIB|object identifier)\b")


def _phone_ok(text: str) -> bool:
    if re.fullmatch(
        r"\+\d{1,3}(?:\.\d{1,3}){3}", text
    ):  # +192.168.1.1: an address with a sign (bonding's arp_ip_target)
        return False
    digits = sum(c.isdigit() for c in text)
    if not text.startswith("+"):
        return 10 <= digits <= 15
    if text[1:].isdigit():  # E.164 without separators
        return 10 <= digits <= 15
    return 8 <= digits <= 15


_NANP = re.compile(r"(?:1[ .\-]?)?\(?([2-9]\d\d)\)?[ .\-]?([2-9]\d\d)")


def _us_phone_ok(text: str) -> bool:
    """A North American number written with spaces only must have a valid NANP area code and exchange."""
    if "-" in text or "." in text or "(" in text or text.startswith("+"):
        return _phone_ok(text)
    m = _NANP.match(text)
    return bool(m) and _phone_ok(text)


def _phone_context(text: str, start: int, end: int) -> bool:
    """A number written with spaces only (``212 555 7788``, three numbers to a table) is a phone number
    only after a phone word (:data:`_PHONE_WORDS`) in the 40 characters before it."""
    if re.search(r"[^\d ]", text[start:end]):
        return True
    return bool(_PHONE_WORDS.search(text, max(0, start - 40), start))


# Presidio's PhoneRecognizer context words, and the abbreviations and verbs of contact lines
_PHONE_WORDS = re.compile(
    r"(?i)\b(?:phones?|numbers?|telephones?|tel|cell|cellphone|mobile|call|fax|dial|whatsapp|sms|contact|ring)\b"
)


# ------------------------------------------------------------------------------------------------ kinds

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
# a dotted quad after one of these words (a few characters of punctuation between, or another such number
# and "and"/"or"/"to": "sections 4.4.6.4 and 8.12.1.4") numbers a section or a release; one before a
# capitalized word ("2.1.1.2 Timestamp types") numbers a heading; one after "~" ends a range of versions
_NUMBER_WORDS = re.compile(
    r"(?i)(?:\b(?:sections?|chapters?|clauses?|tables?|figures?|versions?|releases?|revisions?|rev|"
    r"firmware|builds?|drivers?|packages?|attributes?|oids?|arcs?|kernel|linux|manual|spec\w*|as of|v)|§)"
    r"(?:\s+(?:to|from))?(?:[\s\"'(:,#-]{0,12}|\s+\d+(?:\.\d+)+,?\s+(?:and|or|to)\s+)$|~\s*$"
)
_HEADING = re.compile(r"[ \t]+[A-Z][a-z]")
_AWS_IDS = "AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|APKA"

KINDS: tuple[Kind, ...] = (
    Kind(
        "secret",
        "<SECRET>",
        re.compile(
            r"-----BEGIN ((?:RSA |DSA |EC |OPENSSH |ENCRYPTED |PGP )?PRIVATE KEY(?: BLOCK)?)-----.*?-----END \1-----",
            re.S,
        ),
        r"-----BEGIN [A-Z ]*PRIVATE KEY",
    ),
    Kind("secret", "<SECRET>", re.compile(rf"\b(?:{_AWS_IDS})[A-Z0-9]{{16}}\b"), _AWS_IDS),
    Kind(
        "secret",
        "<SECRET>",
        re.compile(r"(?i:aws_?secret_?access_?key)[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])"),
        r"(?i)aws_?secret_?access_?key",
        group=1,
    ),
    Kind(
        "secret",
        "<SECRET>",
        re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36}\b|\bgithub_pat_[A-Za-z0-9_]{82}\b"),
        r"gh[pousr]_|github_pat_",
    ),
    Kind(
        "secret",
        "<SECRET>",
        re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}|https://hooks\.slack\.com/services/[A-Za-z0-9_/]+"),
        r"xox[abprs]-|hooks\.slack\.com",
    ),
    Kind(
        "email",
        "<EMAIL>",
        re.compile(  # datatrove 0.10.1 PIIFormatter's, without '/' in the local part, with Unicode and the fullwidth at
            r"(?<![\w.!#$%&'*+=?^`{|}~-])[\w!#$%&'*+=?^`{|}~-]+(?:\.[\w!#$%&'*+=?^`{|}~-]+)*[@\uff20\ufe6b]"
            r"(?:(?:[^\W_](?:[\w-]*[^\W_])?\.)+[^\W_](?:[\w-]*[^\W_])?|\[(?:(?:25[0-5]|2[0-4][0-9]|"
            r"[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?|[A-Za-z0-9-]*[A-Za-z0-9]:)])"
        ),
        r"[@\x{FF20}\x{FE6B}](?:\w[\w-]*\.|\[)",
        _email_ok,
        context=_email_context,
    ),
    Kind(
        "iban",
        "<IBAN>",
        re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b"),
        r"[A-Z]{2}\d{2} ?[A-Z0-9]{4}",
        _iban_prefix,
    ),
    Kind(
        "card",
        "<CARD_NUMBER>",
        re.compile(
            r"(?<![\w.\-+])(?:\d{13,19}|\d{4}( |-)\d{4}\1\d{4}\1\d{4}(?:\1\d{3})?|\d{4}( |-)\d{6}\2\d{4,5})(?!\w|[.\-]\d)"
        ),
        r"\d{4}[ \-]?\d{4}[ \-]?\d{4}[ \-]?\d|\d{4}[ \-]\d{6}[ \-]\d{4}",
        _card_ok,
    ),
    Kind(
        "phone",
        "<PHONE>",
        re.compile(
            r"(?<![\w+.\-])\+[1-9]\d{0,2}(?:[ .\-]\(?\d{1,10}\)?){2,5}(?!\w|[.\-]\d)"
            r"|(?<![\w+.\-])\+[1-9]\d{9,14}(?!\w|[.\-]\d)"
            r"|(?<![\w.\-(])(?<!\d )(?:1[ .\-]?)?(?:\(\d{3}\) ?\d{3}-\d{4}|\d{3}([-.])\d{3}\1\d{4}|\d{3} \d{3} \d{4})"
            r"(?!\w|[.\-]\d| \d)"
        ),
        r"\+[1-9]\d{0,2}[ .\-]\(?\d|\+[1-9]\d{9}|\d{3}[-. ]\d{3}[-. ]\d{4}|\(\d{3}\) ?\d{3}-\d{4}",
        _us_phone_ok,
        context=_phone_context,
    ),
    Kind(
        "ipv6",
        "<IP_ADDRESS>",
        re.compile(
            r"(?<![\w:.])[23][0-9A-Fa-f]{3}(?::[0-9A-Fa-f]{0,4}){2,7}(?:(?<=:)(?:\d{1,3}\.){3}\d{1,3})?(?![\w:]|\.\d)"
        ),
        r"[23][0-9A-Fa-f]{3}:[0-9A-Fa-f]{0,4}:",
        _global_ipv6,
    ),
    Kind(
        "ipv4",
        "<IP_ADDRESS>",
        re.compile(rf"(?<![\w.+@])(?<![=<>~!^]=){_OCTET}(?:\.{_OCTET}){{3}}(?!\w|\.[\w*])"),
        r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}",
        _global_ipv4,
        context=_address_context,
    ),
)
NAMES = tuple(dict.fromkeys(k.name for k in KINDS))


def columns(kinds) -> list[str]:
    """The per-document count columns of ``kinds``: ``pii_<kind>`` (UInt32), in :data:`KINDS` order."""
    return [f"pii_{k}" for k in NAMES if k in set(kinds)]


def check_kinds(kinds) -> None:
    """Raise ValueError naming every entry of ``kinds`` that is no kind of :data:`KINDS`."""
    bad = [k for k in kinds if k not in NAMES]
    if bad:
        raise ValueError(f"pii_kinds: {', '.join(map(repr, bad))} not among {', '.join(NAMES)}")


_HIDDEN = "\u00ad\u200b\u200c\u200d\u2060\ufeff"  # format characters that hide nothing in a match
_HIDDEN_RE = re.compile(f"[{_HIDDEN}]")
_HIDDEN_SCAN = "[\u00ad\u200b\u200c\u200d\u2060\ufeff]"


def _redact_one(kind: Kind, text: str) -> tuple[str, int]:
    view, where = text, None
    if _HIDDEN_RE.search(text):  # match on the text without them; map the spans back
        where = [i for i, c in enumerate(text) if c not in _HIDDEN]
        view = "".join(text[i] for i in where)
    out, last, n = [], 0, 0
    for m in kind.pattern.finditer(view):
        s, e = m.span(kind.group)
        if kind.context is not None and not kind.context(view, s, e):
            continue
        if kind.valid is not None:
            ok = kind.valid(view[s:e])
            if not ok:
                continue
            if ok is not True:
                e = s + ok
        if where is not None:
            s, e = where[s], where[e - 1] + 1
        out += [text[last:s], kind.placeholder]
        last, n = e, n + 1
    if not n:
        return text, 0
    out.append(text[last:])
    return "".join(out), n


def redact(texts: pl.Series, kinds=NAMES) -> tuple[pl.Series, pl.DataFrame]:
    """Replace every PII match of ``kinds`` in a Utf8 Series of N texts.

    Returns the redacted texts (Utf8, N) and a frame of N rows with one UInt32 column per kind,
    ``pii_<kind>`` (:func:`columns`): the replacements made in each text. Raises ValueError for an
    unknown kind."""
    check_kinds(kinds)
    texts = texts.cast(pl.Utf8).clone()
    counts = {c: np.zeros(len(texts), dtype=np.uint32) for c in columns(kinds)}
    for kind in KINDS:
        if kind.name not in set(kinds):
            continue
        hit = texts.str.replace_all(_HIDDEN_SCAN, "").str.contains(kind.scan).fill_null(False)
        if hit.any():
            rows = hit.arg_true()
            done = [_redact_one(kind, t) for t in texts.filter(hit).to_list()]
            counts[f"pii_{kind.name}"][rows.to_numpy()] += np.array([c for _, c in done], dtype=np.uint32)
            texts = texts.scatter(rows, pl.Series([t for t, _ in done], dtype=pl.Utf8))
    return texts, pl.DataFrame(
        {c: pl.Series(v, dtype=pl.UInt32) for c, v in counts.items()}, schema={c: pl.UInt32 for c in counts}
    )
