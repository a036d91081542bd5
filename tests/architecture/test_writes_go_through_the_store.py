"""Runs, attempts, occurrences, schedules and their versions are written only by the store modules
(runs/store/), and SQL is written only where statements belong.

Read from the source: an ORM write is a call of save/update/create/bulk_create/bulk_update/delete/
get_or_create/update_or_create on `<Model>.objects...` for one of those models, or `.save()` /
`.delete()` on a variable named for one (`run`, `schedule`, `version`, ...). A queryset kept in a
variable of another name and written later is not seen: this is a tripwire, not a proof."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("scheduler_project", "schedules", "runs", "dispatch")

MODELS = {"Run", "Attempt", "Occurrence", "Schedule", "ScheduleVersion"}
WRITES = {"save", "update", "create", "bulk_create", "bulk_update", "delete", "get_or_create", "update_or_create"}
INSTANCE = re.compile(r"^(run|schedule|version|attempt|occurrence|occ)s?$")

# Where the rows of those five models are written: the run queue's store.
STORE = ("runs/store/",)

# Where SQL is written, and why there.
SQL_HOMES = {
    "runs/store/": "the run queue's store: every statement of the queue, both engines",
    "scheduler_project/web/store.py": "the web's store: the key lookup and rate counting",
    "runs/partitions.py": "the history DDL: partitions made, sealed and swapped",
    "runs/retention.py": "history retention: counts and exports over partitions before the DDL swaps them",
    "scheduler_project/foundation/dbclock.py": "the database clock (statement_timestamp)",
    "scheduler_project/foundation/dbplanner.py": "planner settings: a loop's batch read by key through its indexes",
    "scheduler_project/foundation/notify.py": "NOTIFY",
    "scheduler_project/foundation/dbreplication.py": "the replication status PostgreSQL reports",
    "scheduler_project/foundation/migration_ops.py": "CREATE INDEX CONCURRENTLY for migrations",
    "dispatch/wakeup.py": "LISTEN on its own connection",
    "dispatch/forecast_store.py": "the forecast's kept summary: one statement over the summary and the deltas "
                                  "the schedule triggers write, and its fold",
    "dispatch/activity_store.py": "the activity loop's writes: one upsert per table adding a pass's increments "
                                  "in place (PostgreSQL)",
    "dispatch/invariants.py": "the invariant checker reads the tables as SQL on purpose, independently of "
                             "the stores whose writes it checks",
}
# A statement sent on a cursor or connection (not `self.execute`, the worker's call of a target),
# a raw queryset, a RawSQL expression.
CURSOR_CALLS = {"execute", "executemany", "copy"}


def sources():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" in rel:
                continue  # a migration writes with the historical models, as of its own time
            yield rel, ast.parse(path.read_text(), filename=rel)


def _chain(node):
    """The names along a call's receiver, from its root: Run.objects.filter(...).update -> [Run, objects, filter]."""
    names = []
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Name):
            names.append(node.id)
            return list(reversed(names))
        else:
            return list(reversed(names))


def orm_writes(tree):
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES):
            continue
        chain = _chain(node.func.value)
        if not chain:
            continue
        if chain[0] in MODELS and "objects" in chain:
            yield node.lineno, ".".join(chain + [node.func.attr])
        elif len(chain) == 1 and node.func.attr in {"save", "delete"} and INSTANCE.match(chain[0]):
            yield node.lineno, f"{chain[0]}.{node.func.attr}"


def sql_calls(tree):
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and node.func.id == "RawSQL":
            yield node.lineno, "RawSQL"
        elif isinstance(node.func, ast.Attribute):
            chain = _chain(node.func.value)
            if node.func.attr in CURSOR_CALLS and chain and chain[0] != "self" and \
                    re.search(r"cur|conn|schema_editor", chain[-1]):
                yield node.lineno, f"{'.'.join(chain)}.{node.func.attr}"
            elif node.func.attr == "raw" and "objects" in chain:
                yield node.lineno, f"{'.'.join(chain)}.raw"


def _home(rel: str, homes) -> bool:
    return any(rel == h or (h.endswith("/") and rel.startswith(h)) for h in homes)


ALL = list(sources())


def test_runs_and_schedules_are_written_only_by_the_store():
    found = [f"{rel}:{line}: {what}" for rel, tree in ALL if not _home(rel, STORE) for line, what in orm_writes(tree)]
    assert not found, "ORM writes of runs, attempts, occurrences, schedules or versions outside runs/store/:\n" + \
        "\n".join(found)


def test_sql_is_written_only_in_the_stores_and_the_history_ddl():
    found = [f"{rel}:{line}: {what}(" for rel, tree in ALL if not _home(rel, SQL_HOMES) for line, what in sql_calls(tree)]
    assert not found, "SQL outside the modules that hold it:\n" + "\n".join(found)


def test_the_tripwires_see_what_they_look_for():
    """Each rule catches a write of the kind it forbids (so a rule that matches nothing fails here)."""
    writes = ast.parse("Run.objects.filter(id=1).update(state='x')\nschedule.save()\nrun.delete()\n"
                       "ScheduleVersion.objects.create(version=2)\nnot_a_model.save()\n")
    assert sorted(line for line, _ in orm_writes(writes)) == [1, 2, 3, 4]
    sql = ast.parse("with connection.cursor() as cur:\n    cur.execute('SELECT 1')\nRun.objects.raw('SELECT 1')\n"
                    "connection.cursor().execute('SELECT 1')\nself.execute(claimed)\nRawSQL('1', [])\n")
    assert sorted(line for line, _ in sql_calls(sql)) == [2, 3, 4, 6]
    used = {rel for rel, tree in ALL for _ in sql_calls(tree)}
    stale = [home for home in SQL_HOMES if not any(_home(rel, [home]) for rel in used)]
    assert not stale, f"homes of SQL that hold none any more (take them off the list): {stale}"
