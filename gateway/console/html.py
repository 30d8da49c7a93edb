"""Server-side HTML for the console: every value escaped here, no inline script or style.

Pages are plain documents; `console.js` only adds countdowns and charts to what is
already there, so the console reads the same with scripts off.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from html import escape
from typing import Any
from urllib.parse import quote

from aiohttp import web

from gateway.console.session import Session

# (path, label, scopes that open it)
PAGES = (
    ("/console/approvals", "Approvals", ("approvals:read", "approvals:read:all")),
    ("/console/audit", "Audit trail", ("audit:read", "audit:read:all")),
    ("/console/patterns", "Patterns", ("audit:read", "audit:read:all")),
    ("/console/health", "Health", ("audit:read", "audit:read:all")),
)


def esc(value: object) -> str:
    return escape(str(value), quote=True)


def url(path: str, **params: str) -> str:
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items() if v)
    return esc(f"{path}?{query}" if query else path)


def csrf_field(session: Session) -> str:
    return f'<input type="hidden" name="csrf" value="{esc(session.csrf)}">'


def _nav(session: Session | None, active: str) -> str:
    if session is None:
        return ""
    links = []
    for path, label, scopes in PAGES:
        if session.has(*scopes):
            current = ' aria-current="page"' if path == active else ""
            links.append(f'<a href="{esc(path)}"{current}>{esc(label)}</a>')
    who = (
        f'<span class="who">{esc(session.sub)} · {esc(session.tenant)}</span>'
        f'<form method="post" action="/console/signout" class="inline">{csrf_field(session)}'
        '<button type="submit" class="link">Sign out</button></form>'
    )
    return f'<nav>{"".join(links)}</nav><div class="account">{who}</div>'


def page(
    title: str, body: str, session: Session | None = None, active: str = "", status: int = 200
) -> web.Response:
    document = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · execgate</title>"
        '<link rel="icon" href="data:,">'
        '<link rel="stylesheet" href="/console/static/console.css">'
        '<script src="/console/static/console.js" defer></script></head><body>'
        f'<header class="top"><a class="brand" href="/console/">execgate</a>'
        f"{_nav(session, active)}</header>"
        f"<main><h1>{esc(title)}</h1>{body}</main></body></html>"
    )
    return web.Response(status=status, text=document, content_type="text/html")


def redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def value(v: Any, depth: int = 0) -> str:
    """A record field for people: scalars as text, lists as chips or rows, maps as tables.

    Past a few levels (or for odd shapes) the rest is shown as indented JSON.
    """
    if isinstance(v, Mapping | list | tuple):
        if not v:
            return '<span class="muted">none</span>'
        if isinstance(v, list | tuple) and all(isinstance(x, str | int | float) for x in v):
            return "".join(f'<span class="chip">{esc(x)}</span>' for x in v)
        if isinstance(v, Mapping) and all(_scalar(x) for x in v.values()):
            return "".join(
                f'<span class="pair"><b>{esc(k)}</b> {value(x)}</span>' for k, x in v.items()
            )
        if depth < 3 and isinstance(v, Mapping) and all(isinstance(k, str) for k in v):
            return fields(v, depth=depth + 1)
        if depth < 3 and all(isinstance(x, Mapping) for x in v):
            return "".join(f'<div class="row">{value(x, depth + 1)}</div>' for x in v)
        return f'<pre class="json">{esc(json.dumps(v, indent=2, sort_keys=True))}</pre>'
    if v is None:
        return '<span class="muted">—</span>'
    if isinstance(v, bool):
        return "yes" if v else "no"
    return esc(v)


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


def fields(data: Mapping[str, Any], skip: Iterable[str] = (), depth: int = 0) -> str:
    hidden = set(skip)
    rows = "".join(
        f"<tr><th>{esc(k)}</th><td>{value(v, depth)}</td></tr>"
        for k, v in data.items()
        if k not in hidden
    )
    return f'<table class="fields">{rows}</table>' if rows else ""


def items(values: Iterable[object], empty: str = "none") -> str:
    lis = "".join(f"<li>{esc(v)}</li>" for v in values)
    return f"<ul>{lis}</ul>" if lis else f'<p class="muted">{esc(empty)}</p>'


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """`rows` cells are HTML already (escape them with `esc` or `value`)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    klass = f' class="{esc(cls)}"' if cls else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def chart(title: str, headers: list[str], rows: list[list[str]], empty: str) -> str:
    """A card with a table console.js draws as bars (the last column is the value)."""
    head = f'<section class="card"><h2>{esc(title)}</h2>'
    if not rows:
        return head + f'<p class="muted">{esc(empty)}</p></section>'
    return head + table(headers, rows, "chart") + "</section>"


def badge(word: str) -> str:
    kind = "".join(c for c in word.lower() if c.isalnum() or c == "_") or "unknown"
    return f'<span class="badge b-{kind}">{esc(word)}</span>'
