"""Sites as the Attribution API sees them: the registrable domain ("eTLD+1") of a host.

The reference implementation parses with tldts' ``getDomain`` (the Public Suffix List). araopt
applies the list's default rule ``*`` only: the public suffix is the host's last label, so the site
is its last two labels. That equals tldts for every host whose public suffix has one label (``.com``,
``.example``, ``.test``: all the spec's cases); hosts under multi-label suffixes (``co.uk``,
``github.io``) are taken one label too short. ``localhost`` and its subdomains, IP addresses (any host whose last
label is a number, as the URL parser reads IPv4: ``127.1``, ``0x7f.1``), single labels and malformed
hosts are a ``SyntaxError`` (a ``DOMException`` in the browser). As the URL parser does, a backslash
ends an https URL's authority as ``/`` does (its rule for special schemes), an empty port is dropped, and
a percent-encoded host is decoded (UTF-8) before it is serialised."""
from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote

import idna
import numpy as np
import pandas as pd

from araopt.attribution.errors import ApiError, ErrorName

_LABEL = re.compile(r"^[a-z0-9_\u0080-\U0010ffff][a-z0-9_\u0080-\U0010ffff-]*$")
_NUMBER = re.compile(r"\d+|0x[0-9a-f]*")
"""A label the URL parser reads as an IPv4 number (decimal, octal, ``0x`` hex): a host whose last label is one
is an IPv4 address (``127.1``, ``0x7f.1`` are 127.0.0.1) or invalid (``shop.1``): the WHATWG "ends in a number"
rule."""
_ASCII_SPACE = " \t\n\r\f\v"
_TAB_NEWLINE = str.maketrans("", "", "\t\n\r")


def site_hashes(values: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each value's site (``parse_site``; a value that is no site hashes as itself, marked):
    equal exactly where the values name one site."""
    codes, distinct = pd.factorize(np.asarray(values, dtype=object))
    canonical = []
    for value in distinct.tolist():
        try:
            canonical.append(parse_site(value))
        except ApiError:
            canonical.append(f"\x00{value}")
    hashed = pd.util.hash_array(np.asarray(canonical, dtype=object))
    out: np.ndarray = hashed[codes] if len(codes) else np.empty(0, dtype=np.uint64)
    return out


def parse_site(value: str) -> str:
    """The site of ``value`` (a host or a URL), or ``SyntaxError``."""
    if not isinstance(value, str):
        raise ApiError(ErrorName.TYPE_ERROR, f"a site must be a string, got {value!r}")
    # the URL parser removes ASCII tab and newline anywhere, then trims ASCII white space (UTS #46 refuses other
    # white space, and maps case itself)
    host = value.translate(_TAB_NEWLINE).strip(_ASCII_SPACE)
    if "://" in host:
        host = host.split("://", 1)[1]
    host = re.split(r"[/?#\\]", host, maxsplit=1)[0]  # a backslash ends the authority too (https is special)
    host = host.rsplit("@", 1)[-1]
    name, colon, port = host.partition(":")
    host = name if not colon or port == "" or port.isdigit() else ""  # a port (or none) is dropped; other ':' no host
    if "%" in host:  # the URL parser percent-decodes a host (as UTF-8) before serialising it
        try:
            host = unquote(host, errors="strict")
        except UnicodeDecodeError:
            raise ApiError(ErrorName.SYNTAX_ERROR, f"invalid site {value!r} (its percent-encoding is not UTF-8)") from None
    host = _ascii_host(host, value)
    host = host[:-1] if host.endswith(".") else host
    labels = host.split(".")
    if (not host or len(host) > 253 or len(labels) < 2 or _NUMBER.fullmatch(labels[-1])
            or not all(_LABEL.fullmatch(label) for label in labels)):
        raise ApiError(ErrorName.SYNTAX_ERROR, f"invalid site {value!r}")
    site = ".".join(labels[-2:])
    if site == "localhost" or site.endswith(".localhost") or labels[-1] == "localhost":
        raise ApiError(ErrorName.SYNTAX_ERROR, f"invalid site {value!r}")
    return site


def _ascii_host(host: str, value: str) -> str:
    """The host as the browser's URL parser serialises it (UTS #46 non-transitional processing to ASCII,
    ``idna``): ``bücher.example``, its decomposed or soft-hyphenated spellings, full-width letters and
    ideographic full stops all become ``xn--bcher-kva.example``, so that one site is one privacy unit
    whatever its spelling (each spelling would otherwise get a budget of its own). An ASCII host is
    already serialised (lower case), its ``xn--`` labels checked; a host UTS #46 rejects is no host."""
    try:
        if not host.isascii():  # never str.lower() first: its final-sigma rule maps a capital sigma otherwise
            return str(idna.encode(host, uts46=True, transitional=False).decode("ascii"))
        host = host.lower()
        for label in host.split("."):
            if label.startswith("xn--"):
                idna.decode(label)
    except (idna.IDNAError, UnicodeError) as error:
        raise ApiError(ErrorName.SYNTAX_ERROR, f"invalid site {value!r} ({error})") from None
    return host


def check_site(value: str, what: str) -> str:
    """``value`` itself when it is a site; a ``SyntaxError`` when it is not a host, a ``TypeError``
    when it is a host but not a site (the reference asserts it: callers pass sites here)."""
    site = parse_site(value)
    if site != value:
        raise ApiError(ErrorName.TYPE_ERROR, f"{what} must be a site (registrable domain), got {value!r}")
    return site


def parse_sites(values: Iterable[str], label: str, limit: int | None) -> frozenset[str]:
    """The set of sites of ``values``: a ``RangeError`` when the list (duplicates counted) is longer
    than ``limit``, else a ``SyntaxError`` for the first value that is not a host."""
    items = list(values)
    if limit is not None and len(items) > limit:
        raise ApiError(ErrorName.RANGE_ERROR, f"number of values in {label} exceeds limit of {limit}")
    return frozenset(parse_site(v) for v in items)
