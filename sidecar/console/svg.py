"""Charts drawn on the server as inline SVG: nothing to fetch, nothing to build, readable
without the script. Colours are classes (`s0`…`s7`, console.css) so light and dark themes
apply; every chart is paired on its page with the table of its numbers, and carries a
`<title>` and an `aria-label` for screen readers."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.console.html import clock, esc, number

SERIES_CLASSES = 8
MAX_BUCKETS = 500
WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 28


def _nice_top(value: float) -> float:
    """The axis top: 1, 2 or 5 times a power of ten at or above `value`."""
    if value <= 0:
        return 1.0
    scale = 1.0
    while scale * 10 <= value:
        scale *= 10
    while scale > value:
        scale /= 10
    for step in (1, 2, 5, 10):
        if step * scale >= value:
            return step * scale
    return 10 * scale


def line_chart(title: str, series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
               unit: str = "", digits: int = 0, span: tuple[float, float] | None = None,
               zero_step: int | None = None) -> str:
    """Lines over time: `series` is (name, [(epoch seconds, value)]) in legend order.
    `span`: the time axis (default: the points'); `zero_step`: counts, whose missing
    buckets of that many seconds are zeros (a quiet minute is 0, not a gap)."""
    if zero_step and span is not None:
        series = [(name, _zero_filled(values, span, zero_step)) for name, values in series]
    points = [p for _, values in series for p in values]
    if not points:
        return _empty(title)
    t0, t1 = span if span is not None else (min(t for t, _ in points),
                                            max(t for t, _ in points))
    width_s = (t1 - t0) or 1.0
    top = _nice_top(max(v for _, v in points))
    width, height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [_axes(top, unit, digits), _time_axis(t0, t1)]
    for index, (name, values) in enumerate(series):
        klass = f"s{index % SERIES_CLASSES}"
        coords = " ".join(
            f"{LEFT + (t - t0) / width_s * width:.1f},{TOP + height - v / top * height:.1f}"
            for t, v in sorted(values))
        if len(values) == 1:
            x, y = coords.split(",")
            parts.append(f'<circle class="dot {klass}" cx="{x}" cy="{y}" r="3">'
                         f"<title>{esc(name)}</title></circle>")
        else:
            parts.append(f'<polyline class="line {klass}" points="{coords}">'
                         f"<title>{esc(name)}</title></polyline>")
    return _frame(title, "".join(parts), _legend([name for name, _ in series]))


def _zero_filled(values: Sequence[tuple[float, float]], span: tuple[float, float],
                 step: int) -> list[tuple[float, float]]:
    """Every bucket of `span` (at most MAX_BUCKETS), 0 where `values` has none."""
    given = dict(values)
    first = int(span[0] // step) * step
    buckets = range(first, int(span[1]) + 1, step)
    if len(buckets) > MAX_BUCKETS:
        return sorted(given.items())
    return [(float(t), given.get(float(t), 0.0)) for t in buckets]


def bar_chart(title: str, bars: Sequence[tuple[str, Sequence[float]]],
              names: Sequence[str], unit: str = "", digits: int = 0) -> str:
    """Horizontal bars: one row per label, one bar per value (named by `names`)."""
    if not bars:
        return _empty(title)
    top = _nice_top(max((v for _, values in bars for v in values), default=0.0))
    row_height = 10 * len(names) + 10
    height = TOP + row_height * len(bars) + 8
    label_width = 180
    width = WIDTH - label_width - RIGHT - 60
    parts = []
    for row, (label, values) in enumerate(bars):
        y = TOP + row * row_height
        parts.append(f'<text class="label" x="{label_width - 6}" y="{y + row_height / 2:.1f}"'
                     f' text-anchor="end" dominant-baseline="middle">{esc(label)}</text>')
        for index, value in enumerate(values):
            length = max(0.0, value / top * width)
            klass = f"s{index % SERIES_CLASSES}"
            by = y + 4 + index * 10
            parts.append(f'<rect class="bar {klass}" x="{label_width}" y="{by}" '
                         f'width="{length:.1f}" height="8"><title>{esc(label)} '
                         f"{esc(names[index])}: {esc(number(value, digits, unit))}</title></rect>")
            parts.append(f'<text class="value" x="{label_width + length + 4:.1f}" y="{by + 7}">'
                         f"{esc(number(value, digits, unit))}</text>")
    return _frame(title, "".join(parts), _legend(names) if len(names) > 1 else "", height)


def _axes(top: float, unit: str, digits: int) -> str:
    height = HEIGHT - TOP - BOTTOM
    # Enough digits that the ticks (quarters of the top) read apart: 2.5, not 2 and 2.
    step = top / 4
    while digits < 6 and round(step, digits) != step:
        digits += 1
    lines = []
    for index in range(5):
        value = step * index
        y = TOP + height - height * index / 4
        lines.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" '
                     f'y2="{y:.1f}"/><text class="tick" x="{LEFT - 4}" y="{y:.1f}" '
                     f'text-anchor="end" dominant-baseline="middle">'
                     f"{esc(number(value, digits, unit))}</text>")
    return "".join(lines)


def _time_axis(t0: float, t1: float) -> str:
    y = HEIGHT - 8
    return (f'<text class="tick" x="{LEFT}" y="{y}">{esc(clock(t0))}</text>'
            f'<text class="tick" x="{WIDTH - RIGHT}" y="{y}" text-anchor="end">'
            f"{esc(clock(t1))} UTC</text>")


def _legend(names: Sequence[str]) -> str:
    if not names:
        return ""
    items = "".join(f'<li><span class="key s{i % SERIES_CLASSES}"></span>{esc(name)}</li>'
                    for i, name in enumerate(names))
    return f'<ul class="legend">{items}</ul>'


def _frame(title: str, body: str, legend: str, height: int = HEIGHT) -> str:
    return (f'<figure class="chart"><svg viewBox="0 0 {WIDTH} {height}" role="img" '
            f'aria-label="{esc(title)}" preserveAspectRatio="xMinYMin meet">'
            f"<title>{esc(title)}</title>{body}</svg><figcaption>{esc(title)}</figcaption>"
            f"{legend}</figure>")


def _empty(title: str) -> str:
    return (f'<figure class="chart empty"><figcaption>{esc(title)}</figcaption>'
            "<p>no data in this period yet</p></figure>")
