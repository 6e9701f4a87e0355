"""Panel in a notebook with no network: every JavaScript and CSS resource inline.

Panel's default notebook setup asks cdn.bokeh.org and cdn.holoviz.org for Bokeh, Panel and
Tabulator; offline (a training cluster) the widgets then stay blank. :func:`extension` loads
them from the installed packages instead, in JupyterLab, Notebook 7 and VS Code alike.
"""

from __future__ import annotations

from typing import Any

__all__ = ["extension"]


def extension(*extensions: str, **params: Any) -> None:
    """Load Panel (with Tabulator) and HoloViews' Bokeh backend, resources inline, no CDN.

    Call it once, in a notebook's first cell. More Panel extensions and ``pn.extension``
    parameters pass through. HoloViews objects (hvplot) are then shown as Panel panes, whose
    stylesheets are inlined too.
    """
    import holoviews as hv
    import panel as pn

    hv.extension.inline = True  # hvplot and later hv.extension() calls load inline too
    hv.extension("bokeh", logo=False)
    pn.extension("tabulator", *extensions, inline=True, **params)
    _show_holoviews_as_panel()
    _later_stylesheets_from_the_jupyter_server()


#: where Panel's Jupyter server extension (shipped with panel) serves Panel's own files
JUPYTER_DIST = "/panel-preview/static/extensions/panel/"


def _later_stylesheets_from_the_jupyter_server() -> None:
    """Stylesheets that join a displayed page later (a loading spinner, a table or message
    built by a callback) come from the Jupyter server, not the CDN.

    Panel inlines a page's stylesheets when it is displayed, but resolves those sent later
    against its document's ``dist_url``, which is the CDN unless set (as ``panel serve`` does).
    """
    import panel.viewable as viewable

    original = viewable.patch_inline_stylesheets
    if getattr(original, "_ckptview", False):
        return

    def patch(model: Any) -> None:
        original(model)
        doc = model.document
        if doc is not None:
            doc._template_variables["dist_url"] = JUPYTER_DIST

    patch._ckptview = True  # type: ignore[attr-defined]
    viewable.patch_inline_stylesheets = patch


def _show_holoviews_as_panel() -> None:
    """Route HoloViews' notebook display through Panel, which inlines component stylesheets."""
    import panel as pn
    from holoviews.core.dimension import LabelledData
    from holoviews.core.options import Store

    hooks = Store._display_hooks["html+js"]
    original = hooks.get(LabelledData)
    if getattr(original, "_ckptview", False):
        return

    def display(obj: Any) -> Any:
        if Store.current_backend != "bokeh" or "html" not in Store.display_formats:
            return original(obj) if original else None
        bundle = pn.panel(obj)._repr_mimebundle_()
        return bundle if isinstance(bundle, tuple) else original(obj) if original else None

    display._ckptview = True  # type: ignore[attr-defined]
    Store.set_display_hook("html+js", LabelledData, display)
