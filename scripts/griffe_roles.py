"""Griffe extension for the documentation site (mkdocs.yml): docstrings here use reST roles
(``:func:`equalize_model```, ``:class:`FoldedPair```), which Markdown would show literally.
They are rendered as inline code, the name alone; the docstrings themselves are unchanged."""

from __future__ import annotations

import re

import griffe

ROLE_RE = re.compile(r":(?:func|class|meth|attr|data|mod|obj|exc):`~?([^`]+)`")


class ReSTRoles(griffe.Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE_RE.sub(r"`\1`", obj.docstring.value)
