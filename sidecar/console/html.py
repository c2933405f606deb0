"""HTML building blocks of the console's pages: escaping, tables, the layout.

Every value placed in a page goes through `esc` (labels and names come from the
configuration, request ids from Envoy; none is trusted to be markup). No inline style or
script anywhere: the content-security policy (console/responses.py) forbids both, so
colours are classes of console.css.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from urllib.parse import urlencode

PAGES = (("now", "Now"), ("decisions", "Decisions"), ("usage", "Usage and cost"),
         ("errors", "Fallbacks and errors"))


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def number(value: float | int | None, digits: int = 0, unit: str = "") -> str:
    """A figure for a cell: `–` when unknown; the digits asked for, then the unit."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{value:,.{digits}f}" if digits else f"{round(value):,}"
    return f"{text}{unit}"


def percent(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value * 100:.{digits}f} %"


def usd(value: float | None) -> str:
    if value is None:
        return "–"
    if value and abs(value) < 0.01:
        return f"${value:.6f}"
    return f"${value:,.4f}" if value < 100 else f"${value:,.2f}"


def clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%H:%M:%S")


def moment(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def link(path: str, text: str, **query: str | None) -> str:
    values = {k: v for k, v in query.items() if v}
    href = path + ("?" + urlencode(values) if values else "")
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], caption: str = "",
          numeric_from: int = 1, raw: bool = False, css: str = "") -> str:
    """A table of cells already escaped when `raw` (links, badges), else escaped here.
    Columns from `numeric_from` on are figures (right-aligned)."""
    head = "".join(f'<th scope="col"{_num(i, numeric_from)}>{esc(h)}</th>'
                   for i, h in enumerate(headers))
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            text = cell if raw else esc(cell)
            tag = "th scope=\"row\"" if i == 0 else "td"
            cells.append(f"<{tag}{_num(i, numeric_from)}>{text}</{tag.split()[0]}>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(headers)}" class="empty">nothing yet</td></tr>')
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    klass = f' class="{esc(css)}"' if css else ""
    return (f'<div class="scroll"><table{klass}>{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _num(index: int, numeric_from: int) -> str:
    return ' class="num"' if index >= numeric_from else ""


def badge(text: str, kind: str) -> str:
    """A state word with a class for its colour (`good`, `warn`, `bad`, `info`); the word
    itself carries the meaning, never the colour alone."""
    return f'<span class="badge {esc(kind)}">{esc(text)}</span>'


def options(name: str, label: str, values: Iterable[str], chosen: str | None,
            any_text: str | None = "any") -> str:
    """A select; `any_text` names the empty choice (None: there is none)."""
    items = [] if any_text is None else [
        f'<option value=""{" selected" if not chosen else ""}>{esc(any_text)}</option>']
    for value in values:
        selected = " selected" if value == chosen else ""
        items.append(f'<option value="{esc(value)}"{selected}>{esc(value)}</option>')
    return (f'<label>{esc(label)} <select name="{esc(name)}">{"".join(items)}'
            "</select></label>")


def layout(page: str, title: str, main: str, generated_at: float, refresh: int = 5) -> str:
    """The whole document: navigation, the page's `main` (which the script swaps every
    `refresh` seconds; 0: never), and the moment its figures were read."""
    current = ' aria-current="page"'
    nav = "".join(f'<a href="/console/{key}"{current if key == page else ""}>{esc(text)}</a>'
                  for key, text in PAGES)
    auto = f' data-refresh="{int(refresh)}"' if refresh else ""
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>{esc(title)} · model-group sidecar</title>"
        '<link rel="stylesheet" href="/console/static/console.css">'
        '<script src="/console/static/console.js" defer></script></head>'
        f'<body><header><span class="brand">model-group sidecar</span><nav>{nav}</nav>'
        '<span class="live" id="live-state" aria-live="polite"></span></header>'
        f'<main id="page" data-page="{esc(page)}"{auto}>{main}'
        f'<p class="stamp">figures read at <time>{esc(moment(generated_at))}</time></p>'
        "</main></body></html>\n")
