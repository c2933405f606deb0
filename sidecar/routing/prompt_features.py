"""The `prompt_features` signal: cheap markers for what a prompt is about.

This runs on every dynamic-score request, over up to `max_scan_bytes` of text, so it uses
only substring search on a lower-cased copy (C speed, linear) — no backtracking regular
expressions, which on long single-word input turn quadratic. Markers are heuristics, tuned
to say "this looks like a code/debug task" without reading the prompt for meaning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sidecar.config.policy import PromptFeature

# Characters rare in prose. A marker that contains one cannot occur in text without it, and
# a one-character search (memchr) costs a tenth of a short marker's: test that first.
_RARE = "`@#}{;\t\"(_|\\-qjzxk:"


class _Family:
    """Markers that share a part: the part is searched once, the markers only when it is
    there (one scan of a prompt without it instead of one per marker)."""

    __slots__ = ("markers", "part")

    def __init__(self, part: str, *markers: str) -> None:
        assert all(part in marker for marker in markers)
        self.part = part
        self.markers = markers

    def found_in(self, lowered: str) -> bool:
        return self.part in lowered and any(marker in lowered for marker in self.markers)


def _any(*markers: str | _Family) -> Callable[[str], bool]:
    plain = tuple(m for m in markers if isinstance(m, str))
    families = tuple(m for m in markers if isinstance(m, _Family))
    gated = tuple((next((c for c in _RARE if c in marker), ""), marker) for marker in plain)

    def found(lowered: str) -> bool:
        # A plain loop: `any()` over a generator costs a fifth more, on every request.
        for rare, marker in gated:
            if rare in lowered and marker in lowered:
                return True
        for family in families:  # noqa: SIM110
            if family.found_in(lowered):
                return True
        return False

    return found


def _named_error(lowered: str) -> bool:
    """`SomethingError: ` / `SomeException: `: a marker right after a letter."""
    if ":" not in lowered:  # both markers end in ": " (see _RARE)
        return False
    for marker in ("error: ", "exception: "):
        start = lowered.find(marker)
        while start > 0:
            if lowered[start - 1].isalpha():
                return True
            start = lowered.find(marker, start + 1)
    return False


def _indented_statement(lowered: str) -> bool:
    """An indented line that assigns or calls (`    x = f(y)`): pasted code."""
    for indent in ("\n    ", "\n\t"):
        start = lowered.find(indent)
        while start >= 0:
            line_end = lowered.find("\n", start + 1)
            line = lowered[start + 1:line_end if line_end >= 0 else len(lowered)].strip()
            head = line.split(" ", 1)[0]
            if head and (" = " in line[:80] or "(" in head) and head[0].isalpha():
                return True
            start = lowered.find(indent, start + 1)
    return False


# Each marker costs one linear scan (about 0.5 µs per KB of sample), so the lists are short.
# Code markers have the shape of code, not words prose uses too: "return ", "function " and
# "import " matched "what is the function of the liver?" (issue #31.3); names of languages
# and query kinds say a prompt asks for code even before it shows any.
_CODE_MARKERS = _any("```", "\ndef ", "\nclass ", "\nimport ", "#include", "\nfunction ",
                     "function(", "};", ") {", "    return ", "\treturn ", "=> {")
# A request for code names what it wants ("a python function", "a sql query", "a regex") in
# its instruction, which is at the start or the end of a prompt: looked for there only, so
# this costs the same on a 16 KB prompt as on a short one.
_CODE_REQUEST = _any("python", "javascript", " sql", "regex", "regular expression")
INSTRUCTION_CHARS = 512


def _code(lowered: str) -> bool:
    if _CODE_MARKERS(lowered) or _indented_statement(lowered):
        return True
    if len(lowered) <= 2 * INSTRUCTION_CHARS:
        return _CODE_REQUEST(lowered)
    return (_CODE_REQUEST(lowered[:INSTRUCTION_CHARS])
            or _CODE_REQUEST(lowered[-INSTRUCTION_CHARS:]))
_STACK_MARKERS = _any("traceback (most", "exception in thread", "\n\tat ", "\n    at ",
                      "goroutine ", '", line ', "panic: ")

_DETECTORS: dict[PromptFeature, Callable[[str], bool]] = {
    PromptFeature.CODE: _code,
    PromptFeature.DIFF: _any("diff --git ", "\n@@ -"),
    PromptFeature.STACK_TRACE: lambda s: _STACK_MARKERS(s) or _named_error(s),
    PromptFeature.SUMMARIZE: _any("summar", "tl;dr", "condense"),
    PromptFeature.EXTRACT: _any("extract", "pull out"),
    # Security work, not the words: "dependency injection" and "exploit the good weather"
    # are neither.
    PromptFeature.SECURITY_REVIEW: _any("vulnerab", "cve-", "xss", "threat model",
                                        _Family("injection", "sql injection",
                                                "command injection", "prompt injection"),
                                        _Family("security ", "security review",
                                                "security audit")),
    PromptFeature.TOOL_AGENT: _any("available tools", "use the tool", "you are an agent",
                                   "autonomous agent"),
}


def detector(features: Iterable[PromptFeature]) -> Callable[[str], set[PromptFeature]]:
    """The scan for a fixed list of features, resolved once (per group, at load)."""
    checks = tuple((feature, _DETECTORS[feature]) for feature in features)

    def detect_in(sample: str) -> set[PromptFeature]:
        # A leading newline lets line-start markers ("\ndef ") match on the first line too.
        lowered = "\n" + sample.lower()
        return {feature for feature, check in checks if check(lowered)}

    return detect_in
