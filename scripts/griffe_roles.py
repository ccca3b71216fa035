"""Griffe extension for the documentation site (mkdocs.yml): docstrings here use reST roles
(``:func:`equalize_model```, ``:class:`FoldedPair```), which Markdown would show literally.
They are rendered as inline code, the name alone, and a paragraph ending in reST's literal-block
marker ``::`` ends in one colon (the indented block after it is code in Markdown too). The
docstrings themselves are unchanged."""

from __future__ import annotations

import re

import griffe

ROLE_RE = re.compile(r":(?:func|class|meth|attr|data|mod|obj|exc):`~?([^`]+)`")
LITERAL_MARKER_RE = re.compile(r"(?<=\S)::$", re.MULTILINE)


class ReSTRoles(griffe.Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            value = ROLE_RE.sub(r"`\1`", obj.docstring.value)
            obj.docstring.value = LITERAL_MARKER_RE.sub(":", value)
