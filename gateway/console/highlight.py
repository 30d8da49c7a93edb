"""Code for approvers to read: highlighted by Pygments into escaped HTML spans.

Pygments escapes the code itself; the classes it emits are styled by console.css
(no inline styles, which the console's CSP would refuse anyway).
"""

from __future__ import annotations

from html import escape

from pygments import highlight as pygments_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name

_LEXERS = {"python": "python", "bash": "bash", "javascript": "javascript"}
# Past this size the code is shown plain: highlighting costs time per byte.
MAX_HIGHLIGHT_BYTES = 64 * 1024


def highlight(code: str, language: str) -> str:
    """HTML for the inside of a `<pre class="code">` (blocking: run it in a thread)."""
    lexer_name = _LEXERS.get(language)
    if lexer_name is None or len(code.encode()) > MAX_HIGHLIGHT_BYTES:
        return escape(code)
    formatter = HtmlFormatter(nowrap=True)
    return pygments_highlight(code, get_lexer_by_name(lexer_name), formatter)
