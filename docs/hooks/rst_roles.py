"""A griffe extension: the docstrings' Sphinx roles (:class:`X`, :meth:`~a.b.c`) shown as code on the site.

The package's Google docstrings name other objects with Sphinx roles, which Markdown would print as written
(":class:" before the name). Each role becomes inline code of the name, the last component for a "~" name, as
Sphinx shows it. The docstrings themselves stay as they are (others edit the package).
"""

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|data|attr|mod|obj|exc|math):`(~?)([^`]+)`")


def as_code(match: re.Match) -> str:
    short, name = match.groups()
    return f"`{name.rsplit('.', 1)[-1] if short else name}`"


class RstRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(as_code, obj.docstring.value)
