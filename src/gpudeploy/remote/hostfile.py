"""known_hosts files read as OpenSSH reads them (``hostfile.c``, ``match.c`` of OpenSSH 9.2), and
the decision OpenSSH makes from them (``check_key_in_hostkeys``), for the paramiko transport.

paramiko's own reader differs where it matters: it does not know ``@revoked`` (a revoked key was
trusted through another file), it gives up on a whole file at one line it cannot read (one bad
line refused every host, while status, through OpenSSH, skipped it), and it has no
``@cert-authority``. Here, as in OpenSSH:

* A line is ``[@marker] hostpatterns keytype base64 [comment]``; blank lines and ``#`` comments
  are skipped, as are lines that cannot be read (an unknown marker, a truncated line, an unknown
  key type, a broken hash, key data that is not a key of that type). Such lines are returned as
  :class:`Bad` so the caller can say so; they never make the other lines unreadable.
* ``hostpatterns`` is one hashed name (``|1|salt|hmac``: HMAC-SHA1 of the name) or a comma list of
  patterns with ``*`` and ``?``, case-insensitive, where a matching ``!pattern`` rules the line out.
  A name is ``host``, or ``[host]:port`` for a port other than 22, or the HostKeyAlias.
* A presented key is refused when a ``@revoked`` line of its name holds it, in any file; trusted
  when a plain line holds it; else refused: a changed key when a plain line names the host (of
  any key type), else unknown. A host on a port other than 22 that no line names as ``[host]:port``
  is looked up as ``host`` too (sshconnect.c: "checking without port identifier").
  ``@cert-authority`` lines vouch only for host certificates, which gpudeploy's paramiko side
  does not check: a host known only through one is refused, saying so (status, through OpenSSH,
  does check certificates).

No paramiko here (``invoke status`` must not import it): keys are compared as their wire blobs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

CA = "@cert-authority"
REVOKED = "@revoked"
HASH_MAGIC = "|1|"
SHA1_BYTES = 20  # HashKnownHosts: HMAC-SHA1, as OpenSSH defines it (not our choice of hash)

# sshkey.c's key type names a line may give, each with the type its key data must be (a signature
# algorithm names its key's type: rsa-sha2-256 is an ssh-rsa key). Its short names (ED25519, RSA...)
# count too, case-insensitive, for plain keys only. A line of another type is skipped.
CERT_SUFFIX = "-cert-v01@openssh.com"
_PLAIN = {"ssh-ed25519": "ssh-ed25519", "ecdsa-sha2-nistp256": "ecdsa-sha2-nistp256",
          "ecdsa-sha2-nistp384": "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521": "ecdsa-sha2-nistp521",
          "ssh-rsa": "ssh-rsa", "rsa-sha2-256": "ssh-rsa", "rsa-sha2-512": "ssh-rsa", "ssh-dss": "ssh-dss",
          "sk-ecdsa-sha2-nistp256@openssh.com": "sk-ecdsa-sha2-nistp256@openssh.com",
          "webauthn-sk-ecdsa-sha2-nistp256@openssh.com": "sk-ecdsa-sha2-nistp256@openssh.com",
          "sk-ssh-ed25519@openssh.com": "sk-ssh-ed25519@openssh.com"}
_CERTS = {"ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa",
          "rsa-sha2-256", "rsa-sha2-512", "ssh-dss", "sk-ecdsa-sha2-nistp256", "sk-ssh-ed25519"}
_SHORT = {"ed25519": "ssh-ed25519", "ecdsa": "ecdsa-sha2-nistp256", "rsa": "ssh-rsa", "dsa": "ssh-dss",
          "ecdsa-sk": "sk-ecdsa-sha2-nistp256@openssh.com", "ed25519-sk": "sk-ssh-ed25519@openssh.com"}


def key_type(name: str) -> str | None:
    """The type of key a line's key type ``name`` holds (sshkey_type_from_name); None: unknown."""
    if name in _PLAIN:
        return _PLAIN[name]
    if name.endswith(CERT_SUFFIX) and name[: -len(CERT_SUFFIX)] in _CERTS:
        base = name[: -len(CERT_SUFFIX)]
        return ("ssh-rsa" if base.startswith("rsa-sha2-") else base) + CERT_SUFFIX
    return _SHORT.get(name.lower())


@dataclass(frozen=True)
class Entry:
    """One readable line."""

    path: str
    lineno: int
    marker: str  # "", CA or REVOKED
    hosts: str  # the host-pattern field as written
    keytype: str  # the key's type, as its data names it (ssh-rsa for a line of rsa-sha2-256)
    blob: bytes | None  # the key's wire form; None when the key data is not a key (the line is skipped)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"


@dataclass(frozen=True)
class Bad:
    """A line OpenSSH skips: where, and why."""

    path: str
    lineno: int
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.lineno}: {self.why}"


@dataclass(frozen=True)
class Decision:
    trusted: bool
    why: str  # "" when trusted; else "revoked", "changed", "cert-authority" or "unknown"
    entry: Entry | None = None  # the line that decided (the revoked or the differing one)


def _split_field(text: str) -> tuple[str, str]:
    """The first field up to a space or tab, and the rest after its whitespace."""
    for i, c in enumerate(text):
        if c in " \t":
            return text[:i], text[i:].lstrip(" \t")
    return text, ""


def _marker(text: str) -> tuple[str | None, str]:
    """check_markers(): the marker (None: an invalid one) and the text after it."""
    marker = ""
    while text.startswith("@"):
        if marker:
            return None, text  # only one marker is allowed
        # hostfile.c: terminated by the first space, else by the first tab
        end = text.find(" ")
        if end < 0:
            end = text.find("\t")
        if end <= 1 or end >= 32:
            return None, text
        word = text[:end]
        if word not in (CA, REVOKED):
            return None, text
        marker = word
        text = text[end:].lstrip(" \t")
    return marker, text


def _pattern(s: str, pattern: str) -> bool:
    """match_pattern(): ``*`` any run, ``?`` any one character."""
    if not pattern:
        return not s
    if pattern[0] == "*":
        rest = pattern.lstrip("*")
        if not rest:
            return True
        return any(_pattern(s[i:], rest) for i in range(len(s) + 1))
    if not s:
        return False
    if pattern[0] != "?" and pattern[0] != s[0]:
        return False
    return _pattern(s[1:], pattern[1:])


def match_hostname(name: str, patterns: str) -> bool:
    """match_hostname() == 1: a positive pattern matches and no negated one does."""
    name = name.lower()
    positive = False
    for sub in patterns.split(","):
        negated = sub.startswith("!")
        if negated:
            sub = sub[1:]
        if len(sub) >= 1023:  # match.c: a subpattern too long fails the whole list
            return False
        if _pattern(name, sub.lower()):
            if negated:
                return False
            positive = True
    return positive


def _b64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def match_hashed(name: str, field: str) -> bool | None:
    """A ``|1|salt|hmac`` field: does it hash ``name``? None when the field is broken."""
    rest = field[len(HASH_MAGIC):] if field.startswith(HASH_MAGIC) else None
    if rest is None or "|" not in rest:
        return None
    b64salt = rest.split("|", 1)[0]
    salt = _b64(b64salt) if 0 < len(b64salt) <= 1024 else None
    if salt is None or len(salt) != SHA1_BYTES:
        return None
    mac = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return field == HASH_MAGIC + base64.b64encode(salt).decode() + "|" + base64.b64encode(mac).decode()


def matches(name: str, hosts: str) -> bool | None:
    """Does the host field ``hosts`` name ``name``? None: a broken hash. Patterns ignore case, a
    hash does not: ssh lowercases the name it looks up (``lookup_name``), ssh-keygen -F does not."""
    if hosts.startswith("|"):
        return match_hashed(name, hosts)
    return match_hostname(name, hosts)


def _blob_type(blob: bytes) -> str | None:
    """The key type a wire blob begins with (string: uint32 length, then bytes)."""
    if len(blob) < 4:
        return None
    (n,) = struct.unpack(">I", blob[:4])
    if n > len(blob) - 4:
        return None
    try:
        return blob[4:4 + n].decode("ascii")
    except UnicodeDecodeError:
        return None


def parse_line(path: str, lineno: int, raw: str) -> Entry | Bad | None:
    """One line: an Entry, a Bad line, or None (blank or comment)."""
    text = raw.rstrip("\r\n").lstrip(" \t")
    if not text or text.startswith("#"):
        return None
    marker, text = _marker(text)
    if marker is None:
        return Bad(path, lineno, "an unknown or repeated @marker")
    hosts, rest = _split_field(text)
    if not rest or rest.startswith("#"):
        return Bad(path, lineno, "no key type after the host names")
    named, rest = _split_field(rest)
    keytype = key_type(named)
    if keytype is None:
        return Bad(path, lineno, f"unknown key type {named[:40]!r}")
    if not rest or rest.startswith("#"):
        return Bad(path, lineno, "no key after the key type")
    data, _ = _split_field(rest)
    blob = _b64(data)
    if blob is not None and _blob_type(blob) != keytype:
        blob = None  # sshkey_read(): the data must be a key of the type named
    return Entry(path, lineno, marker, hosts, keytype, blob)


_cache: dict[str, tuple[tuple[int, int, int], list[Entry | Bad]]] = {}
_cache_lock = threading.Lock()


def read(path: str) -> list[Entry | Bad]:
    """Every line of ``path`` that is not blank or a comment ([] if there is no such file)."""
    try:
        st = os.stat(path)
        state = (st.st_ino, st.st_size, st.st_mtime_ns)
        with _cache_lock:
            hit = _cache.get(path)
        if hit is not None and hit[0] == state:
            return hit[1]
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [p for i, raw in enumerate(f, 1) if (p := parse_line(path, i, raw)) is not None]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        return [Bad(path, 0, f"cannot be read ({exc.strerror or exc})")]
    with _cache_lock:
        _cache[path] = (state, lines)
    return lines


def lookup_name(host: str, port: int | None, alias: str | None = None) -> str:
    """The name ssh looks a host up by: its HostKeyAlias, else ``host`` or ``[host]:port`` (not 22),
    lowercased as ssh lowercases them (ssh.c; sshconnect.c get_hostfile_hostname_ipaddr)."""
    if alias:
        return alias.lower()
    host = host.lower()
    return host if port in (None, 22) else f"[{host}]:{port}"


def lookup(name: str, files: Sequence[str]) -> tuple[list[Entry], list[Bad]]:
    """The lines of ``files`` that name ``name``, and every line that had to be skipped.

    Matching lines include those whose key data is broken (``blob`` None), as ``ssh-keygen -F``
    lists them; the decision ignores those, as ssh does."""
    found: list[Entry] = []
    bad: list[Bad] = []
    for path in files:
        for line in read(path):
            if isinstance(line, Bad):
                bad.append(line)
                continue
            hit = matches(name, line.hosts)
            if hit is None:
                bad.append(Bad(line.path, line.lineno, "a broken |1| hashed host name"))
            elif hit:
                found.append(line)
                if line.blob is None:
                    bad.append(Bad(line.path, line.lineno, f"the key data is not a {line.keytype} key"))
            elif line.blob is None:
                bad.append(Bad(line.path, line.lineno, f"the key data is not a {line.keytype} key"))
    return found, bad


def decide(entries: Sequence[Entry], keytype: str, blob: bytes) -> Decision:
    """check_key_in_hostkeys() for a plain key: ``revoked`` if a @revoked line holds it; else trusted
    if a plain line holds it; else ``changed`` if any plain line names the host (of any key type, as
    OpenSSH has it); else ``cert-authority`` (only such lines name it) or ``unknown``."""
    usable = [e for e in entries if e.blob is not None]
    for e in usable:
        if e.marker == REVOKED and e.blob == blob:
            return Decision(False, "revoked", e)
    plain = [e for e in usable if e.marker == ""]
    if any(e.blob == blob for e in plain):
        return Decision(True, "")
    if plain:
        same_type = [e for e in plain if e.keytype == keytype]
        return Decision(False, "changed", (same_type or plain)[0])
    ca = [e for e in usable if e.marker == CA]
    return Decision(False, "cert-authority", ca[0]) if ca else Decision(False, "unknown")


def known_types(entries: Sequence[Entry]) -> list[str]:
    """Key types of the plain lines (what to ask the host for first), in file order."""
    out: list[str] = []
    for e in entries:
        if e.marker == "" and e.blob is not None and e.keytype not in out:
            out.append(e.keytype)
    return out
