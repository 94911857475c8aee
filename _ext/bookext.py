"""The book's Sphinx extension: API-page fixes, and one fix to Sphinx 7.4's page scripts.

The library's docstrings refer to its public API the way users call it, ``parmem.estimate`` or
``parmem.ModelSpec.mlp_params``, and within a package by short name (``Pool`` in
``parmem.distributed``). The API page documents each object once, where it is defined
(``parmem.estimate.estimate``). When a Python cross-reference finds no target, this looks the
name up by importing it, and retries with the object's canonical ``module.qualname``.

Second, napoleon reads the first line of a constant's ``#:`` comment or of a property's
docstring as ``type: description``, so "optimizer states per parameter (adam-8bit: 1 byte)"
would become a type. When the text before the first colon cannot be a type (unbalanced
brackets, or a phrase), the line is kept as prose.
And an ``Attributes:`` entry naming several fields at once ("p, m, v: the inputs") becomes one
entry per field, which napoleon can render.

Last, Sphinx 7.4 writes an inline script that an extension adds after the builder starts twice
(once as registered, once re-read from the registry with ``filename=''``). sphinx-thebe's
``const THEBE_JS_URL = ...`` then throws "Identifier has already been declared" on every page.
The copies are dropped before each page is written.

And two build-speed fixes that leave the output as it was: pybtex looks up its plugins by
scanning the entry points of every installed distribution on each call, and sphinxcontrib-bibtex
asks at every citation (:func:`_read_pybtex_entry_points_once`); MyST builds docutils' default
settings anew for every text it parses, some 3,000 times in the Chinese edition, whose every
translated message is parsed on its own (:func:`_build_myst_default_settings_once`).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import re

from sphinx.application import Sphinx


def _locate(dotted: str) -> str | None:
    """Canonical dotted name of ``dotted`` if it imports as a parmem object, else None."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:  # noqa: BLE001 (not a module: try a shorter prefix)
            continue
        owner, rest = obj, []
        for name in parts[i:]:
            try:
                obj = getattr(obj, name)
            except AttributeError:
                return None
            if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj):
                owner, rest = obj, []
            else:
                rest.append(name)
        if inspect.ismodule(owner):
            base = owner.__name__
        else:
            base = f"{owner.__module__}.{owner.__qualname__}"
        canonical = ".".join([base, *rest])
        return canonical if canonical.startswith("parmem") else None
    return None


def _missing_reference(app: Sphinx, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    candidates = [target]
    module = node.get("py:module")
    if module and not target.startswith("parmem"):
        candidates.insert(0, f"{module}.{target}")
    for candidate in candidates:
        canonical = _locate(candidate) if candidate.startswith("parmem") else None
        if not canonical or canonical == target:
            continue
        domain = env.get_domain("py")
        new = node.deepcopy()
        new["reftarget"] = canonical
        new["refspecific"] = False
        found = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                    canonical, new, contnode)
        if found is None and node["reftype"] in ("func", "meth", "class", "data", "attr"):
            found = domain.resolve_any_xref(env, node["refdoc"], app.builder, canonical,
                                            new, contnode)
            found = found[0][1] if found else None
        if found is not None:
            return found
    return None


def _looks_like_type(text: str) -> bool:
    """'int', 'dict[str, int]', 'int or None', 'list of str' are types; a phrase is not."""
    depth, words, current = 0, [], ""
    for ch in text:
        depth += ch in "[("
        depth -= ch in "])"
        if depth < 0:
            return False
        if ch == " " and depth == 0:
            words.append(current)
            current = ""
        else:
            current += ch
    words.append(current)
    if depth != 0:
        return False
    names, joins = words[0::2], words[1::2]
    return all(w and (w[0].isalpha() or w[0] == "_") for w in names) and all(
        j in ("or", "of", "|") for j in joins
    )


def _protect_doc_comment(app: Sphinx, what, name, obj, options, lines) -> None:
    if what not in ("data", "attribute", "property") or not lines:
        return
    before, colon, _ = lines[0].partition(": ")
    if colon and not _looks_like_type(before):
        lines[0] = ": " + lines[0]  # napoleon then finds an empty type and keeps the text


_SECTION = re.compile(r"^(\s*)[A-Z][A-Za-z ]*:\s*$")
_MULTI = re.compile(r"^(\s+)(\w+(?:\s*,\s*\w+)+)\s*:\s*(.*)$")


def _split_attribute_entries(app: Sphinx, what, name, obj, options, lines) -> None:
    out, in_attributes, indent = [], False, ""
    for line in lines:
        section = _SECTION.match(line)
        if section:
            in_attributes = line.strip() == "Attributes:"
            indent = section.group(1)
        elif in_attributes and line.strip() and not line.startswith(indent + " "):
            in_attributes = False
        multi = _MULTI.match(line) if in_attributes else None
        if multi:
            out.extend(f"{multi.group(1)}{field.strip()}: {multi.group(3)}"
                       for field in multi.group(2).split(","))
        else:
            out.append(line)
    lines[:] = out


def _drop_duplicate_inline_scripts(app: Sphinx, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen, keep = set(), []
    for js in scripts:
        body = getattr(js, "attributes", {}).get("body") if not getattr(js, "filename", "x") else None
        if body is not None:
            key = (body, tuple(sorted((k, v) for k, v in js.attributes.items() if k != "body")))
            if key in seen:
                continue
            seen.add(key)
        keep.append(js)
    scripts[:] = keep


def _read_pybtex_entry_points_once() -> None:
    """pybtex 0.26's ``find_plugin`` calls ``importlib.metadata.entry_points(group=, name=)``,
    which reads the entry points of every installed distribution, on each call;
    sphinxcontrib-bibtex's own ``find_plugin`` does the same, and both are asked at every
    citation rendered: about 280 calls, 2 s of CPU per edition in this environment (hundreds
    of distributions). Nothing is installed during a build, so the entry points are read once
    and each lookup selects from them: the same plugins, found the same way (plugins
    registered at run time are still checked first)."""
    try:
        import pybtex.plugin
        import sphinxcontrib.bibtex.plugin
    except ImportError:  # no sphinxcontrib-bibtex: nothing to speed up
        return
    from importlib.metadata import entry_points

    every = entry_points()
    for module in (pybtex.plugin, sphinxcontrib.bibtex.plugin):  # its referencing styles too
        module.entry_points = lambda **select: every.select(**select)


def _build_myst_default_settings_once() -> None:
    """myst-parser 3.0's renderer calls ``make_document()`` for every text it parses, even when
    it is handed the document to render into (``options.get("document", make_document())``),
    and each call builds docutils' default settings from scratch (an ``OptionParser`` of every
    component's options): 3,000 calls, some 4 s of CPU, in the Chinese edition, where Sphinx
    parses each translated message separately. The defaults are built once per parser class;
    each new document still gets its own (deep) copy of them."""
    try:
        from docutils.frontend import get_default_settings
        from docutils.parsers.rst import Parser as RSTParser
        from docutils.utils import new_document
        from myst_parser.mdit_to_docutils import base
    except ImportError:
        return
    defaults: dict[type, object] = {}

    def make_document(source_path="notset", parser_cls=RSTParser):
        if parser_cls not in defaults:
            defaults[parser_cls] = get_default_settings(parser_cls)
        return new_document(source_path, settings=copy.deepcopy(defaults[parser_cls]))

    base.make_document = make_document


def setup(app: Sphinx) -> dict:
    _read_pybtex_entry_points_once()
    _build_myst_default_settings_once()
    app.connect("missing-reference", _missing_reference)
    # before napoleon (priority 500) rewrites the docstring
    app.connect("autodoc-process-docstring", _protect_doc_comment, priority=400)
    app.connect("autodoc-process-docstring", _split_attribute_entries, priority=400)
    app.connect("html-page-context", _drop_duplicate_inline_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
