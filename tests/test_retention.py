"""Retention: policies, plans and their invariants, apply (re-checked), the stored policy."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
from test_restore import copy_corpus, journal_events, snapshot
from test_stats_diff import write_fluid_tree

import ckptview as cv
from ckptview.engine.policies import (
    AnyOf,
    KeepBest,
    KeepEvery,
    KeepLast,
    KeepNewerThan,
    Pinned,
    make_policy,
    parse_best,
    parse_duration,
)  # fmt: skip
from ckptview.engine.retention import TreeChangedError

NOW = datetime(2026, 1, 10, tzinfo=timezone.utc)


def _table(serials, complete, steps=None, days_old=None) -> pd.DataFrame:
    df = pd.DataFrame({"complete": complete}, index=pd.Index(serials, name="serial"))
    df["step"] = pd.array(steps or [None] * len(serials), dtype="Int64")
    ages = days_old or [0] * len(serials)
    df["timestamp"] = [pd.Timestamp(NOW - timedelta(days=d)) for d in ages]
    return df


METRICS = pd.DataFrame({"serial": [1, 2, 3, 4], "name": "loss", "value": [0.9, 0.5, 0.7, 0.6]})


def test_policies_keep_what_they_say():
    t = _table([1, 2, 3, 4, 5], [True, True, True, True, False], steps=[100, 200, 300, 400, 500],
               days_old=[9, 7, 5, 3, 1])  # fmt: skip
    assert set(KeepLast(2).keeps(t, METRICS, NOW)) == {3, 4}  # complete ones only
    assert set(KeepEvery(2).keeps(t, METRICS, NOW)) == {2, 4}
    assert set(KeepEvery(300, "step").keeps(t, METRICS, NOW)) == {3}
    assert set(KeepBest("loss", 2, "min").keeps(t, METRICS, NOW)) == {2, 4, 5}  # 5: no metric
    assert set(KeepBest("loss", 1, "max", keep_missing=False).keeps(t, METRICS, NOW)) == {1}
    assert set(Pinned((1, 42)).keeps(t, METRICS, NOW)) == {1}
    assert set(KeepNewerThan(4 * 86400).keeps(t, METRICS, NOW)) == {4, 5}
    union = AnyOf((KeepLast(1), Pinned((1,))))
    assert union.keeps(t, METRICS, NOW) == {4: "last 1", 1: "pinned"}
    assert AnyOf.from_dict(union.to_dict()) == union


def test_policy_parsing():
    assert parse_duration("7d") == 7 * 86400 and parse_duration(timedelta(hours=2)) == 7200
    assert parse_duration("90m") == 5400 and parse_duration(30) == 30
    with pytest.raises(ValueError):
        parse_duration("soon")
    assert parse_best("eval_loss:3:max") == KeepBest("eval_loss", 3, "max")
    assert parse_best(("loss", 2)) == KeepBest("loss", 2, "min")
    p = make_policy(keep_last=2, keep_every=(500, "step"), keep_best="loss:1", pinned=[3],
                    older_than="1d")  # fmt: skip
    kinds = [type(x) for x in p.policies]
    assert kinds == [KeepLast, KeepEvery, KeepBest, Pinned, KeepNewerThan]
    with pytest.raises(ValueError):
        make_policy(keep_last=0)


@pytest.fixture(scope="module")
def fluid_copy(tmp_path_factory):
    return copy_corpus("paddle/fluid_ckpt", tmp_path_factory.mktemp("ret") / "fluid")


def test_plan_on_fluid_protects_latest_and_in_flight(fluid_copy):
    cat = cv.open(fluid_copy)
    plan = cat.plan_retention(keep_last=1)
    assert list(plan.columns[:3]) == ["action", "reason", "nbytes"]
    assert plan["action"].to_dict() == {0: "delete", 1: "delete", 2: "keep", 3: "keep"}
    assert "in flight" in plan.loc[3, "reason"] and "latest complete" in plan.loc[2, "reason"]
    assert (plan["nbytes"] == cat.serials["nbytes"]).all()
    pinned = cat.plan_retention(keep_last=1, pinned=[0])
    assert pinned.loc[0, "action"] == "keep" and pinned.loc[0, "reason"] == "pinned"
    assert (cat.plan_retention()["action"] == "keep").all()  # no policy: keep everything


def test_plan_invariants_over_many_policies(tmp_path):
    w = np.ones(4, np.float32)
    complete = {0, 1, 3, 4, 6}  # 2 and 5 crashed; 7 and 8 are in flight
    write_fluid_tree(tmp_path / "t", {n: {"w": w * n} for n in range(9)}, complete=complete)
    cat = cv.open(tmp_path / "t")
    assert cat.latest == 6
    for last, every, pin in itertools.product([None, 1, 2, 5], [None, 2, 3], [(), (2,), (0, 5)]):
        plan = cat.plan_retention(keep_last=last, keep_every=every, pinned=pin)
        doomed = set(plan.index[plan["action"] == "delete"])
        assert not doomed & {6, 7, 8} and not doomed & set(pin), (last, every, pin)
        if last:
            assert set(sorted(complete)[-last:]).isdisjoint(doomed)


def test_apply_deletes_and_journals(tmp_path):
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    cat = cv.open(root)
    keep_values = cat.read("fc_0.w_0", 2)
    before = snapshot(root)
    plan = cat.plan_retention(keep_last=1)
    deleted = cat.apply_retention(plan).deleted
    assert list(deleted.index) == [0, 1]
    assert int(deleted["nbytes"].sum()) == int(plan.loc[[0, 1], "nbytes"].sum())
    assert not (root / "checkpoint_0").exists() and not (root / "checkpoint_1").exists()
    after = snapshot(root)
    assert after == {k: v for k, v in before.items() if not k.startswith(("checkpoint_0/",
                                                                            "checkpoint_1/"))}  # fmt: skip
    fresh = cv.open(root)
    assert list(fresh.serials.index) == [2, 3] and fresh.latest == 2
    assert np.array_equal(fresh.read("fc_0.w_0", 2), keep_values)
    events = journal_events(str(root))
    assert events[0]["event"] == "begin" and events[0]["delete"] == [0, 1]
    assert events[-1] == {**events[-1], "event": "end", "deleted": [0, 1]}
    markers_first = [e["op"]["path"] for e in events if e["event"] == "intent"][:3]
    assert markers_first[0].endswith("_SUCCESS")


def test_apply_refuses_a_changed_tree(tmp_path):
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    cat = cv.open(root)
    plan = cat.plan_retention(keep_last=1)
    (root / "checkpoint_1/__model__/fc_0.w_0").write_bytes(b"changed under the plan")
    before = snapshot(root)
    with pytest.raises(TreeChangedError, match="serial 1 changed"):
        cat.apply_retention(plan)
    assert snapshot(root) == before
    other = copy_corpus("paddle/fluid_ckpt", tmp_path / "other")
    with pytest.raises(ValueError, match="plan is for"):
        cv.open(other).apply_retention(plan)
    with pytest.raises(ValueError, match="not a retention plan"):
        cat.apply_retention(pd.DataFrame({"action": ["delete"]}))


def test_stored_policy_roundtrip_and_default(tmp_path):
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    cat = cv.open(root)
    assert cat.retention_policy() is None
    policy = cat.set_retention(keep_last=1, pinned=[0])
    assert (root / ".ckptview/retention.json").exists()
    assert cv.open(root).retention_policy() == policy
    plan = cv.open(root).plan_retention()  # no arguments: the stored policy
    assert plan["action"].to_dict() == {0: "keep", 1: "delete", 2: "keep", 3: "keep"}
    cat.set_retention(None)
    assert cat.retention_policy() is None


def test_keep_best_from_tree_metrics(tmp_path):
    root = copy_corpus("modern/orbax/run_best", tmp_path / "orbax")
    cat = cv.open(root)
    losses = cat.metrics[cat.metrics["name"] == "loss"].set_index("serial")["value"]
    best = int(losses.idxmin())
    plan = cat.plan_retention(keep_best=("loss", 1, "min"))
    kept = set(plan.index[plan["action"] == "keep"])
    assert kept == {best, cat.latest}
    cat.apply_retention(plan)
    fresh = cv.open(root)
    assert set(fresh.serials.index) == kept and fresh.latest == cat.latest
