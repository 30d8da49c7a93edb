"""Bash: the commands a script runs (`calls`) and what they suggest (`features`).

Command substitutions are analysed as scripts of their own, and here-document
bodies and the code handed to interpreters (`python -c ...`) go through the
conservative text scan, since bash passes them on to something that runs them.
"""

from __future__ import annotations

import re

from gateway.analysis.findings import Findings
from gateway.analysis.shell_lexer import MAX_DEPTH, ShellSyntaxError, Token, lex
from gateway.analysis.textscan import scan

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
# Words after which the next word is a command again.
_COMMAND_PREFIXES = {"!", "{", "}", "then", "else", "elif", "do", "if", "while", "until", "time"}
_NON_COMMANDS = {"fi", "done", "esac", "in", "]]", "}"}
# Wrappers: they run the command that follows them (after their own options).
_WRAPPERS = {
    "sudo", "doas", "env", "exec", "command", "builtin", "nohup", "nice", "timeout",
    "xargs", "stdbuf", "setsid", "chroot", "unshare", "strace", "ltrace", "watch", "time",
}  # fmt: skip
# Positional arguments before the command, and options that take a value.
_WRAPPER_ARGUMENTS = {"timeout": 1, "chroot": 1}
_OPTION_VALUES = {
    "sudo": {"-u", "-g", "-h", "-p", "-C", "-U", "-r", "-t", "-D", "-R"},
    "doas": {"-u", "-C"},
    "env": {"-u", "-C", "-S"},
    "timeout": {"-s", "-k", "--signal", "--kill-after"},
    "nice": {"-n"},
    "xargs": {"-I", "-n", "-P", "-L", "-d", "-E", "-s", "-a"},
    "strace": {"-o", "-e", "-p", "-s"},
    "watch": {"-n", "-d"},
}

_FEATURES: dict[str, str] = {}
for _cmd in (
    "curl", "wget", "nc", "ncat", "netcat", "socat", "ssh", "scp", "sftp", "rsync", "telnet",
    "ftp", "nmap", "ping", "dig", "nslookup", "host", "openssl", "aria2c", "http",
):  # fmt: skip
    _FEATURES[_cmd] = "network"
for _cmd in (
    "python", "python2", "python3", "perl", "ruby", "node", "nodejs", "php", "lua", "tclsh",
    "eval", "source", ".", "bash", "sh", "dash", "zsh", "ksh", "busybox", "awk", "gawk",
):  # fmt: skip
    _FEATURES[_cmd] = "dynamic_code"
for _cmd in (
    "tee", "touch", "rm", "mv", "cp", "mkdir", "rmdir", "dd", "chmod", "chown", "ln",
    "truncate", "install", "shred", "mkfifo", "mknod", "tar", "unzip",
):  # fmt: skip
    _FEATURES[_cmd] = "filesystem_write"
for _cmd in ("gcc", "cc", "g++", "c++", "clang", "clang++", "tcc", "ld", "as"):
    _FEATURES[_cmd] = "native_code"
for _cmd in ("env", "printenv", "export", "set"):
    _FEATURES[_cmd] = "environment"
_INTERPRETERS = {c for c, f in _FEATURES.items() if f == "dynamic_code"} - {"source", "."}
_HARMLESS_TARGETS = {"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"}


def analyse(code: str) -> Findings:
    found = Findings(parsed=True)
    try:
        _analyse(code, found, depth=0)
    except (ShellSyntaxError, RecursionError):
        found.parsed = False
    return found


def _analyse(code: str, found: Findings, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ShellSyntaxError("substitutions nested too deeply")
    lexed = lex(code)
    _commands(lexed.tokens, found)
    for inner in lexed.substitutions:
        _analyse(inner, found, depth + 1)
    for body in lexed.heredocs:
        found.merge(scan("bash", body))
    if "/dev/tcp/" in code or "/dev/udp/" in code:
        found.features.add("network")


def _commands(tokens: list[Token], found: Findings) -> None:
    expect_command = True
    in_case_patterns = False
    skip_until_do = False  # for/select header words are not commands
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.kind in ("op", "newline"):
            if in_case_patterns and token.text == ")":
                in_case_patterns = False
            elif token.text in (";;", ";&", ";;&"):
                in_case_patterns = True
            expect_command = True
            continue
        if token.kind == "redirect":
            target = tokens[i] if i < len(tokens) and tokens[i].kind == "word" else None
            i += target is not None
            _redirect(token.text, target, found)
            continue
        word = token.text
        if in_case_patterns or not expect_command:
            if skip_until_do and word in ("do", "in") and not token.quoted:
                skip_until_do = word == "in"
                expect_command = word == "do"
            elif word == "esac" and not token.quoted:
                in_case_patterns = False
            continue
        if token.quoted is False and word in _COMMAND_PREFIXES:
            skip_until_do = skip_until_do and word != "do"
            continue
        if token.quoted is False and (word in _NON_COMMANDS or _ASSIGNMENT.match(word)):
            _assignment(word, found)
            continue
        if not token.quoted and word == "function":
            i += 1  # the name; `()` and `{` follow as operators and prefixes
            if i + 1 < len(tokens) and tokens[i].text == "(" and tokens[i + 1].text == ")":
                i += 2
            continue
        if not token.quoted and word in ("for", "select", "case"):
            skip_until_do = word != "case"
            in_case_patterns = word == "case"
            if word == "case":
                i = _skip_case_header(tokens, i)
            expect_command = False
            continue
        if i + 1 < len(tokens) and tokens[i].text == "(" and tokens[i + 1].text == ")":
            i += 2  # name() { ... }: a definition, not a call
            continue
        i = _command(tokens, i - 1, found)
        expect_command = False


def _skip_case_header(tokens: list[Token], i: int) -> int:
    while i < len(tokens) and not (tokens[i].kind == "word" and tokens[i].text == "in"):
        i += 1
    return i + 1


def _command(tokens: list[Token], i: int, found: Findings) -> int:
    """Record the command at tokens[i] (and what wrappers run); the next index."""
    word = tokens[i].text
    if word.startswith("$") or "$(…)" in word:
        found.features.add("dynamic_code")  # the command is computed at run time
        return i + 1
    name = _basename(word)
    found.calls.add(name)
    if feature := _FEATURES.get(name):
        found.features.add(feature)
    i += 1
    if name in _INTERPRETERS:
        for token in _arguments(tokens, i):
            found.merge(scan("python" if name.startswith("python") else "bash", token.text))
    if name in _WRAPPERS:
        args = _wrapped(name, _arguments(tokens, i))
        # Option values are not told apart from the command (`sudo -u root cmd`),
        # so every argument that names a known command lends its feature.
        for arg in args:
            if feature := _FEATURES.get(_basename(arg.text)):
                found.features.add(feature)
        skip = _WRAPPER_ARGUMENTS.get(name, 0)
        if len(args) > skip:
            return _command(tokens, tokens.index(args[skip], i), found)
    return i


def _wrapped(wrapper: str, words: list[Token]) -> list[Token]:
    """A wrapper's arguments without its options (and their values) and assignments."""
    takes_value = _OPTION_VALUES.get(wrapper, set())
    args: list[Token] = []
    skip_next = False
    for token in words:
        if skip_next:
            skip_next = False
        elif token.text.startswith("-"):
            skip_next = token.text in takes_value
        elif not _ASSIGNMENT.match(token.text):
            args.append(token)
    return args


def _arguments(tokens: list[Token], i: int) -> list[Token]:
    args = []
    while i < len(tokens) and tokens[i].kind == "word":
        args.append(tokens[i])
        i += 1
    return args


def _basename(word: str) -> str:
    return word.rsplit("/", 1)[-1] if "/" in word.rstrip("/") else word


def _assignment(word: str, found: Findings) -> None:
    if word.startswith(("LD_PRELOAD=", "LD_LIBRARY_PATH=")):
        found.features.add("native_code")


def _redirect(op: str, target: Token | None, found: Findings) -> None:
    if target is None or op in ("<", "<<", "<<-", "<<<", ">&", "<&"):
        if target is not None and target.text.startswith("/dev/tcp/"):
            found.features.add("network")
        return
    if target.text.startswith(("/dev/tcp/", "/dev/udp/")):
        found.features.add("network")
    elif target.text not in _HARMLESS_TARGETS and not target.text.isdigit():
        found.features.add("filesystem_write")
