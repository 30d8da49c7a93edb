"""Every `execgate` command line the docs show still parses, and `--config FILE` works
before and after the verb of every subcommand (SPEC section 8).

The command lines are read out of the docs themselves (code spans and code blocks of
the Markdown files, comments in deploy/, the image's ENTRYPOINT/CMD, the compose and
Kubernetes commands), so a renamed flag or verb fails here until the docs follow.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shlex
import sys
import urllib.request
from pathlib import Path

import jwt
import pytest
import yaml

from gateway.bench.process import free_port
from gateway.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    "README.md",
    "THREAT_MODEL.md",
    "docs/ARCHITECTURE.md",
    "policies/README.md",
    "deploy/README.md",
    "deploy/execgate.toml",
    "deploy/opa/run.sh",
]
# SPEC section 8's synopses, written out with sample values (the SPEC lives outside the
# tree). The table says `--config FILE` goes before or after the verb.
SPEC_LINES = [
    "execgate serve --config F --host H --port 9000",
    "execgate --config F serve --host H --port 9000",
    'execgate token --tenant T --sub S --scope "exec:python exec:bash" --ttl 1h',
    "execgate exec --lang python script.py",
    "execgate exec -",
    "execgate approvals list",
    "execgate approvals approve ID",
    "execgate approvals deny ID",
    "execgate audit verify F",
    "execgate audit tail",
    "execgate escape-test --backend B --json",
    "execgate bench",
    "execgate policy eval FILE --policy DIR",
    "execgate policy eval --execution ID --policy DIR",
    "execgate policy replay --policy DIR --since 24h --tenant T --json",
    "execgate policy replay --config F --policy DIR",
]
# A synopsis's placeholder for a typed option value, replaced by a sample of that type.
TYPED_SAMPLES = {"--port": "9000", "--runs": "1", "--requests": "1", "--concurrency": "1"}

# `execgate` (or .venv/bin/execgate) at the start of a span or after `$(`, then its words.
WORD = r"(?:\"[^\"]*\"|'[^']*'|[^\s#`)|;\"']+)"
COMMAND = re.compile(rf"(?:^|\$\(|\s)(?:[\w./-]*/)?execgate((?:\s+{WORD})+)")
CODE_SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)?)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def _commands_in(text: str) -> list[str]:
    found = []
    for match in COMMAND.finditer(text):
        words = match.group(1).split()
        if words and (words[0].startswith("--") or re.fullmatch(r"[a-z][a-z-]*", words[0])):
            found.append("execgate" + match.group(1))
    return found


def documented_command_lines() -> list[tuple[str, str]]:
    """(where, command line) for every `execgate ...` the docs show."""
    lines: list[tuple[str, str]] = []
    for name in DOCS:
        text = (REPO / name).read_text()
        if name.endswith(".md"):
            for block in FENCE.findall(text):
                for line in block.splitlines():
                    # A shell line: the command first, or inside `$(...)` (not prose).
                    line = line.split(" # ")[0].strip()
                    if re.match(r"([\w./-]*/)?execgate\s|.*\$\(([\w./-]*/)?execgate\s", line):
                        lines += [(name, cmd) for cmd in _commands_in(line)]
            prose = FENCE.sub("", text)
            for span in CODE_SPAN.findall(prose):
                span = " ".join(span.split())  # a span may wrap onto the next line
                if span.startswith(("execgate ", ".venv/bin/execgate ")):
                    lines += [(name, cmd) for cmd in _commands_in(span)]
        else:  # comments in config and scripts quote command lines in code spans
            for span in CODE_SPAN.findall(text):
                lines += [(name, cmd) for cmd in _commands_in(span)]
    # What the image and the orchestrators run: ENTRYPOINT + CMD / command / args.
    dockerfile = (REPO / "deploy/gateway/Dockerfile").read_text()
    entry = yaml.safe_load(re.search(r"^ENTRYPOINT (.*)$", dockerfile, re.M).group(1))
    cmd = yaml.safe_load(re.search(r"^CMD (.*)$", dockerfile, re.M).group(1))
    lines.append(("deploy/gateway/Dockerfile", shlex.join(entry + cmd)))
    compose = yaml.safe_load((REPO / "deploy/compose.yaml").read_text())
    for name, service in compose["services"].items():
        if "gateway" in service.get("build", {}).get("dockerfile", "") or name == "gateway":
            lines.append((f"deploy/compose.yaml:{name}", shlex.join(entry + service["command"])))
    for doc in yaml.safe_load_all((REPO / "deploy/k8s/deployment.yaml").read_text()):
        pod = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            if container["name"] == "gateway":
                argv = container.get("command", entry) + container["args"]
                lines.append(("deploy/k8s/deployment.yaml:gateway", shlex.join(argv)))
    lines += [("SPEC section 8", line) for line in SPEC_LINES]
    return lines


def to_argv(line: str) -> list[str]:
    """A documented line as the argv the CLI gets: synopsis brackets dropped (every
    optional part is taken), the first of alternatives, typed placeholders sampled."""
    line = re.sub(r"\$\w+|\$\{\w+\}", "VALUE", line)
    line = line.replace("[", " ").replace("]", " ")
    words = shlex.split(line)[1:]
    argv: list[str] = []
    for word in words:
        word = word.split("|")[0] if "|" in word and not word.startswith("-") else word
        if argv and argv[-1] in TYPED_SAMPLES and not word.lstrip("-").isdigit():
            word = TYPED_SAMPLES[argv[-1]]
        argv.append(word)
    return argv


def parse(argv: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"execgate {shlex.join(argv)} does not parse") from exc


DOCUMENTED = documented_command_lines()


def test_the_docs_show_command_lines() -> None:
    """The extraction finds the docs' commands (so a change to it cannot pass by
    finding none)."""
    sources = {where.split(":")[0] for where, _ in DOCUMENTED}
    assert {"README.md", "deploy/execgate.toml", "deploy/gateway/Dockerfile"} <= sources
    assert {"deploy/compose.yaml", "deploy/k8s/deployment.yaml", "SPEC section 8"} <= sources
    readme = [line for where, line in DOCUMENTED if where == "README.md"]
    assert len(readme) >= 15, readme
    shown = [line for _, line in DOCUMENTED]
    assert "execgate serve --config FILE" in shown
    assert "execgate --config FILE token --tenant t --sub s" in shown


@pytest.mark.parametrize(("where", "line"), DOCUMENTED, ids=[f"{w}: {c}" for w, c in DOCUMENTED])
def test_documented_command_line_parses(where: str, line: str) -> None:
    args = parse(to_argv(line))
    assert args.command


def _leaf_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, parser)]
    return [
        leaf
        for action in subs
        for name, sub in action.choices.items()
        for leaf in _leaf_commands(sub, (*path, name))
    ]


def _required_args(parser: argparse.ArgumentParser) -> list[str]:
    argv = []
    for action in parser._actions:
        sample = "1" if action.type in (int, float) else "x"
        if not action.option_strings and action.nargs is None:
            argv.append(sample)
        elif action.option_strings and action.required:
            argv += [action.option_strings[0], sample]
    for group in parser._mutually_exclusive_groups:
        if group.required:  # one of them must be given: the first
            first = group._group_actions[0]
            argv += [first.option_strings[0], "x"] if first.option_strings else ["x"]
    return argv


LEAVES = _leaf_commands(build_parser())


@pytest.mark.parametrize(("path", "parser"), LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_config_goes_before_or_after_the_verb(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    rest = _required_args(parser)
    assert parse(["--config", "a.toml", *path, *rest]).config == "a.toml"
    assert parse([*path, *rest, "--config", "b.toml"]).config == "b.toml"
    assert parse([path[0], "--config", "c.toml", *path[1:], *rest]).config == "c.toml"
    assert parse(["--config", "a.toml", *path, *rest, "--config", "b.toml"]).config == "b.toml"
    assert parse([*path, *rest]).config is None
    assert "--config" in parser.format_help()


def test_help_of_every_subcommand_lists_config(capsys: pytest.CaptureFixture[str]) -> None:
    for path, _parser in LEAVES:
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([*path, "--help"])
        assert done.value.code == 0
        assert "--config" in capsys.readouterr().out, path


# Real runs: the flag after the verb reaches the settings the command uses.


async def _run(*argv: str, cwd: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        *argv,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _config(tmp_path: Path, port: int = 8080) -> Path:
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {port}\n'
        f'[auth]\nhs256_secret_file = "{tmp_path}/keys/jwt"\n'
        f'[audit]\npath = "{tmp_path}/audit/audit.jsonl"\n'
        f'[state]\npath = "{tmp_path}/state"\n'
        f'[policy]\npath = "{REPO}/policies"\n'
        '[backends]\ndefault = "noop"\n'
    )
    return config


async def test_token_after_the_verb_uses_the_files_key(tmp_path: Path) -> None:
    config = _config(tmp_path)
    code, out, err = await _run(
        "token", "--tenant", "t", "--sub", "s", "--config", str(config), cwd=tmp_path
    )
    assert code == 0, err
    secret = (tmp_path / "keys/jwt").read_bytes().strip()
    assert jwt.decode(out.strip(), secret, algorithms=["HS256"])["tenant"] == "t"
    code, before, err = await _run(
        "--config", str(config), "token", "--tenant", "t", "--sub", "s", cwd=tmp_path
    )
    assert code == 0, err
    assert jwt.decode(before.strip(), secret, algorithms=["HS256"])["sub"] == "s"


async def test_a_missing_config_after_the_verb_is_refused_by_name(tmp_path: Path) -> None:
    for argv in (["audit", "verify", "--config", "nope.toml"], ["serve", "--config", "nope.toml"]):
        code, _, err = await _run(*argv, cwd=tmp_path)
        assert code == 2
        assert "nope.toml" in err


async def test_serve_dash_dash_config_file_serves_the_files_port(tmp_path: Path) -> None:
    """deploy/execgate.toml's own words: `execgate serve --config FILE`."""
    port = free_port()
    config = _config(tmp_path, port)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(config),
        cwd=tmp_path,
        # The embedded engine compiles the policy with OPA: the suite's own binary.
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **_opa_env()},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        for _ in range(600):  # a bound that only fails a hung start
            if proc.returncode is not None:
                break
            if await asyncio.to_thread(healthy):
                break
            await asyncio.sleep(0.1)
        assert proc.returncode is None, (await proc.stderr.read()).decode()[-2000:]
        assert await asyncio.to_thread(healthy)
        assert (tmp_path / "audit/audit.jsonl").exists()
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


def _opa_env() -> dict[str, str]:
    from gateway.policy.compiler import find_opa_binary

    return {"EXECGATE_OPA_BIN": str(find_opa_binary())}
