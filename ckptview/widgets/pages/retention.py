"""Retention: a policy form, the plan it produces, a confirm step naming the count, the result."""

from __future__ import annotations

import pandas as pd
import panel as pn
import panel_material_ui as pmui
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
    size_formatter,
    table,
)
from .._format import badge, human_bytes, md_code, md_problem

PLAN_SHOWN = ["serial", "action", "reason", "size", "step", "time"]
DONE_SHOWN = ["serial", "action", "size", "path"]  # after a deletion: what went, from where
START = "Set a policy and press **Plan**: nothing is deleted until you confirm."


def plan_frame(plan: pd.DataFrame) -> pd.DataFrame:
    """``cat.plan_retention`` output for display."""
    ts = plan["timestamp"] if "timestamp" in plan else pd.Series(pd.NaT, index=plan.index)
    out = pd.DataFrame(
        {
            "serial": plan.index.astype("int64"),
            "action": plan["action"].astype(object).to_numpy(),
            "reason": plan["reason"].astype(object).to_numpy(),
            "size": [human_bytes(n) for n in plan["nbytes"]],
            "step": [None if "step" not in plan or pd.isna(v) else int(v)
                     for v in (plan["step"] if "step" in plan else [None] * len(plan))],
            "time": ["" if pd.isna(t) else t.strftime("%Y-%m-%d %H:%M") for t in ts],
        }
    )  # fmt: skip
    return out.astype(object)


def _serial_list(serials: list[int], most: int = 20) -> str:
    """``1, 2, 3`` — or the first and last few of a long list, with the count left out."""
    if len(serials) <= most:
        return ", ".join(map(str, serials))
    head, tail = serials[: most // 2], serials[-(most // 4) :]
    return (
        f"{', '.join(map(str, head))}, … ({len(serials) - len(head) - len(tail)} more) …, "
        + ", ".join(map(str, tail))
    )


class RetentionView(pn.viewable.Viewer):
    """Keep last N / every K / best N by a metric / pinned / newer than; plan, confirm, apply."""

    run = param.Selector(objects=[])
    keep_last = param.Integer(default=3, bounds=(0, None), doc="0: off")
    keep_every = param.Integer(default=0, bounds=(0, None), doc="0: off")
    every_by = param.Selector(default="serial", objects=["serial", "step"])
    best_metric = param.Selector(default="", objects=[""], doc="'': off")
    best_n = param.Integer(default=1, bounds=(1, None))
    best_mode = param.Selector(default="min", objects=["min", "max"])
    pinned = param.ListSelector(default=[], objects=[])
    older_than = param.String(default="", doc="keep serials newer than this (7d, 12h); '': off")
    slim_older_than = param.String(
        default="", doc="delete the optimizer state of kept serials older than this; '': off"
    )

    def __init__(self, workspace, **params):
        self.workspace: Workspace = as_workspace(workspace)
        super().__init__(**params)
        self.plan: pd.DataFrame | None = None
        self.message = notice(START, kind="info",
                                     css_classes=["ckptview-retention-message"],
                                     sizing_mode="stretch_width")  # fmt: skip
        self.plan_button = pn.widgets.Button(label="Plan", color="primary", align="end",
                                             stylesheets=[BUTTON_CSS],
                                             css_classes=["ckptview-retention-plan"])  # fmt: skip
        self.plan_button.on_click(self._on_plan)
        self.save_button = pn.widgets.Button(label="Save policy with the tree", variant="outline", color="primary",
                                             visible=self.workspace.allow_write,
                                             css_classes=["ckptview-retention-save"])  # fmt: skip
        self.save_button.on_click(self._on_save)
        self.delete = pn.widgets.Button(label="Delete", color="danger", visible=False,
                                        css_classes=["ckptview-retention-delete"])  # fmt: skip
        self.delete.on_click(self._on_delete)
        self.confirm_text = pn.pane.Markdown(css_classes=["ckptview-confirm-text"])
        self.confirm = pn.widgets.Button(label="Delete", color="danger",
                                         css_classes=["ckptview-retention-confirm"])  # fmt: skip
        self.confirm.on_click(self._on_confirm)
        self.cancel = pn.widgets.Button(label="Cancel", css_classes=["ckptview-retention-cancel"])
        self.cancel.on_click(self._on_cancel)
        self.dialog = pmui.Dialog(
            self.confirm_text, pn.Row(self.confirm, self.cancel), open=False,
            title="Delete checkpoints?", title_variant="h5", show_close_button=True, width_option="sm",
            css_classes=["ckptview-confirm"],
        )  # fmt: skip
        self.table = table(pd.DataFrame(columns=PLAN_SHOWN), pagination="remote", page_size=20,
                           formatters={"action": {"type": "html"}, "size": size_formatter(),
                                       "reason": {"type": "textarea"},
                                       "path": {"type": "textarea"}},
                           layout="fit_columns", visible=False,
                           widths={"serial": 82, "action": 110, "size": 95, "step": 70,
                                   "time": 150},
                           css_classes=["ckptview-retention-table"])  # fmt: skip
        self.body = pn.Column(self.message, pn.Row(self.delete, self.save_button), self.dialog,
                              self.table, sizing_mode="stretch_width")  # fmt: skip
        self.workspace.param.watch(lambda e: self._runs(), ["runs", "changed", "grown"])
        self._runs()

    # -- form ---------------------------------------------------------------------------------
    def _runs(self) -> None:
        offer_runs(self)
        self._choices()

    @param.depends("run", watch=True)
    def _choices(self) -> None:
        if self.run is None:
            return
        cat = self.workspace.runs[self.run]
        self.param.pinned.objects = [int(s) for s in cat.serials.index]
        self.pinned = [s for s in self.pinned if s in self.param.pinned.objects]
        metrics = sorted(set(cat.metrics["name"])) if len(cat.metrics) else []
        self.param.best_metric.objects = ["", *metrics]
        if self.best_metric not in self.param.best_metric.objects:
            self.best_metric = ""
        self.load_stored()

    def load_stored(self) -> None:
        """Fill the form from the policy stored with the tree, if any."""
        policy = self.workspace.runs[self.run].retention_policy()
        if not policy:
            return
        values = dict(keep_last=0, keep_every=0, best_metric="", older_than="", pinned=[])
        for item in policy.to_dict().get("policies", []):
            kind = item.get("type")
            if kind == "keep_last":
                values["keep_last"] = int(item["n"])
            elif kind == "keep_every":
                values["keep_every"], values["every_by"] = int(item["k"]), item.get("by", "serial")
            elif kind == "keep_best" and item["metric"] in self.param.best_metric.objects:
                values.update(best_metric=item["metric"], best_n=int(item.get("n", 1)),
                              best_mode=item.get("mode", "min"))  # fmt: skip
            elif kind == "pinned":
                values["pinned"] = [int(s) for s in item["serials"]
                                    if int(s) in self.param.pinned.objects]  # fmt: skip
            elif kind == "keep_newer_than":
                values["older_than"] = f"{int(item['seconds'])}s"
        self.param.update(**values)

    def policy(self) -> dict:
        """The form as ``plan_retention`` keyword arguments."""
        return {
            "keep_last": self.keep_last or None,
            "keep_every": (self.keep_every, self.every_by) if self.keep_every else None,
            "keep_best": (self.best_metric, self.best_n, self.best_mode)
            if self.best_metric else None,
            "pinned": tuple(int(s) for s in self.pinned),
            "older_than": self.older_than.strip() or None,
            "slim_older_than": self.slim_older_than.strip() or None,
        }  # fmt: skip

    @param.depends("run", "keep_last", "keep_every", "every_by", "best_metric", "best_n",
                   "best_mode", "pinned", "older_than", "slim_older_than", watch=True)  # fmt: skip
    def _forget_plan(self) -> None:
        if self.plan is not None:  # the plan on screen is for another policy: not shown
            set_notice(self.message, START, "info")
            self.clear()
        self.plan = None
        self.delete.visible = False
        self.dialog.open = False

    def clear(self) -> None:
        """Take the last plan or result off the screen (after a refusal, or a new policy)."""
        self.plan = None
        self.delete.visible = self.dialog.open = self.table.visible = False
        self.table.value = pd.DataFrame(columns=PLAN_SHOWN)

    # -- plan -------------------------------------------------------------------------------
    def make_plan(self) -> pd.DataFrame:
        """The plan for the form's policy (changes nothing)."""
        cat = self.workspace.runs[self.run]
        policy = self.policy()
        if not any(v for v in policy.values()):
            raise ValueError(
                "set at least one rule (keep last, every, best, pinned, newer than, slim)"
            )
        return cat.plan_retention(**policy)

    def doomed(self) -> list[int]:
        if self.plan is None:
            return []
        return [int(s) for s in self.plan.index[self.plan["action"].isin(["delete", "slim"])]]

    def show_plan(self, plan: pd.DataFrame) -> None:
        self.plan = plan
        shown = plan_frame(plan)
        shown["action"] = [badge(a) for a in shown["action"]]
        shown["size"] = [int(n) for n in plan["nbytes"]]  # bytes, shown readable: sorts by size
        self.table.value = shown
        self.table.visible = True
        doomed = self.doomed()
        freed = int(plan.loc[doomed, "frees"].sum()) if doomed else 0
        n_slim = int((plan["action"] == "slim").sum())
        slim = f", slim **{n_slim}** (optimizer state only)" if n_slim else ""
        text = (
            f"**Plan:** keep {len(plan) - len(doomed)}, delete **{len(doomed) - n_slim}**{slim} "
            f"({human_bytes(freed)} freed). Nothing is deleted until you confirm."
        )
        if not self.workspace.allow_write:
            text += "\n\nThis dashboard is **read-only**: deleting is not offered."
        set_notice(self.message, text, "info")
        self.delete.label = f"Delete {len(doomed)} checkpoint{'s' if len(doomed) != 1 else ''}…"
        self.delete.visible = self.workspace.allow_write and bool(doomed)
        self.dialog.open = False

    async def _on_plan(self, event=None) -> None:
        try:
            self.show_plan(await in_background(self.body, self.make_plan))
        except Exception as e:  # noqa: BLE001 - shown to the user
            self.clear()
            set_notice(self.message, md_problem(e, "plan"), "danger")

    # -- confirm and apply ------------------------------------------------------------------
    def ask(self) -> None:
        """Open the confirm step, naming the count (refused on a read-only dashboard)."""
        self.workspace.guard.require_write("apply retention")
        doomed = self.doomed()
        if not doomed:
            raise RuntimeError("nothing to delete: plan first")
        freed = int(self.plan.loc[doomed, "frees"].sum())
        noun = "checkpoint" if len(doomed) == 1 else "checkpoints"
        self.dialog.title = f"Delete {len(doomed)} {noun}?"
        self.confirm_text.object = (
            f"Serials {_serial_list(doomed)} of {md_code(self.run)} ({human_bytes(freed)}). "
            "This cannot be undone; the tree is re-checked against the plan first."
        )
        self.confirm.label = f"Delete {len(doomed)} {noun}"
        self.dialog.open = True

    def _on_delete(self, event=None) -> None:
        try:
            self.ask()
        except Exception as e:  # noqa: BLE001 - refusals are shown, never raised
            self.clear()
            set_notice(self.message, md_problem(e, "delete"), "danger")

    def _on_cancel(self, event=None) -> None:
        self.dialog.open = False

    def apply(self) -> pd.DataFrame:
        """Delete exactly the planned serials; refused without write access. Returns what
        was deleted (``RetentionResult.deleted``)."""
        self.workspace.guard.require_write("apply retention")
        if self.plan is None:
            raise RuntimeError("plan first")
        return self.workspace.runs[self.run].apply_retention(self.plan).deleted

    def show_result(self, deleted: pd.DataFrame) -> None:
        freed = int(deleted["nbytes"].sum()) if len(deleted) else 0
        serials = ", ".join(str(int(s)) for s in deleted.index)
        n_slim = int((deleted["action"] == "slim").sum()) if "action" in deleted else 0
        n_del = len(deleted) - n_slim
        slim = f", slimmed {n_slim}" if n_slim else ""
        text = (
            f"**Deleted {n_del} checkpoint{'s' if n_del != 1 else ''}{slim}** "
            f"(serials {serials or 'none'}; {human_bytes(freed)} freed)."
        )
        set_notice(self.message, text, "success")
        self.dialog.open = self.delete.visible = False
        self.plan = None
        self.table.value = pd.DataFrame(
            {
                "serial": [int(x) for x in deleted.index],
                "action": [
                    badge("slimmed" if a == "slim" else "deleted")
                    for a in deleted.get("action", ["delete"] * len(deleted))
                ],  # fmt: skip
                "size": [int(n) for n in deleted["nbytes"]],
                "path": [str(p) for p in deleted.get("path", [""] * len(deleted))],
            },
            columns=DONE_SHOWN,
        ).astype(object)
        self.workspace.touch()

    async def _on_confirm(self, event=None) -> None:
        self.confirm.disabled = True  # one click, one deletion
        try:
            self.show_result(await in_background(self.body, self.apply))
        except Exception as e:  # noqa: BLE001 - refusals and failures are shown
            self.clear()
            set_notice(self.message, md_problem(e, "delete"), "danger")
        finally:
            self.confirm.disabled = False

    def save(self):
        """Store the form's policy with the tree (``cat.set_retention``)."""
        self.workspace.guard.require_write("save the retention policy")
        policy = {k: v for k, v in self.policy().items() if k != "slim_older_than"}
        return self.workspace.runs[self.run].set_retention(**policy)

    def _on_save(self, event=None) -> None:
        try:
            self.save()
            set_notice(self.message, f"Policy saved with {md_code(self.run)}.", "success")
        except Exception as e:  # noqa: BLE001
            set_notice(self.message, md_problem(e, "save the policy"), "danger")

    def __panel__(self):
        w = pn.widgets
        form = pn.Column(
            form_row(
                w.Select.from_param(self.param.run, label="run", width=170,
                                    css_classes=["ckptview-retention-run"]),
                w.IntInput.from_param(self.param.keep_last, label="keep last N (0 off)", width=140,
                                      css_classes=["ckptview-keep-last"]),
                w.IntInput.from_param(self.param.keep_every, label="keep every K (0 off)",
                                      width=140),
                w.Select.from_param(self.param.every_by, label="K counts", width=100),
                w.TextInput.from_param(self.param.older_than, label="keep newer than",
                                       placeholder="7d, 12h", width=130),
                w.TextInput.from_param(self.param.slim_older_than, label="slim older than",
                                       placeholder="7d: drop optimizer state", width=150,
                                       css_classes=["ckptview-slim-older-than"]),
            ),
            form_row(
                w.Select.from_param(self.param.best_metric, label="best N by metric", width=170,
                                    css_classes=["ckptview-best-metric"]),
                w.IntInput.from_param(self.param.best_n, label="N", width=80),
                w.Select.from_param(self.param.best_mode, label="best is", width=90),
                w.MultiChoice.from_param(self.param.pinned, label="pinned serials", width=300),
                self.plan_button,
            ),
            sizing_mode="stretch_width",
        )  # fmt: skip
        return pn.Column(form, self.body, sizing_mode="stretch_width")
