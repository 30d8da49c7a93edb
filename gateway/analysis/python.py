"""Python: imports, called names (aliases resolved) and features, from the AST.

The tree is walked iteratively (ast.walk), so deep nesting that ast.parse
accepts cannot exhaust the Python stack here.
"""

from __future__ import annotations

import ast

from gateway.analysis.findings import Findings

# module prefix -> feature, for imports and for calls into those modules
_MODULE_FEATURES: dict[str, str] = {
    "subprocess": "subprocess",
    "pty": "subprocess",
    "multiprocessing": "subprocess",
    "socket": "network",
    "ssl": "network",
    "urllib": "network",
    "urllib3": "network",
    "http.client": "network",
    "http.server": "network",
    "requests": "network",
    "httpx": "network",
    "aiohttp": "network",
    "websockets": "network",
    "ftplib": "network",
    "smtplib": "network",
    "poplib": "network",
    "imaplib": "network",
    "telnetlib": "network",
    "xmlrpc": "network",
    "socketserver": "network",
    "asyncio.open_connection": "network",
    "asyncio.start_server": "network",
    "asyncio.create_subprocess_exec": "subprocess",
    "asyncio.create_subprocess_shell": "subprocess",
    "ctypes": "native_code",
    "_ctypes": "native_code",
    "cffi": "native_code",
    "_cffi_backend": "native_code",
    "importlib.machinery.ExtensionFileLoader": "native_code",
    "runpy": "dynamic_code",
    "code": "dynamic_code",
    "codeop": "dynamic_code",
    "marshal": "dynamic_code",
    "threading": "threads",
    "_thread": "threads",
    "concurrent.futures": "threads",
    "os.environ": "environment",
    "os.getenv": "environment",
    "os.putenv": "environment",
    "os.unsetenv": "environment",
    "shutil": "filesystem_write",
    "tempfile": "filesystem_write",
}

# exact call names -> feature
_CALL_FEATURES: dict[str, str] = {
    "eval": "dynamic_code",
    "exec": "dynamic_code",
    "compile": "dynamic_code",
    "builtins.eval": "dynamic_code",
    "builtins.exec": "dynamic_code",
    "builtins.compile": "dynamic_code",
}
for _name in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "kill"):
    _CALL_FEATURES[f"os.{_name}"] = "subprocess"
for _name in (
    "remove", "unlink", "rename", "renames", "replace", "mkdir", "makedirs", "rmdir",
    "removedirs", "chmod", "chown", "lchown", "symlink", "link", "truncate", "mkfifo", "mknod",
):  # fmt: skip
    _CALL_FEATURES[f"os.{_name}"] = "filesystem_write"

_OS_PROCESS_PREFIXES = ("os.exec", "os.spawn")
# Methods that write wherever they are called (pathlib.Path and friends).
_WRITE_METHODS = {
    "write_text", "write_bytes", "touch", "mkdir", "unlink", "rmdir", "rename", "replace",
    "symlink_to", "hardlink_to", "chmod",
}  # fmt: skip
_DYNAMIC_IMPORTS = {"__import__", "importlib.import_module", "importlib.__import__"}


def analyse(code: str) -> Findings:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return Findings(parsed=False)
    found = Findings(parsed=True)
    nodes = list(ast.walk(tree))  # one walk (the costly part), two passes
    aliases = _aliases(nodes, found)
    for node in nodes:
        if isinstance(node, ast.Call):
            _call(node, aliases, found)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            name = _dotted(node, aliases)
            if name is not None:
                _feature_for(name, found)
    for module in found.imports:
        _feature_for(module, found)
    return found


def _aliases(nodes: list[ast.AST], found: Findings) -> dict[str, str]:
    """Local name -> dotted origin, from every import anywhere in the module."""
    aliases: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                _add_import(alias.name, found)
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            _add_import(node.module, found)
            for alias in node.names:
                if alias.name == "*":
                    continue
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _add_import(module: str, found: Findings) -> None:
    found.imports.add(module)
    found.imports.add(module.split(".")[0])


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """`y.path.join` -> "os.path.join" when `import os as y`; None if not a name chain."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(aliases.get(node.id, node.id))
    elif isinstance(node, ast.Call) and parts:
        inner = _dotted(node.func, aliases)
        parts.append(f"{inner}()" if inner else "?")
    elif isinstance(node, ast.Constant) and parts:
        parts.append(type(node.value).__name__)
    else:
        return None
    return ".".join(reversed(parts))


def _call(node: ast.Call, aliases: dict[str, str], found: Findings) -> None:
    name = _dotted(node.func, aliases)
    if name is None:
        return
    found.calls.add(name)
    _feature_for(name, found)
    if name in _DYNAMIC_IMPORTS:
        target = _string_arg(node, 0, "name")
        if target is None:
            found.features.add("dynamic_code")  # the module is chosen at run time
        else:
            _add_import(target, found)
            _feature_for(target, found)
    elif name == "getattr":
        base = _dotted(node.args[0], aliases) if node.args else None
        attr = _string_arg(node, 1, None)
        if attr is None:
            found.features.add("dynamic_code")
        elif base is not None:
            found.calls.add(f"{base}.{attr}")
            _feature_for(f"{base}.{attr}", found)
    elif name in ("open", "io.open", "codecs.open", "os.fdopen"):
        if _opens_for_writing(node, 1):
            found.features.add("filesystem_write")
    elif name.endswith(").open"):  # pathlib.Path(...).open(mode)
        if _opens_for_writing(node, 0):
            found.features.add("filesystem_write")
    elif "." in name and name.rsplit(".", 1)[1] in _WRITE_METHODS:
        found.features.add("filesystem_write")


def _string_arg(node: ast.Call, index: int, keyword: str | None) -> str | None:
    value: ast.expr | None = node.args[index] if len(node.args) > index else None
    for kw in node.keywords:
        if keyword is not None and kw.arg == keyword:
            value = kw.value
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value.value
    return None


def _feature_for(name: str, found: Findings) -> None:
    feature = _CALL_FEATURES.get(name)
    if feature is None and name.startswith(_OS_PROCESS_PREFIXES):
        feature = "subprocess"
    if feature is None:
        for prefix in _prefixes(name):
            feature = _MODULE_FEATURES.get(prefix)
            if feature is not None:
                break
    if feature is not None:
        found.features.add(feature)


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _opens_for_writing(node: ast.Call, mode_index: int) -> bool:
    """True unless the mode is a literal without w, a, x or +; a computed mode counts."""
    mode: ast.expr | None = node.args[mode_index] if len(node.args) > mode_index else None
    for keyword in node.keywords:
        if keyword.arg == "mode":
            mode = keyword.value
        elif keyword.arg is None:
            return True  # open(**kwargs)
    if mode is None:
        return False
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return any(flag in mode.value for flag in "wax+")
    return True
