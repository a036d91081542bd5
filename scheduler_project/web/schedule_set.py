"""A schedule set as written by a tenant, to the Declared items runs.schedule_apply plans: the
apply endpoint's body and `manage.py apply_schedules`'s JSON and YAML files.

Each item is the body of a single create (checked by the same serializer, so a field means there
exactly what it means in POST /api/v1/schedules), with a required `name`, the schedule's stable
key in the set, and an optional `adopt`, the id of an existing schedule of the tenant that the set
takes over under that name. `enabled` is managed only when an item gives it. Every error names
where the item was written (the file and its position), the schedule's name and the field.
"""

import json
import uuid
from datetime import date, datetime, timezone
from pathlib import Path

import yaml
from rest_framework import exceptions

from runs.schedule_apply import Declared, max_set_size
from scheduler_project.foundation.errors import ValidationFailed
from scheduler_project.web.api.schedule_serializers import to_fields, validate_schedule

SET_FIELDS = ("adopt",)


def declared_items(items, *, source: str = "") -> list[Declared]:
    """The items of one set (a list), each checked as a single create's body; raises
    ValidationFailed with every item's errors, keyed `<source>schedules[i].<field>`."""
    prefix = f"{source}: " if source else ""
    if not isinstance(items, list):
        raise ValidationFailed({f"{prefix}schedules": ["must be a list of schedules"]})
    if len(items) > max_set_size():
        raise ValidationFailed({f"{prefix}schedules": [
            f"at most {max_set_size()} schedules per set (SCHEDULER_MAX_APPLY_SCHEDULES); this one has {len(items)}"]})
    errors: dict[str, list[str]] = {}
    out = []
    for index, item in enumerate(items):
        where = f"{prefix}schedules[{index}]"
        name = item.get("name") if isinstance(item, dict) and isinstance(item.get("name"), str) else ""
        label = f'schedule "{name}"' if name else "schedule"

        def err(field_name, message):
            errors.setdefault(f"{where}.{field_name}", []).append(f"{label}: {message}")

        if not isinstance(item, dict):
            errors.setdefault(where, []).append("must be an object (a schedule)")
            continue
        body = {k: v for k, v in item.items() if k not in SET_FIELDS}
        adopt = item.get("adopt")
        if adopt is not None:
            try:
                adopt = uuid.UUID(str(adopt))
            except ValueError:
                err("adopt", "must be the id (a UUID) of one of this tenant's schedules")
        if not name.strip():
            err("name", "every schedule of a set needs a name, its stable key")
        try:
            data = validate_schedule(body)
        except exceptions.ValidationError as exc:
            # Here, not at the top: the API's error module loads DRF's views, whose settings load it.
            from scheduler_project.web.api.errors import flatten_errors

            for field_name, messages in flatten_errors(exc.detail if isinstance(exc.detail, dict)
                                                       else {"body": exc.detail}).items():
                for message in messages:
                    err(field_name, message)
            continue
        out.append(Declared(name=name, fields=to_fields(data), where=where, enabled=data.get("enabled"), adopt=adopt))
    if errors:
        raise ValidationFailed(errors)
    return out


def _as_json(value):
    """YAML reads an unquoted 2026-03-08T07:00:00Z as a datetime; the API takes it as its text."""
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    if isinstance(value, datetime):
        value = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    return value


def read_file(path: str) -> list:
    """The schedules a JSON or YAML file holds: a list, or an object with a `schedules` list.
    YAML is read with safe_load (no tags that build objects)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        if path.endswith((".yaml", ".yml")):
            data = _as_json(yaml.safe_load(text))
        else:
            data = json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ValidationFailed({path: [f"not valid {'YAML' if path.endswith(('.yaml', '.yml')) else 'JSON'}: {exc}"]})
    if isinstance(data, dict) and set(data) <= {"schedules"}:
        data = data.get("schedules")
    if data is None:
        return []
    if not isinstance(data, list):
        raise ValidationFailed({path: ["must hold a list of schedules, or an object with a `schedules` list"]})
    return data


def declared_from_files(paths: list[str]) -> list[Declared]:
    """Every file's schedules, in order, as one set; the errors of all files at once."""
    errors: dict[str, list[str]] = {}
    out = []
    for path in paths:
        try:
            out += declared_items(read_file(path), source=path)
        except ValidationFailed as exc:
            for key, messages in exc.errors.items():
                errors.setdefault(key, []).extend(messages)
        except OSError as exc:
            errors.setdefault(path, []).append(f"cannot be read: {exc.strerror or exc}")
    if errors:
        raise ValidationFailed(errors)
    return out
