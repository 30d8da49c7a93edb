"""deploy/execgate.toml: loads with the real loader, and documents every settings key.

A key added to the settings without a line here fails this test, so the example
cannot rot. Optional tables are written commented out ("# [backends.docker]",
"# key = value"); they are uncommented here and validated by their own models too.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from pydantic import BaseModel

from backends import REGISTRY, backend_class
from gateway.settings.model import (
    _SECTIONS,
    Settings,
    TenantSettings,
    ToolSettings,
    load_settings,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "execgate.toml"
_HEADER = re.compile(r"^(?:# )?\[\[?([A-Za-z0-9_.<>-]+)\]")
_KEY = re.compile(r"^(?:# )?([a-z][a-z0-9_]*) = ")


def documented_keys() -> dict[str, set[str]]:
    """Section -> keys written in the example, commented or not."""
    keys: dict[str, set[str]] = {}
    section = ""
    for line in EXAMPLE.read_text().splitlines():
        if header := _HEADER.match(line):
            section = header.group(1)
            keys.setdefault(section, set())
        elif key := _KEY.match(line):
            keys.setdefault(section, set()).add(key.group(1))
    return keys


def commented_tables() -> dict[str, dict[str, object]]:
    """The optional tables, uncommented and parsed."""
    tables: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in EXAMPLE.read_text().splitlines():
        if line.startswith("# [") and (header := _HEADER.match(line)):
            current = tables.setdefault(header.group(1), [])
        elif current is not None and _KEY.match(line) and line.startswith("# "):
            current.append(line[2:])
        elif not line.startswith("#"):
            current = None
    return {name: tomllib.loads("\n".join(lines)) for name, lines in tables.items()}


def fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def test_the_example_loads_with_the_real_loader() -> None:
    settings = load_settings(EXAMPLE, env={})
    assert settings.server.host == "0.0.0.0"
    assert settings.enabled_backends() == ["nsjail"]


def test_every_settings_key_is_documented() -> None:
    keys = documented_keys()
    missing = []
    for section, model in _SECTIONS.items():
        # Sub-tables ([ingress.mcp], [[ingress.routes]]) count by their header.
        present = keys.get(section, set()) | {
            k for k in fields(model) if any(h.startswith(f"{section}.{k}") for h in keys)
        }
        wanted = fields(model) - {"tools"}  # a table of tables: [ingress.tools.<name>]
        missing += [f"{section}.{k}" for k in sorted(wanted - present)]
    missing += [f"tenants.default.{k}" for k in sorted(
        fields(TenantSettings) - keys.get("tenants.default", set()))]  # fmt: skip
    missing += [f"ingress.tools.*.{k}" for k in sorted(
        fields(ToolSettings) - keys.get("ingress.tools.run_python", set()))]  # fmt: skip
    documented_backends = {"docker-gvisor": "docker"}  # same model, documented once
    for name in REGISTRY:
        table = f"backends.{documented_backends.get(name, name)}"
        wanted = fields(backend_class(name).Settings)
        present = keys.get(table, set()) | keys.get(f"backends.{name}", set())
        present |= {k for k in wanted if f"{table}.{k}" in keys}  # a sub-table: [..capture]
        missing += [f"backends.{name}.{k}" for k in sorted(wanted - present)]
    assert set(Settings.model_fields) - {"backends", "tenants"} == set(_SECTIONS)
    assert not missing, f"keys not documented in {EXAMPLE.name}: {missing}"


def test_every_key_has_a_comment() -> None:
    lines = EXAMPLE.read_text().splitlines()
    bare = [
        line
        for i, line in enumerate(lines)
        if _KEY.match(line) and not line.startswith("#") and "#" not in line
        and not (lines[i - 1].startswith("#") or _KEY.match(lines[i - 1]))
    ]  # fmt: skip
    assert not bare, f"keys without a comment: {bare}"


def test_the_optional_tables_validate_with_their_models() -> None:
    tables = commented_tables()
    assert {"backends.nsjail", "backends.docker", "backends.noop"} <= set(tables)
    for name in ("nsjail", "docker", "docker-gvisor", "noop"):
        table = tables[f"backends.{'docker' if name == 'docker-gvisor' else name}"]
        backend_class(name).Settings.model_validate(table | tables.get(f"backends.{name}", {}))
    ToolSettings.model_validate(tables["ingress.tools.run_python"])
    # Every value written in the example is the model's own default.
    defaults = backend_class("nsjail").Settings()
    for key, value in tables["backends.nsjail"].items():
        assert getattr(defaults, key) == backend_class("nsjail").Settings.model_validate(
            {key: value}
        ).__getattribute__(key), key
