"""The docs' generated tables (the schedule's entries, the job keys, the node's run directory,
the gate's checks) are what the code gives: scripts/gendocs.py renders them, and a doc that
differs is stale."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("gendocs", ROOT / "scripts" / "gendocs.py")
gendocs = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gendocs)


def test_every_generated_block_is_what_the_code_gives():
    stale = [str(path.relative_to(ROOT)) for path in gendocs.stale()]
    assert not stale, (f"generated blocks out of date in {', '.join(stale)}: "
                       "run .venv/bin/python scripts/gendocs.py")


@pytest.mark.parametrize("name", sorted(gendocs.BLOCKS))
def test_every_generated_table_is_in_a_doc(name):
    marker = f"<!-- generated: {name} -->"
    assert any(marker in path.read_text(encoding="utf-8") for path in gendocs.docs())


def test_a_stale_block_is_rewritten_and_the_text_around_it_kept():
    text = "before\n<!-- generated: rundir -->\nold table\n<!-- end generated -->\nafter\n"
    new = gendocs.render(text)
    assert new.startswith("before\n<!-- generated: rundir -->\n") and new.endswith(
        "<!-- end generated -->\nafter\n")
    assert "old table" not in new and "`run.json`" in new and "`exit_code`" in new


def test_an_unknown_block_is_refused():
    with pytest.raises(SystemExit, match="no generator"):
        gendocs.render("<!-- generated: nothing -->\n<!-- end generated -->")


def test_every_entry_of_the_schedule_is_documented_and_in_the_table():
    # The table is rendered from the schedule's RETURN documentation: an entry the filter
    # returns without documenting it would be missing from the doc. (`playbook`, the caller's
    # own argument handed back, is not in RETURN.)
    plan = gendocs._sample_plan()
    returned = gendocs.schedule_filter.schedule(plan, 4)
    documented = {name.split(".")[0] for name, _ in gendocs._schedule_entries()}
    assert set(returned) - {"why", "playbook"} <= documented


def test_the_checks_table_names_what_preflight_warn_may_turn_into_a_warning():
    """Its names come from the rows the code makes: a check preflight_warn lists is in it, in
    the last column, as are checks of every kind (a node's, one across nodes, the GPUs')."""
    spec = gendocs._job_options()["preflight_warn"]
    table = gendocs.gate_checks()
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ")
            for line in table.splitlines() if line.startswith("| ")}
    warnable = " ".join(row[-1] for row in rows.values())
    assert spec["choices"]
    for choice in spec["choices"]:
        assert f"`{choice}`" in warnable, choice
    for family, check in (("(every node)", "ssh"), ("network", "master reachable"),
                          ("gpus", "duplicate gpu"), ("versions", "same <key>"),
                          ("interconnect", "interconnect")):
        assert f"`{check}`" in rows[family][2], (family, rows[family])
