"""A griffe extension: the docstrings' Sphinx roles (:class:`X`, :meth:`~a.b.c`) shown as code on the site.

The package's Google docstrings name other objects with Sphinx roles, which Markdown would print as written
(":class:" before the name). Each role becomes inline code of the name, the last component for a "~" name, as
Sphinx shows it. Placeholders in plain text ("default: <json folder>/figures") would be read as HTML tags and
vanish: they are escaped. The docstrings themselves stay as they are (others edit the package).
"""

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|data|attr|mod|obj|exc|math):`(~?)([^`]+)`")
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
PLACEHOLDER = re.compile(r"<(\w[\w .,/=-]*)>")


def as_code(match: re.Match) -> str:
    """One role as inline code of its name."""
    short, name = match.groups()
    return f"`{name.rsplit('.', 1)[-1] if short else name}`"


def escape_placeholders(text: str) -> str:
    """``<run folder>`` outside code spans as text, not as an HTML tag."""
    pieces, last = [], 0
    for span in CODE_SPAN.finditer(text):
        pieces += [PLACEHOLDER.sub(r"&lt;\1&gt;", text[last : span.start()]), span.group(0)]
        last = span.end()
    return "".join([*pieces, PLACEHOLDER.sub(r"&lt;\1&gt;", text[last:])])


class RstRoles(griffe.Extension):
    """Rewrites every docstring as it is loaded, before mkdocstrings parses it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = escape_placeholders(ROLE.sub(as_code, obj.docstring.value))
