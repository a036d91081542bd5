"""A serializer's output without DRF's per-call machinery.

DRF's `Serializer.to_representation` walks the declaration on every call: a generator over the
readable fields, each field's generic attribute lookup with its error handling, then the field's
conversion. For a schedule (two dozen fields, three of them nested) that walk cost more than the
conversions, several per cent of a create's CPU and fifty times that for a page of schedules.
`compiled(serializer)` reads the declaration once (each field's source path and the field's own
`to_representation`) and returns a function that only looks up and converts. The serializer
stays the one definition of the output: the OpenAPI schema and this function both come from it,
and tests/api/test_representation.py holds the two outputs equal for schedules in every state.

Plain fields with a plain or dotted source and nested serializers are supported. A list, a method
field, `source="*"` or a serializer with its own `to_representation` is refused when compiling,
rather than rendered differently."""

from operator import attrgetter

from rest_framework import serializers


def compiled(serializer: serializers.Serializer):
    """A function `obj -> dict` equal to `serializer.to_representation(obj)`."""
    if type(serializer).to_representation is not serializers.Serializer.to_representation:
        raise TypeError(f"{type(serializer).__name__} has its own to_representation")
    steps = []
    for field in serializer._readable_fields:
        where = f"{type(serializer).__name__}.{field.field_name}"
        if isinstance(field, (serializers.ListSerializer, serializers.SerializerMethodField)) or field.source == "*":
            raise TypeError(f"{where}: {type(field).__name__} (source {field.source!r}) is not supported")
        convert = compiled(field) if isinstance(field, serializers.Serializer) else field.to_representation
        steps.append((field.field_name, attrgetter(field.source), convert))

    def represent(obj) -> dict:
        out = {}
        for name, get, convert in steps:
            value = get(obj)
            # As DRF: a None is rendered as null without the field's conversion.
            out[name] = None if value is None else convert(value)
        return out

    return represent
