"""Panel's queued page messages are all sent, and the resources every page lists come from a
cache that answers as Panel would (``ckptview.widgets._panel_fixes``).

Panel's own writer, driven through its real functions with a socket type registered the way
Panel's extension point expects: messages queued while an earlier write is awaited, in the
order of events that lost an action's result on a busy server.
"""

from __future__ import annotations

import asyncio

import pandas as pd
import pytest
from bokeh.document import Document
from panel.io import document as panel_doc

import ckptview.widgets  # noqa: F401 - applies the fix
from ckptview.widgets import _panel_fixes


class Socket:
    """A websocket whose writes complete when the test says so."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.pending: list[asyncio.Future] = []

    def write(self, conn, msg=None) -> list[asyncio.Future]:
        self.sent.append(msg)
        done = asyncio.get_running_loop().create_future()
        self.pending.append(done)
        return [done]


class Protocol:
    def create(self, kind: str, events: list) -> str:
        return f"{kind}:{','.join(events)}"


class Connection:
    def __init__(self, socket: Socket) -> None:
        self._socket = socket
        self.protocol = Protocol()


@pytest.fixture
def socket(monkeypatch):
    sock = Socket()
    monkeypatch.setitem(panel_doc.extra_socket_handlers, Socket, sock.write)
    return sock


async def queued_while_writing(socket: Socket) -> list[str]:
    """Queue a message, let its write start, finish that write, queue a second one (its task
    runs after the first task resumes), and return what was sent."""
    doc, conn = Document(), Connection(socket)
    panel_doc.schedule_write_events(doc, [conn], ["loading=True"])
    for _ in range(5):
        await asyncio.sleep(0)  # the first task writes and awaits its write
    assert socket.sent == ["PATCH-DOC:loading=True"]
    socket.pending[0].set_result(None)  # the first task resumes next, before the new task
    panel_doc.schedule_write_events(doc, [conn], ["rows", "loading=False"])
    for _ in range(20):
        await asyncio.sleep(0.01)
        for f in socket.pending:
            if not f.done():
                f.set_result(None)
    return socket.sent


def test_messages_queued_during_a_write_are_sent(socket):
    assert getattr(panel_doc._dispatch_msgs, "_ckptview_flushes_queued", False)
    sent = asyncio.run(queued_while_writing(socket))
    assert sent == ["PATCH-DOC:loading=True", "PATCH-DOC:rows,loading=False"]


def test_without_the_fix_panel_strands_them(socket, monkeypatch):
    """The failure the fix is for, reproduced with Panel's unpatched writer (if a Panel
    release fixes it, this test fails and the fix can go)."""
    original = panel_doc._dispatch_msgs.__wrapped__
    monkeypatch.setattr(panel_doc, "_dispatch_msgs", original)
    sent = asyncio.run(queued_while_writing(socket))
    assert sent == ["PATCH-DOC:loading=True"]  # "rows, loading=False" never written


def test_apply_is_idempotent():
    assert _panel_fixes.apply() is False  # already applied on import


# -- the resources every page lists --------------------------------------------------------------
def _bundle() -> tuple:
    from panel.io.resources import Resources

    r = Resources(mode="server")
    return r.css_files, r.js_files, r.js_modules, r.css_raw


def test_page_resources_come_from_the_cache_and_equal_panels_own(monkeypatch):
    import panel as pn
    from panel.io import resources
    from panel.io.resources import Resources

    pn.extension("tabulator")
    import ckptview.widgets.shell.app  # noqa: F401 - every component class the dashboard loads

    patched = Resources.extra_resources
    assert getattr(patched, _panel_fixes._CACHED, False)
    paths = []  # each class's resource paths, computed by Panel's own listing
    real = resources.component_resource_path
    monkeypatch.setattr(resources, "component_resource_path",
                        lambda *a: paths.append(a) or real(*a))  # fmt: skip
    cached = _bundle()
    paths.clear()
    again = _bundle()
    assert paths == []  # a page after the first: nothing computed again
    monkeypatch.setattr(Resources, "extra_resources", patched.__wrapped__)  # Panel's own
    own = _bundle()
    assert len(paths) > 50  # … which Panel's own listing does for every page
    assert cached == again == own
    assert any("material" in f for f in own[0])  # not vacuous: panel-material-ui's CSS listed


def test_a_component_class_made_later_gets_its_resources_listed():
    from panel.custom import ReactiveHTML

    before = _bundle()[0]

    class LateComponent(ReactiveHTML):  # a component module imported after the first page
        __css__ = ["https://example.invalid/late-component.css"]  # noqa: RUF012
        _template = "<div></div>"

    after = _bundle()[0]
    assert "https://example.invalid/late-component.css" not in before
    assert "https://example.invalid/late-component.css" in after
    del LateComponent


def test_the_resource_cache_is_applied_once():
    assert _panel_fixes.cache_component_resources() is False  # already applied at import


# -- the model definitions every page carries ----------------------------------------------------
def _page_defs() -> list:
    import json

    import panel as pn
    import panel_material_ui as pmui
    from bokeh.core.json_encoder import serialize_json

    doc = Document()
    doc.add_root(pmui.Page(title="x", main=[pn.Column("x")]).get_root(doc))
    return json.loads(serialize_json(doc.to_json(deferred=False)))["defs"]


def test_model_definitions_are_encoded_once_and_equal_bokehs_own(monkeypatch):
    """Every page's document defines every data model class of the process (~145 with
    panel-material-ui); each class is encoded once, and what is sent equals Bokeh's own."""
    from bokeh.core.has_props import MetaHasProps
    from bokeh.core.serialization import Serializer

    cached = Serializer._encoders[MetaHasProps]
    assert getattr(cached, _panel_fixes._DEFINED, False)
    ours = _page_defs()
    encoded = []
    original = cached.__wrapped__
    monkeypatch.setattr(cached, "__wrapped__", lambda cls, s: encoded.append(cls) or original(cls, s))
    again = _page_defs()
    refused = [cls for cls, body in cached.known.items() if body is None]
    # the next page: no class encoded again but those whose defaults hold a model (a
    # chat message's), as Bokeh does it
    assert set(encoded) == set(refused) and len(refused) <= 3 < len(cached.known)
    monkeypatch.setitem(Serializer._encoders, MetaHasProps, original)  # Bokeh's own encoder
    own = _page_defs()
    assert len(own) > 100 and any(d["name"] == "Page1" for d in own)  # not vacuous
    assert ours == again == own


def test_a_class_whose_defaults_hold_a_model_is_encoded_each_time():
    """A default that is a model (a reference in the document) is not frozen into a cache."""
    import uuid

    from bokeh.core.has_props import MetaHasProps
    from bokeh.core.properties import Instance
    from bokeh.core.serialization import Serializer
    from bokeh.model import DataModel
    from bokeh.models import Div

    name = f"CkptviewProbe{uuid.uuid4().hex}"
    probe = type(name, (DataModel,), {"__qualified_model__": name,
                                      "part": Instance(Div, default=lambda: Div(text="x"))})  # fmt: skip
    first, second = (Serializer().encode(probe) for _ in range(2))
    assert Serializer._encoders[MetaHasProps].known[probe] is None
    parts = [rep["properties"][0]["default"] for rep in (first, second)]
    assert parts[0]["name"] == parts[1]["name"] == "Div" and parts[0]["id"] != parts[1]["id"]


def test_the_definition_cache_is_applied_once():
    assert _panel_fixes.cache_model_definitions() is False  # already applied at import


def test_pages_start_es_module_shims_in_polyfill_mode_and_keep_the_rest(monkeypatch):
    """The page's resources as Panel renders them, but for the shim's options (once)."""
    from panel.io import resources

    monkeypatch.setattr(resources, "JS_RESOURCES", resources.JS_RESOURCES)  # restored after
    panels = resources.JS_RESOURCES
    parts = {"js_raw": ["var x = 1"], "js_files": ["a.js"], "js_modules": ["m.js"],
             "hashes": {}, "js_module_exports": {"lib": "lib.js"}}  # fmt: skip
    before = panels.render(**parts)
    assert _panel_fixes.SHIM_MODE in before
    assert _panel_fixes.load_modules_natively() is True
    assert _panel_fixes.load_modules_natively() is False  # applied once
    after = resources.JS_RESOURCES.render(**parts)
    assert after == before.replace(_panel_fixes.SHIM_MODE, _panel_fixes.POLYFILL_MODE)
    assert after != before


def test_a_template_without_shim_mode_is_left_as_panel_has_it(monkeypatch):
    from panel.io import resources

    plain = resources._env.from_string("<script src='x.js'></script>")
    plain.name = "js_resources.html"
    monkeypatch.setattr(resources, "JS_RESOURCES", plain)
    monkeypatch.setattr(resources._env.loader, "get_source",
                        lambda env, name: ("<script src='x.js'></script>", None, None))  # fmt: skip
    assert _panel_fixes.load_modules_natively() is False
    assert resources.JS_RESOURCES is plain


@pytest.mark.parametrize("first", ["natively", "paced"])
def test_paced_table_resizes_follow_panels_scripts_and_keep_polyfill_mode(monkeypatch, first):
    """The paced wait comes after every script of the page (Panel's registered its models by
    then), once, whichever of the two template changes is made first."""
    from panel.io import resources

    monkeypatch.setattr(resources, "JS_RESOURCES", resources.JS_RESOURCES)  # restored after
    parts = {"js_raw": ["var x = 1"], "js_files": ["a.js"], "js_modules": ["m.js"],
             "hashes": {}, "js_module_exports": {"lib": "lib.js"}}  # fmt: skip
    before = resources.JS_RESOURCES.render(**parts)
    changes = [_panel_fixes.load_modules_natively, _panel_fixes.pace_table_resizes]
    for change in changes if first == "natively" else changes[::-1]:
        assert change() is True
    assert _panel_fixes.pace_table_resizes() is False  # applied once
    assert _panel_fixes.load_modules_natively() is False
    after = resources.JS_RESOURCES.render(**parts)
    script = _panel_fixes.PACED_RESIZES.strip()
    assert after.count(script) == 1 and after.rstrip().endswith(script)
    assert after.replace(script, "").rstrip() == before.replace(
        _panel_fixes.SHIM_MODE, _panel_fixes.POLYFILL_MODE).rstrip()  # fmt: skip


def _tags_by_data_model(monkeypatch=None) -> list[tuple[str, int]]:
    """Each data model of a page (Material components, a ReactiveHTML, a table in tabs) with the
    number of root tags it carries, built with the patch in place (or Panel's own method)."""
    import panel as pn
    import panel_material_ui as pmui
    from bokeh.model import DataModel

    from ckptview.widgets._base import SeenMarker, table

    doc = Document()
    page = pmui.Page(title="x", sidebar=[pn.pane.HTML("side")], main=[pmui.Tabs(
        ("a", pn.Column(SeenMarker(text="later"), table(pd.DataFrame({"x": [1, 2]})))),
        ("b", pn.Spacer()), dynamic=True)])  # fmt: skip
    root = page.get_root(doc)
    tag = f"__ref:{root.id}"
    return sorted((type(m).__name__, m.tags.count(tag)) for m in root.select({"type": DataModel}))


def test_data_models_are_tagged_with_their_root_as_panel_tags_them(monkeypatch):
    """Every data model of a page carries its root's tag, once, as with Panel's own method."""
    from panel.reactive import ReactiveCustomBase

    patched = ReactiveCustomBase.__dict__["_patch_datamodel_ref"]
    assert getattr(patched.__func__, _panel_fixes._LOCAL, False)
    ours = _tags_by_data_model()
    monkeypatch.setattr(ReactiveCustomBase, "_patch_datamodel_ref",
                        classmethod(patched.__func__.__wrapped__))  # fmt: skip
    own = _tags_by_data_model()
    names = {name for name, _ in ours}
    assert {"Page1", "Tabs1", "text1"} <= {n.rstrip("0123456789") + "1" for n in names}
    assert ours == own and all(count == 1 for _, count in ours)


def test_a_data_model_below_a_ui_element_is_left_to_the_component_that_builds_it():
    """The walk stops at UI elements (a child component tags its own data models as it is
    built): a data model hung on a plain Bokeh element is not tagged; one the data model refers
    to directly is. Panel's own method walks the whole tree below (and tags both)."""
    import uuid

    from bokeh.core.properties import Instance, Nullable
    from bokeh.model import DataModel, Model
    from bokeh.models import Div
    from panel.reactive import ReactiveCustomBase

    name = f"CkptviewHolder{uuid.uuid4().hex}"
    holder = type(name, (DataModel,), {"__qualified_model__": name,
                                       "child": Nullable(Instance(Model)),
                                       "other": Nullable(Instance(Model))})  # fmt: skip
    below, beside = (type(f"{name}{k}", (DataModel,), {"__qualified_model__": f"{name}{k}"})()
                     for k in ("Below", "Beside"))  # fmt: skip
    data = holder(child=Div(tags=[below]), other=beside)
    ReactiveCustomBase._patch_datamodel_ref(data, "r1")
    assert "__ref:r1" in data.tags and "__ref:r1" in beside.tags
    assert "__ref:r1" not in below.tags
    ReactiveCustomBase._patch_datamodel_ref.__func__.__wrapped__(ReactiveCustomBase, data, "r2")
    assert "__ref:r2" in below.tags  # Panel's own walk


def test_the_local_tagging_is_applied_once():
    assert _panel_fixes.tag_data_models_locally() is False  # already applied at import


def _sent(query, model) -> tuple[set, type | None]:
    try:
        return set(query(model, lambda p: p.serialized, include_defaults=False)), None
    except Exception as e:  # noqa: BLE001 - a required property unset: the same error expected
        return set(), type(e)


def test_the_properties_sent_equal_bokehs_own_for_every_model_class():
    """For every model class Bokeh knows here (Bokeh's, Panel's, panel-material-ui's: ~650),
    a new model's serialised properties are Bokeh's own, the first time and the next."""
    import warnings

    from bokeh.core.has_props import HasProps
    from bokeh.model import Model

    patched = HasProps.query_properties_with_values
    assert getattr(patched, _panel_fixes._SET_ONLY, False)
    compared = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cls in Model.model_class_reverse_map.values():
            try:
                ours, own = cls(), cls()
            except Exception:  # noqa: BLE001 - needs arguments
                continue
            for _ in range(2):
                assert _sent(patched, ours) == _sent(patched.__wrapped__, own), cls
            compared += 1
    assert compared > 400


def test_a_property_not_sent_is_not_read(monkeypatch):
    """Bokeh read every property (its default computed and checked) before dropping those not
    set: a Column's 37 for its ~10 set. Only those it holds are read now; a required property
    that is unset is still read, and raises."""
    import uuid

    import panel as pn
    from bokeh.core.has_props import HasProps
    from bokeh.core.properties import Int, Required
    from bokeh.core.property.descriptors import PropertyDescriptor, UnsetValueError
    from bokeh.model import Model

    read: list[str] = []
    get_value = PropertyDescriptor.get_value
    monkeypatch.setattr(PropertyDescriptor, "get_value",
                        lambda self, obj: read.append(self.name) or get_value(self, obj))  # fmt: skip
    column = pn.Column(pn.pane.HTML("x"), sizing_mode="stretch_width").get_root(Document())
    sent = column.properties_with_values(include_defaults=False)
    held = set(column._property_values) | set(column._unstable_default_values)
    assert len(column.properties()) > 30 and 0 < len(sent) <= len(held) < 25
    assert sorted(read) == sorted(held)  # set, or made when it was (a list: not sent)
    read.clear()
    own = HasProps.query_properties_with_values.__wrapped__(column, lambda p: p.serialized,
                                                            include_defaults=False)  # fmt: skip
    assert own == sent and len(read) > 30  # Bokeh's own reads them all
    name = f"CkptviewRequired{uuid.uuid4().hex}"
    probe = type(name, (Model,), {"__qualified_model__": name, "count": Required(Int)})
    with pytest.raises(UnsetValueError):
        probe().properties_with_values(include_defaults=False)


def test_reading_set_properties_only_is_applied_once():
    assert _panel_fixes.read_set_properties_only() is False  # already applied at import
