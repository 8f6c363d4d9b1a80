"""Does an ssh_config ProxyCommand start an ssh client? (issue 43, item 12)

An ssh started by a ProxyCommand dials its hop with the user's own host-key settings, out of
gpudeploy's reach (``jumps``), so such a hop must be written as ProxyJump. Looking at the first word
only let ``env ssh``, ``timeout 10 ssh``, ``sh -c "ssh ..."`` and ``autossh`` through; here the
command is read as the shell that runs it reads it (ssh runs ``exec <command>`` with the user's
shell; POSIX sh syntax is assumed):

* comments are cut, quotes honoured (shlex), and the line is split into simple commands at
  ``;`` ``&`` ``|`` ``&&`` ``||`` ``(`` ``)``; redirections are dropped;
* a simple command's program is its first word after variable assignments and the shell's own
  prefixes (``exec``, ``command``, ``nohup``, ``!``, ``if``...);
* a wrapper (``env``, ``nice``, ``timeout``, ``sudo``, ``xargs``...) runs a later word as its
  program, which one depends on its own options, so every later word counts as a program;
* text that the shell runs as a command line of its own is read the same way, nested: the strings
  of ``sh -c``/``bash -lc`` (every operand), ``eval``'s words, a wrapper's words with spaces in
  them (``su -c "..."``, ``script -c "..."``), and ``$(...)``/backtick substitutions in any word.

Refused: a program that is an ssh client (:data:`SSH_CLIENT`: by name, not every name beginning
with "ssh": ``ssh.example.com`` is a host a wrapped ``nc`` may be given); a program named by an
expansion (``$SSH``, ``$(which ssh)``: which program runs cannot be seen); a line that does not
parse (an unclosed quote) or nests deeper than :data:`MAX_DEPTH`. The arguments of any other
program are its own: ``cloudflared access ssh`` and ``tsh proxy ssh`` relay bytes and pass, as do
``nc``, ``socat`` and ``corkscrew``. A script file's contents are not read.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

MAX_DEPTH = 8  # command lines within command lines (sh -c "sh -c '...'"): deeper is refused
# OpenSSH's ssh (ssh.exe on Windows, ssh2 of old), autossh, sshpass (runs ssh), Dropbear's, PuTTY's
SSH_CLIENT = re.compile(r"(?:auto)?ssh\d*|sshpass|dbclient|plink", re.IGNORECASE)
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "busybox"})
# The shell's own words before a program: skipped, with their options (exec -a NAME takes a value).
PREFIXES = frozenset({"exec", "command", "builtin", "time", "nohup", "!", "{", "if", "then", "else", "elif",
                      "do", "while", "until"})
WITH_VALUE = frozenset({"-a"})  # exec -a NAME
WRAPPERS = frozenset({
    "env", "nice", "ionice", "chrt", "taskset", "numactl", "timeout", "setsid", "stdbuf", "unbuffer", "sudo",
    "doas", "su", "runuser", "sg", "chroot", "unshare", "nsenter", "setpriv", "prlimit", "cgexec", "firejail",
    "flock", "xargs", "watch", "script", "strace", "ltrace", "proxychains", "proxychains4", "torsocks",
    "tsocks", "torify", "faketime", "trickle", "rlwrap", "caffeinate", "systemd-run", "ip",
})
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
OPERATOR_CHARS = frozenset("();<>|&")


class Unreadable(Exception):
    """The command line cannot be read as the shell would read it."""


def _program_name(word: str) -> str:
    name = word.rsplit("/", 1)[-1]
    return name[:-4] if name.lower().endswith(".exe") else name


def is_ssh_client(word: str) -> bool:
    return bool(SSH_CLIENT.fullmatch(_program_name(word)))


def _cut_comment(line: str) -> str:
    """``line`` up to an unquoted ``#`` that begins a word (the shell's comment; mid-word it is text)."""
    quote, escaped, boundary = "", False, True
    for i, c in enumerate(line):
        if escaped:
            escaped, boundary = False, False
            continue
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"':
                escaped = True
            continue
        if c == "\\":
            escaped = True
        elif c in "'\"":
            quote = c
        elif c == "#" and boundary:
            return line[:i]
        boundary = c.isspace() or c in OPERATOR_CHARS
    return line


def _simple_commands(line: str) -> list[list[str]]:
    """The words of each simple command of ``line``, redirections dropped."""
    lexer = shlex.shlex(_cut_comment(line), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        tokens = list(lexer)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise Unreadable(str(exc)) from None
    out: list[list[str]] = [[]]
    redirect = False
    for tok in tokens:
        if tok and set(tok) <= OPERATOR_CHARS:
            if ("<" in tok or ">" in tok) and "(" not in tok:
                if out[-1] and out[-1][-1].isdigit():  # 2>/dev/null: the 2 is the redirection's
                    out[-1].pop()
                redirect = True
            else:  # ; & | && || ( ) <( >(: another command begins
                out.append([])
                redirect = False
            continue
        if redirect:
            redirect = False  # its target
            continue
        out[-1].append(tok)
    return [words for words in out if words]


@dataclass(frozen=True)
class Refusal:
    why: str  # "which runs `ssh` (in `sh -c '...'`)", "which cannot be read as a shell command line (...)"
    advice: str  # what to write instead


SSH_ADVICE = "an ssh that gpudeploy cannot give its host-key checks to; write it as ProxyJump"


def problem(command: str) -> Refusal | None:
    """Why ``command`` (a ProxyCommand) cannot be let through, and what to write instead; or None."""
    try:
        found = _line(command, 0)
    except Unreadable as exc:
        return Refusal(f"which cannot be read as a shell command line ({exc}), so whether it starts ssh "
                       "cannot be seen", "close its quotes, or write the hop as ProxyJump")
    if found is None:
        return None
    why, within, advice = found
    return Refusal(why + (f" (in {within})" if within else ""), advice)


Found = tuple[str, "str | None", str]  # why; the nested command line it was found in, if any; advice


def _line(line: str, depth: int) -> Found | None:
    if depth > MAX_DEPTH:
        return (f"which nests command lines more than {MAX_DEPTH} deep, so whether it starts ssh cannot be seen",
                None, "nest it less, or write the hop as ProxyJump")
    for words in _simple_commands(line):
        found = _simple(words, depth)
        if found is not None:
            return found
    return None


def _nested(text: str, depth: int, within: str) -> Found | None:
    """``text`` read as a command line of its own; a finding names the innermost line it was in."""
    found = _line(text, depth + 1)
    return None if found is None else (found[0], found[1] or within, found[2])


def _program_at(words: list[str]) -> int:
    """Where the program of a simple command is: after assignments and the shell's prefixes."""
    i = 0
    while i < len(words):
        if ASSIGNMENT.match(words[i]):
            i += 1
        elif words[i] in PREFIXES:
            i += 1
            while i < len(words) and words[i].startswith("-") and words[i] != "-":  # exec -a NAME -l, command -p
                i += 2 if words[i] in WITH_VALUE else 1
        else:
            break
    return i


def _simple(words: list[str], depth: int) -> Found | None:
    for word in words:  # a substitution anywhere is a command line the shell runs first
        for mark, opens, within in (("$(", " ( ", f"`{word}`"), ("`", " ; ", "a backtick substitution")):
            if mark in word:
                found = _nested(word.replace(mark, opens, 1), depth, within)
                if found is not None:
                    return found
    i = _program_at(words)
    if i >= len(words):
        return None
    program, rest = words[i], words[i + 1:]
    name = _program_name(program)
    if is_ssh_client(program):
        return f"which runs `{program}`", None, SSH_ADVICE
    if "$" in name or "`" in name:
        shown = f"{program}(...)" if program.endswith("$") else program  # `$(...)`, split by the lexer
        return (f"whose program `{shown}` is known only when the shell runs it, so whether it starts ssh "
                "cannot be seen"), None, "name the program itself, or write the hop as ProxyJump"
    if name in SHELLS and any(w.startswith(("-", "+")) and not w.startswith("--") and "c" in w for w in rest):
        for operand in (w for w in rest if not w.startswith(("-", "+"))):  # the -c string, then $0, $1...
            found = _nested(operand, depth, f"`{program} -c {shlex.quote(operand)}`")
            if found is not None:
                return found
    elif name == "eval":
        return _nested(" ".join(rest), depth, "`eval " + " ".join(rest) + "`")
    elif name in WRAPPERS:
        for word in rest:
            if is_ssh_client(word):
                return f"which runs `{word}` through `{program}`", None, SSH_ADVICE
            if any(c.isspace() for c in word):  # su -c "...", script -c "...", watch "..."
                found = _nested(word, depth, f"`{program} ... {shlex.quote(word)}`")
                if found is not None:
                    return found
    return None
