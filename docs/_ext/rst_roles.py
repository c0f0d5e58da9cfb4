"""A griffe extension for the API reference: cuvmap's docstrings use reST's roles
(``:func:`~cuvmap.dp.clipped_sum```) and literal-block markers (``Example::``), which
Markdown shows as they are. This turns a role into inline code of its target (the last
name for ``~target``) and ``Word::`` before an indented block into ``Word:``, so the
docstrings read as Markdown. mkdocs.yml loads it (mkdocstrings' ``extensions``)."""
import re

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(\S)::\s*$", re.M)


def _markdown(text):
    text = _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)
    return _LITERAL.sub(r"\1:", text)


class RstRoles(griffe.Extension):
    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = _markdown(obj.docstring.value)
