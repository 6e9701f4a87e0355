"""Restore a serial: choose it, the mode and the destination; see the plan; then confirm."""

from __future__ import annotations

import pandas as pd
import panel as pn
import param

from .._base import (
    BUTTON_CSS,
    Workspace,
    as_workspace,
    form_row,
    in_background,
    notice,
    offer_runs,
    set_notice,
    table,
)
from .._format import human_bytes, md_code, md_problem, md_text

OPS = ["kind", "path", "size", "note"]
START = "Choose a serial and press **Plan (dry run)**: nothing changes until you confirm."
MODES = {"in place (the framework resumes from it)": "in_place", "copy to URL": "copy",
         "export as safetensors": "export"}  # fmt: skip


class RestoreView(pn.viewable.Viewer):
    """``cat.restore(serial, to, dry_run=True)`` shown first; the change runs on confirm."""

    run = param.Selector(objects=[])
    serial = param.Selector(objects=[])
    mode = param.Selector(default="in_place", objects=MODES)
    destination = param.String(default="", doc="URL for a copy (must be under the roots)")
    force = param.Boolean(default=False, doc="restore an incomplete serial anyway")

    def __init__(self, workspace, **params):
        self.workspace: Workspace = as_workspace(workspace)
        super().__init__(**params)
        self.planned = None
        self.message = notice(START, kind="info",
                                     css_classes=["ckptview-restore-message"],
                                     sizing_mode="stretch_width")  # fmt: skip
        self.plan_button = pn.widgets.Button(label="Plan (dry run)", color="primary", align="end",
                                             stylesheets=[BUTTON_CSS],
                                             css_classes=["ckptview-restore-plan"])  # fmt: skip
        self.plan_button.on_click(self._on_plan)
        self.confirm = pn.widgets.Button(label="Restore", color="danger", visible=False,
                                         css_classes=["ckptview-restore-confirm"])  # fmt: skip
        self.confirm.on_click(self._on_confirm)
        self.ops = table(pd.DataFrame(columns=OPS), pagination="local", page_size=15,
                         layout="fit_columns", widths={"kind": 90, "size": 90},
                         text_align={"size": "right"},
                         formatters={"path": {"type": "textarea"}, "note": {"type": "textarea"}},
                         visible=False, css_classes=["ckptview-restore-ops"])  # fmt: skip
        self.body = pn.Column(self.message, self.confirm, self.ops, sizing_mode="stretch_width")
        self.force_box = pn.widgets.Checkbox.from_param(
            self.param.force, label="force: restore this incomplete serial anyway",
            visible=False, css_classes=["ckptview-restore-force"],
        )  # fmt: skip
        self.workspace.param.watch(lambda e: self._runs(), ["runs", "changed", "grown"])
        self._runs()

    def _runs(self) -> None:
        offer_runs(self)
        self._serials()

    @param.depends("run", watch=True)
    def _serials(self) -> None:
        if self.run is None:
            return
        table_ = self.workspace.runs[self.run].serials
        choices = {
            (str(s) if ok else f"{s} (incomplete)"): int(s)
            for s, ok in zip(table_.index, table_["complete"].astype(bool))
        }  # every serial; an incomplete one needs an explicit force
        self.param.serial.objects = choices
        values = list(choices.values())
        if values and self.serial not in values:
            complete = [int(s) for s in table_.index[table_["complete"].astype(bool)]]
            self.serial = complete[0] if complete else values[0]
        self.force_box.visible = self.incomplete()

    def incomplete(self) -> bool:
        """True when the chosen serial is incomplete (its save did not finish)."""
        if self.run is None or self.serial is None:
            return False
        table_ = self.workspace.runs[self.run].serials
        return int(self.serial) in table_.index and not bool(
            table_.loc[int(self.serial), "complete"]
        )

    @param.depends("serial", watch=True)
    def _on_serial(self) -> None:
        self.force_box.visible = self.incomplete()
        self.force = False

    @param.depends("run", "serial", "mode", "destination", "force", watch=True)
    def _forget_plan(self) -> None:
        if self.planned is not None:  # the plan on screen is for other choices: not shown
            set_notice(self.message, START, "info")
            self.clear()
        self.planned = None
        self.confirm.visible = False

    def clear(self) -> None:
        """Take the last plan off the screen (after a refusal or a change of choices)."""
        self.planned = None
        self.confirm.visible = self.ops.visible = False
        self.ops.value = pd.DataFrame(columns=OPS)

    def _check_force(self) -> bool:
        """``force`` for the core; a clear refusal for an incomplete serial without it."""
        if not self.incomplete():
            return False
        if not self.force:
            err = self.workspace.runs[self.run].serials.loc[int(self.serial), "error"]
            why = f" ({err})" if isinstance(err, str) and err else ""
            raise ValueError(
                f"refused: serial {self.serial} is incomplete — its save did not finish{why}. "
                "The framework would not resume from it; tick 'force' to restore it anyway"
            )
        return True

    def _target(self) -> str | None:
        if self.mode == "in_place":
            return None
        if not self.destination.strip():
            raise ValueError("give a destination URL (under a served root) for the copy")
        return self.workspace.guard.check_url(self.destination.strip())

    def plan(self):
        """The dry run for the current choices (changes nothing)."""
        cat = self.workspace.runs[self.run]
        force = self._check_force()
        if self.mode == "export":
            return cat.export(int(self.serial), to=self._target(), dry_run=True, force=force)
        return cat.restore(int(self.serial), to=self._target(), dry_run=True, force=force)

    def show_export_plan(self, result) -> None:
        files = result.files
        self.ops.value = pd.DataFrame({
            "kind": ["write"] * len(files), "path": files["file"].astype(object),
            "size": [human_bytes(n) for n in files["nbytes"]],
            "note": [f"{n} tensors" for n in files["n_tensors"]],
        })  # fmt: skip
        skipped = (
            f"; {len(result.skipped)} non-tensor values left out" if len(result.skipped) else ""
        )
        text = (
            f"**Plan:** export serial **{result.serial}** to {md_code(result.target)} as safetensors — "
            f"{int(files['n_tensors'].sum())} tensors, {human_bytes(result.nbytes)} in "
            f"{len(files)} file(s){skipped}. Written to a staging directory, renamed last."
        )
        if not self.workspace.allow_write:
            text += "\n\nThis dashboard is **read-only**: exporting is not offered."
        set_notice(self.message, text, "info")
        self.confirm.label = f"Export serial {result.serial}"
        self.confirm.visible = self.workspace.allow_write and len(files) > 0
        self.ops.param.update(visible=True, hidden_columns=[])

    def show_plan(self, result) -> None:
        self.planned = (self.run, self.serial, self.mode, self.destination, self.force, result)
        if self.mode == "export":
            self.show_export_plan(result)
            return
        ops = result.ops
        size = int(pd.to_numeric(ops["nbytes"], errors="coerce").fillna(0).sum()) if len(ops) else 0
        frame = pd.DataFrame({
            "kind": ops["kind"].astype(object), "path": ops["path"].astype(object),
            "size": [human_bytes(n) for n in ops["nbytes"]], "note": ops["note"].astype(object),
        }) if len(ops) else pd.DataFrame(columns=["kind", "path", "size", "note"])  # fmt: skip
        self.ops.value = frame
        where = "in place" if self.mode == "in_place" else f"to {md_code(result.target)}"
        text = (
            f"**Plan:** restore serial **{result.serial}** {where} as serial "
            f"**{result.new_serial}** — {len(ops)} steps, {human_bytes(size)} written."
        )
        if result.message:
            text += f" ({md_text(result.message)})"
        if self.force:
            text += "\n\n**Forced:** this serial is incomplete; the restored copy may not load."
        if not self.workspace.allow_write:
            text += "\n\nThis dashboard is **read-only**: restoring is not offered."
        set_notice(self.message, text, "warning" if self.force else "info")
        can = self.workspace.allow_write and len(ops) > 0
        self.confirm.label = f"Restore serial {result.serial}"
        self.confirm.visible = can
        empty = frame["note"].isna() | (frame["note"].astype(str) == "")
        self.ops.param.update(visible=True, hidden_columns=["note"] if empty.all() else [])

    async def _on_plan(self, event=None) -> None:
        try:
            self.show_plan(await in_background(self.body, self.plan))
        except Exception as e:  # noqa: BLE001 - shown to the user
            self.clear()
            set_notice(self.message, md_problem(e, "plan this restore"), "danger")

    def apply(self):
        """Run the planned restore; refused without write access or without a plan."""
        self.workspace.guard.require_write("restore")
        if self.planned is None:
            raise RuntimeError("plan the restore first")
        run, serial, mode, dest, force, _ = self.planned
        cat = self.workspace.runs[run]
        if mode == "export":
            self.workspace.guard.require_write("export")
            return cat.export(int(serial), to=self._target(), force=force)
        return cat.restore(int(serial), to=self._target() if mode == "copy" else None,
                           force=force)  # fmt: skip

    def show_result(self, result) -> None:
        set_notice(self.message, f"**Done:** {md_text(str(result).splitlines()[0])}", "success")
        self.confirm.visible = False
        self.planned = None
        self.workspace.touch()

    async def _on_confirm(self, event=None) -> None:
        try:
            self.show_result(await in_background(self.body, self.apply))
        except Exception as e:  # noqa: BLE001 - refusals and failures are shown, never raised
            self.clear()
            set_notice(self.message, md_problem(e, "restore"), "danger")

    def __panel__(self):
        form = form_row(
            pn.widgets.Select.from_param(self.param.run, label="run", width=170,
                                         css_classes=["ckptview-restore-run"]),
            pn.widgets.Select.from_param(self.param.serial, label="serial", width=110,
                                         css_classes=["ckptview-restore-serial"]),
            # the chosen mode filled with the primary colour, the others outlined: plain in
            # either theme
            pn.widgets.RadioButtonGroup.from_param(self.param.mode, label="mode",
                                                   button_type="primary",
                                                   button_style="outline",
                                                   css_classes=["ckptview-restore-mode"]),
            pn.widgets.TextInput.from_param(self.param.destination, label="destination URL",
                                            width=320, placeholder="/path/to/new/tree",
                                            css_classes=["ckptview-restore-dest"]),
            self.plan_button,
        )  # fmt: skip
        return pn.Column(form, self.force_box, self.body, sizing_mode="stretch_width")
