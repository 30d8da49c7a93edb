"""A conservative text scan: features that code might have, from its words alone.

Used when code is not parsed (too big, a syntax error, an unknown language) and
for text that bash hands to other programs. It over-reports on purpose (a word
in a comment or a string counts): unparsed code should not get past a rule that
parsed code would meet. One pass to split words (about 25 ms per MiB here),
then set lookups, so even the largest request body costs little.
"""

from __future__ import annotations

import re
import string

from gateway.analysis.findings import Findings

_NATIVE_MODULES = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend"})


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Word lists as text keep this table readable.
_WORD_FEATURES: dict[str, frozenset[str]] = {
    "native_code": _NATIVE_MODULES | {"dlopen", "LD_PRELOAD"},
    "network": _words(
        "socket urllib urllib3 requests httpx aiohttp websockets websocket ftplib smtplib "
        "telnetlib curl wget nc ncat netcat socat ssh scp sftp fetch XMLHttpRequest WebSocket "
        "net http https http2 dgram tls undici axios"
    ),
    "subprocess": _words(
        "subprocess pty child_process multiprocessing system popen fork forkpty execv execve "
        "execvp execvpe execl execle execlp execlpe spawnv spawnve spawnvp spawnl spawnlp "
        "posix_spawn posix_spawnp create_subprocess_exec create_subprocess_shell"
    ),
    "dynamic_code": frozenset(
        {"eval", "exec", "compile", "__import__", "import_module", "Function", "vm", "source"}
    ),
    "filesystem_write": _words(
        "open write_text write_bytes shutil remove unlink rename mkdir makedirs rmdir chmod "
        "chown symlink truncate writeFile writeFileSync appendFile appendFileSync "
        "createWriteStream tee touch rm mv cp dd"
    ),
    "environment": frozenset({"environ", "getenv", "putenv", "printenv", "env"}),
    "threads": frozenset({"threading", "_thread", "worker_threads"}),
}
_SUBSTRING_FEATURES = {"/dev/tcp/": "network", "/dev/udp/": "network", "ffi-napi": "native_code"}

# ASCII punctuation and whitespace -> space; letters, digits, _ and non-ASCII stay.
_WORDS_ONLY = str.maketrans(
    {c: " " for c in map(chr, range(128)) if c not in string.ascii_letters + string.digits + "_"}
)
# Shell output redirection (not `2>&1`, not a heredoc or here-string).
_BASH_REDIRECT = re.compile(r"(?<![<&0-9=-])>(?!&)")


def scan(language: str, code: str) -> Findings:
    findings = Findings(parsed=False)
    words = set(code.translate(_WORDS_ONLY).split())
    for feature, names in _WORD_FEATURES.items():
        if not names.isdisjoint(words):
            findings.features.add(feature)
    for needle, feature in _SUBSTRING_FEATURES.items():
        if needle in code:
            findings.features.add(feature)
    if language == "bash" and _BASH_REDIRECT.search(code):
        findings.features.add("filesystem_write")
    # Name the native modules seen, so an approval request says what they were.
    findings.imports |= _NATIVE_MODULES & words
    return findings
