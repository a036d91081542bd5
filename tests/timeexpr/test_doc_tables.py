"""docs/time-semantics.md shows what the engine does: its tables are regenerated and compared."""

from schedules.timeexpr.doctable import BEGIN, DOC, END, generated_block, render_tables


def test_documented_tables_match_the_engine():
    doc = DOC.read_text()
    assert BEGIN in doc and END in doc, f"{DOC} lost its generated-table markers"
    assert generated_block(doc) == render_tables().strip("\n"), (
        "docs/time-semantics.md's tables are out of date with schedules/timeexpr; regenerate them "
        "with: python -m schedules.timeexpr.doctable --write"
    )


def test_the_tables_cover_every_documented_zone_and_rule_kind():
    tables = render_tables()
    for zone in ["America/New_York", "Europe/London", "Australia/Sydney", "Australia/Lord_Howe", "Asia/Kolkata"]:
        assert f"### {zone}," in tables
    # The headline cases of time.md, as the engine renders them.
    assert "| 2026-03-08 07:00Z | 2026-03-08 03:00 (-0400) | 2026-03-08 02:30 | moved:" in tables
    assert "| 2026-10-03 15:45Z | 2026-10-04 02:45 (+1100) | 2026-10-04 02:45 |" in tables
