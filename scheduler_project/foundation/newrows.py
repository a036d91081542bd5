"""Unsaved model instances for new rows, built without Model.__init__'s generic work.

`new_row(Model, **values)` is `Model(**values)` for the write paths that build many instances at
once (a batch of a thousand schedules makes three thousand: the version, the schedule and the audit
entry of each): Django's constructor walks every field through its generic keyword handling, and
in the batch create it was a larger share of the request than any one of the inserts. Here what
each field's default is gets read once per model: the constant defaults are copied into a new
instance in one step, only the callable ones are called, and the given values put over them.

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
    """(constant defaults by attname, [(attname, default getter)] for the rest, relation names to
    attnames, every attname). A default is constant when the field's getter returns the same
    immutable value every time (None, "", or a non-callable default: Django requires a callable
    for a mutable one); a callable default (uuid4, dict, now) or a database default is called for
    each row, as the constructor calls it."""
    constant, called, relations, attnames = {}, [], {}, set()
    for f in model._meta.concrete_fields:
        if f.generated:
            continue
        attnames.add(f.attname)
        if f.is_relation:
            relations[f.name] = f.attname
        getter = f._get_default
        if (f.has_default() and not callable(f.default)) or (not f.has_default() and not f.has_db_default()
                                                             and getter() in (None, "")):
            constant[f.attname] = getter()
        else:
            called.append((f.attname, getter))
    return constant, tuple(called), relations, frozenset(attnames)


def new_row(model, /, **values):
    """`model(**values)`, unsaved, for a new row (see the module's docstring)."""
    if pre_init.has_listeners(model) or post_init.has_listeners(model):
        return model(**values)
    plan = _PLANS.get(model)
    if plan is None:
        plan = _PLANS[model] = _plan(model)
    constant, called, relations, attnames = plan
    obj = model.__new__(model)
    obj._state = ModelState()
    data = obj.__dict__
    data.update(constant)
    for attname, default in called:
        if attname not in values:
            data[attname] = default()
    later = []
    for name, value in values.items():
        if name in attnames:
            data[name] = value
        elif name in relations or name in model._meta._property_names:
            later.append((name, value))  # through the descriptor: the related object cached, its id taken
        else:
            raise TypeError(f"{model.__qualname__}() got unexpected keyword arguments: '{name}'")
    for name, value in later:
        setattr(obj, name, value)
    return obj
