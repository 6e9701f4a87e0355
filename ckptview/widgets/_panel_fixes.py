"""Fixes for Panel's serving path (Panel 1.9.4, Bokeh 3.9.2, the newest at the time of writing).

**The message writer.**

Changes made while a page's earlier messages are still being written are queued by Panel
(``panel.io.document.schedule_write_events``) and sent by a task, ``_dispatch_msgs``. That
task lifts the document's write block after awaiting its own writes, without looking at what
was queued meanwhile; the task scheduled for those messages then finds no block and returns.
The queued messages stay unsent until some later change on the page happens to flush them: an
action's result (a diff, a verify, a plan) and the end of its loading spinner are lost with them.
Seen on a busy server (2 cores, Chromium beside it) about once in 40 actions.

:func:`apply` wraps ``_dispatch_msgs``: when it returns with messages still queued and no write
under way, it sends them.

**The resources of every page.** Each page GET lists the CSS and JS of every loaded custom
component class (``Resources.extra_resources``): for panel-material-ui's hundred-odd
classes that is a path computation per class and per resource kind, ~40 ms of a page's
~0.7 s of server CPU, the same answer every time. :func:`cache_component_resources`
remembers the answer per resource kind, mode, path prefix, CDN and set of loaded classes
(a class loaded later makes a new set, so its resources are listed).

**The model definitions of every page.** Bokeh sends the definition of every data model class
the process knows (``Document.to_json``: each class's properties and their encoded defaults)
with each page's document. With panel-material-ui loaded that is ~145 classes, ~150 KB and
~12 ms of a page's server CPU, the same answer every time. :func:`cache_model_definitions`
encodes a class's properties once and reuses them; a class whose defaults refer to models or
buffers (none in Panel or panel-material-ui) is encoded each time, as Bokeh does.

**No module imported by a URL.** ``/components/<module>/<class>/<attr>/<path>`` (Panel's
``ComponentResourceHandler``) calls ``importlib.import_module(<module>)`` on the URL's text
before checking anything: any visitor, before any login, could import any installed module
(``this`` prints, a ``__main__`` may exit the server). :func:`refuse_module_imports` answers
``404`` unless the module is already in ``sys.modules`` (a component class of the page is
always loaded), so a request can only read resources of code the server already runs.

**Modules loaded by the browser itself.** Panel's pages tell es-module-shims to run in *shim
mode* (``<script type="esms-options">{"shimMode": true}</script>``): every ES module a
component loads is fetched by the shim, lexed by its WebAssembly lexer, rewritten into a
``blob:`` URL and compiled from there. For panel-material-ui's self-contained 1.4 MB bundle
that was ~0.2 s of a fresh page's renderer CPU on this machine (on a 2-core server with 20
pages opening at once, the browsers' work is most of the wait). :func:`load_modules_natively`
makes served pages start the shim in *polyfill mode*: where the browser supports ES modules
and import maps (every current one) ``importShim(url)`` is the browser's own ``import()``
(streamed, compiled off the main thread). The cost: an import map cannot be added later, so a
component that is not bundled and imports bare names (panel-material-ui's user-defined
``MaterialComponent``; none on ckptview's pages) would not load; Panel logs "Failed to add
import map" for the bundled ones, which need none.

**Data models tagged without walking the page.** Each custom component's model (every
panel-material-ui component, a ``ReactiveHTML``) tags the data models it refers to with its
root (``ReactiveCustomBase._patch_datamodel_ref``, so that a parameter's change finds its
document). Panel looks for them with ``Model.select``: a walk of every model below, children
included, for each such component as it is built and again on each change of its children
(a tab switched). On a page whose ``Page`` holds the ``Tabs`` holding the tables, that walked
the whole document twice per page, 3 % of its server CPU. The children's data models are tagged
by the children themselves, with the same root, as they are built: :func:`tag_data_models_locally`
tags those the component refers to without passing through a child (a UI element).

**Serialised properties read only when sent.** Bokeh encodes a model with the properties set
on it (``HasProps.query_properties_with_values(..., include_defaults=False)``), but reads the
value of every property first, computing and checking the default of each one it then drops
(its own ``TODO``). A layout has ~40 properties, a few of them set: that was 70 % of encoding a
page's document, ~5 % of its server CPU. :func:`read_set_properties_only` reads only the
properties it returns; one without a default is still read (and raises, as Bokeh's does).

**Tables that wait a frame, not a spin.** A Tabulator's view redraws itself once its page
settles (``_flush_resize_when_root_ready``): until its stylesheets are loaded, its first draw
is done and its scroll restored, it waits by ``defer()``, one message-channel turn at a time,
thousands of turns a second. While a page loads that spins the browser's main thread; on a
busy server, where the page's stylesheets come late, it spins for the whole wait (1 s of the
main thread per page in a burst of 20 here), and the spinning browsers take the cores the
server needs to answer them. :func:`pace_table_resizes` has served pages wait a frame
(``requestAnimationFrame``) between the checks instead; what is checked and done is Panel's.
It replaces the method only where its source is the one described here.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

_APPLIED = "_ckptview_flushes_queued"
_CACHED = "_ckptview_cached"
_DEFINED = "_ckptview_defined"
_LOCAL = "_ckptview_tags_locally"
_SET_ONLY = "_ckptview_set_properties_only"
LOADED_ONLY = "_ckptview_loaded_modules_only"
_NATIVE = "native modules"
_PACED = "paced resizes"
_CHANGES = "_ckptview_changes"  # on the page template: (its source, the changes made to it)
SHIM_MODE = '<script type="esms-options">{"shimMode": true}</script>'
POLYFILL_MODE = '<script type="esms-options">{"shimMode": false}</script>'
#: run after Panel's JavaScript: the Tabulator view's wait for a settled page, a frame at a time
PACED_RESIZES = """<script type="text/javascript">
(() => {
  const model = window.Bokeh?.Models?.get?.("panel.models.tabulator.DataTabulator");
  const view = model?.prototype?.default_view?.prototype;
  const known = String(view?._flush_resize_when_root_ready ?? "");
  if (!known.includes("defer)()") || !known.includes("_initialized_stylesheets")) return;
  const frame = () => new Promise((resolve) => requestAnimationFrame(() => resolve()));
  view._flush_resize_when_root_ready = async function () {
    for (;;) {
      if (!this._resize_pending) return;
      await this.root.ready;
      if (!this._resize_pending) continue;
      const busy = this._is_scrolling || this._initializing || this.container === null ||
        this.is_drawing || this._has_active_editor();
      if (!busy && [...this._initialized_stylesheets.values()].every((done) => done)) {
        this._resize_pending = false;
        this._resize_redraw();
        return;
      }
      await frame();
    }
  };
})();
</script>
"""


def apply() -> bool:
    """Patch ``panel.io.document._dispatch_msgs`` (once); False when Panel has no such writer."""
    from panel.io import document

    original = getattr(document, "_dispatch_msgs", None)
    if original is None or getattr(original, _APPLIED, False):
        return False
    for name in ("_WRITE_BLOCK", "_WRITE_MSGS", "_dispatch_write_task"):
        if not hasattr(document, name):
            return False

    @functools.wraps(original)
    async def dispatch_msgs(doc) -> None:
        await original(doc)
        if doc not in document._WRITE_BLOCK and document._WRITE_MSGS.get(doc):
            document._WRITE_BLOCK[doc] = True  # as schedule_write_events does
            document._dispatch_write_task(doc, dispatch_msgs, doc)

    setattr(dispatch_msgs, _APPLIED, True)
    document._dispatch_msgs = dispatch_msgs
    return True


def cache_component_resources() -> bool:
    """Patch ``panel.io.resources.Resources.extra_resources`` (once) to answer from a cache;
    False when Panel has no such method."""
    from panel.config import config
    from panel.io import resources
    from panel.io.state import state
    from panel.reactive import ReactiveCustomBase

    original = getattr(resources.Resources, "extra_resources", None)
    descendents = getattr(resources, "_descendents", None)
    if original is None or descendents is None or getattr(original, _CACHED, False):
        return False
    answers: dict[tuple, tuple[str, ...]] = {}

    @functools.wraps(original)
    def extra_resources(self, found: list, resource_type: str) -> None:
        loaded = tuple(c for c in descendents(ReactiveCustomBase, concrete=True) if c._loaded())
        key = (resource_type, self.mode, state.rel_path, config.npm_cdn, loaded)
        answer = answers.get(key)
        if answer is None:
            listed: list = []
            original(self, listed, resource_type)
            answer = answers[key] = tuple(listed)
        for resource in answer:
            if resource not in found:
                found.append(resource)

    setattr(extra_resources, _CACHED, True)
    resources.Resources.extra_resources = extra_resources
    return True


def cache_model_definitions() -> bool:
    """Patch Bokeh's encoder of model classes (once) to reuse each data model's encoded
    properties; False when it was patched already or Bokeh has no such encoder."""
    import weakref

    from bokeh.core.has_props import MetaHasProps, is_DataModel
    from bokeh.core.serialization import Ref, Serializer
    from bokeh.model import DataModel, Model

    original = Serializer._encoders.get(MetaHasProps)
    if original is None or getattr(original, _DEFINED, False):
        return False
    #: class -> its encoded (properties, overrides), or None when they must be encoded each time
    known: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    classes = Model.model_class_reverse_map  # qualified name -> class: the ids of class refs

    def encoded_body(cls) -> tuple[list, list] | None:
        if cls not in known:
            probe = Serializer()  # alone: what encoding the class refers to, and its buffers
            rep = encode_class.__wrapped__(cls, probe)
            plain = not probe.buffers and all(ref["id"] in classes
                                              for ref in probe._references.values())  # fmt: skip
            known[cls] = (rep.get("properties", []), rep.get("overrides", [])) if plain else None
        return known[cls]

    @functools.wraps(original)
    def encode_class(cls, serializer: Serializer):
        bases = [b for b in cls.__bases__ if issubclass(b, Model) and b is not DataModel]
        body = encoded_body(cls) if is_DataModel(cls) and len(bases) <= 1 else None
        if body is None:
            return encode_class.__wrapped__(cls, serializer)
        serializer.add_ref(cls, Ref(id=cls.__qualified_model__))
        rep = {"type": "model", "name": cls.__qualified_model__}
        if bases:
            rep["extends"] = serializer.encode(bases[0])
        properties, overrides = body
        if properties:
            rep["properties"] = properties
        if overrides:
            rep["overrides"] = overrides
        return rep

    setattr(encode_class, _DEFINED, True)
    encode_class.known = known  # type: ignore[attr-defined]
    Serializer._encoders[MetaHasProps] = encode_class
    return True


def _unpatched(method, flag: str, *lines: str) -> bool:
    """Whether ``method`` is the library's own (not marked with ``flag``) and its source
    holds every one of ``lines`` (the code a fix replaces is the code it was written for)."""
    import inspect

    if getattr(method, flag, False):
        return False
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError):
        return False
    return all(line in source for line in lines)


def tag_data_models_locally() -> bool:
    """Patch ``panel.reactive.ReactiveCustomBase._patch_datamodel_ref`` (once) to tag the data
    models its ``props`` refers to without descending into UI elements; False when patched
    already or Panel's method is not the one described above."""
    from bokeh.model import DataModel
    from bokeh.model.util import collect_filtered_models
    from bokeh.models import UIElement
    from panel.reactive import ReactiveCustomBase

    original = ReactiveCustomBase._patch_datamodel_ref
    if not _unpatched(original, _LOCAL, "props.select({'type': DataModel})"):
        return False

    def patch_datamodel_ref(cls, props, ref) -> None:
        tag = f"__ref:{ref}"
        for model in collect_filtered_models(lambda m: isinstance(m, UIElement), props):
            if isinstance(model, DataModel) and tag not in model.tags:
                model.tags.append(tag)

    patch_datamodel_ref.__doc__ = original.__doc__
    patch_datamodel_ref.__wrapped__ = original.__func__  # type: ignore[attr-defined]
    setattr(patch_datamodel_ref, _LOCAL, True)
    ReactiveCustomBase._patch_datamodel_ref = classmethod(patch_datamodel_ref)
    return True


def read_set_properties_only() -> bool:
    """Patch ``bokeh.core.has_props.HasProps.query_properties_with_values`` (once) so that,
    without defaults, it reads only the properties it returns; False when patched already or
    Bokeh's method is not the one described above."""
    from bokeh.core.has_props import HasProps
    from bokeh.core.property.descriptors import UnsetValueError
    from bokeh.core.property.singletons import Undefined
    from bokeh.core.property.wrappers import PropertyValueContainer

    original = HasProps.query_properties_with_values
    if not _unpatched(original, _SET_ONLY, "value = descriptor.get_value(self)",
                      "if key not in selected_keys:"):  # fmt: skip
        return False

    @functools.wraps(original)
    def query_properties_with_values(self, query, *, include_defaults: bool = True,
                                     include_undefined: bool = False) -> dict:  # fmt: skip
        if include_defaults:
            return original(self, query, include_defaults=True, include_undefined=include_undefined)
        selected = set(self._property_values) | set(self._unstable_default_values)
        themed = self.themed_values()
        themed_keys = set(themed) if themed is not None else set()
        selected |= themed_keys
        result = {}
        for key in self.properties(_with_props=True):
            descriptor = self.lookup(key)
            if not query(descriptor):
                continue
            if key not in selected:
                if descriptor.property._default is Undefined and not include_undefined:
                    descriptor.get_value(self)  # unset and no default: raises, as in Bokeh
                continue
            try:
                value = descriptor.get_value(self)
            except UnsetValueError:
                if not include_undefined:
                    raise
                value = Undefined
            else:
                if (key not in themed_keys and isinstance(value, PropertyValueContainer)
                        and key in self._unstable_default_values):  # fmt: skip
                    continue
            result[key] = value
        return result

    setattr(query_properties_with_values, _SET_ONLY, True)
    HasProps.query_properties_with_values = query_properties_with_values
    return True


def refuse_module_imports() -> bool:
    """Patch ``panel.io.server.ComponentResourceHandler.parse_url_path`` (once) to answer
    ``404`` for a module not already loaded; False when it was patched already."""
    from panel.io.server import ComponentResourceHandler
    from tornado.web import HTTPError

    original = ComponentResourceHandler.parse_url_path
    if getattr(original, LOADED_ONLY, False):
        return False

    @functools.wraps(original)
    def parse_url_path(self, path: str) -> str:
        if path.split("/", 1)[0] not in sys.modules:  # never import what a URL names
            raise HTTPError(404, "Module not loaded")
        return original(self, path)

    setattr(parse_url_path, LOADED_ONLY, True)
    ComponentResourceHandler.parse_url_path = parse_url_path
    return True


def _page_template(flag: str, change: Callable[[str], str | None]) -> bool:
    """Render served pages' resources from ``change(source)`` of the template's source as
    patched so far (once per ``flag``); False when applied already or ``change`` returns None."""
    from panel.io import resources

    template = resources.JS_RESOURCES
    source, done = getattr(template, _CHANGES, (None, frozenset()))
    if flag in done:
        return False
    if source is None:
        source = resources._env.loader.get_source(resources._env, template.name)[0]
    changed = change(source)
    if changed is None:
        return False
    patched = resources._env.from_string(changed)
    patched.name = template.name
    setattr(patched, _CHANGES, (changed, done | {flag}))
    resources.JS_RESOURCES = patched
    return True


def load_modules_natively() -> bool:
    """Make the pages Panel renders start es-module-shims in polyfill mode (their ES modules
    loaded by the browser's ``import()``); False when done already or Panel's template no
    longer sets shim mode (then nothing changes)."""
    return _page_template(_NATIVE, lambda source: source.replace(SHIM_MODE, POLYFILL_MODE)
                          if source.count(SHIM_MODE) == 1 else None)  # fmt: skip


def pace_table_resizes() -> bool:
    """Add :data:`PACED_RESIZES` after the JavaScript of the pages Panel renders (once);
    False when done already."""
    return _page_template(_PACED, lambda source: source + PACED_RESIZES)
