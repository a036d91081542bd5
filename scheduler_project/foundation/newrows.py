"""Unsaved model instances for new rows, built without Model.__init__'s generic work.

`new_row(Model, **values)` is `Model(**values)` for the write paths that build many instances at
once (a batch of a thousand schedules makes three thousand: the version, the schedule and the audit
entry of each): Django's constructor walks every field through its generic keyword handling, and
in the batch create it was a larger share of the request than any one of the inserts. Here the
fields' attribute names and default getters are read once per model, and each instance is one
pass over them.

The result is what the constructor makes: every concrete field set (given, or its default, called
anew for each instance), a related object given by its field name set through its descriptor (so
it is cached and its id taken), properties set as the constructor sets them, and an unknown name a
TypeError. When a model has pre_init or post_init receivers (none of ours does) the constructor
itself is called, so they still run. tests/core/test_new_rows.py holds the two to the same
answers on every model it is used for.
"""

from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

_PLANS: dict = {}


def _plan(model) -> tuple:
    fields = [f for f in model._meta.concrete_fields if not f.generated]
    # (attname, the field's name when it is a relation, the default's getter): Field.get_default
    # is this getter behind one more call.
    return tuple((f.attname, f.name if f.is_relation else None, f._get_default) for f in fields)


def new_row(model, /, **values):
    """`model(**values)`, unsaved, for a new row (see the module's docstring)."""
    if pre_init.has_listeners(model) or post_init.has_listeners(model):
        return model(**values)
    plan = _PLANS.get(model)
    if plan is None:
        plan = _PLANS[model] = _plan(model)
    obj = model.__new__(model)
    obj._state = ModelState()
    data = obj.__dict__
    related = []
    for attname, name, default in plan:
        if attname in values:
            data[attname] = values.pop(attname)
        elif name is not None and name in values:
            related.append((name, values.pop(name)))
        else:
            data[attname] = default()
    for name, value in related:
        setattr(obj, name, value)
    if values:
        properties = model._meta._property_names
        for name, value in values.items():
            if name not in properties:
                raise TypeError(f"{model.__qualname__}() got unexpected keyword arguments: '{name}'")
            setattr(obj, name, value)
    return obj
