"""No account whose name reads as another's: `ｖｉｃｔｉｍ`, `Victim` and `victim` are one name
to a reader and, folded, to the sign-in throttle (scheduler_project.foundation.usernames). The admin's user
forms refuse such a name with a message; this check refuses it for every other way of saving an
account too (createsuperuser, scripts, the ORM)."""

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models.signals import pre_save

from scheduler_project.foundation.usernames import look_alike_of


def look_alike_error(name: str, *, pk=None) -> str | None:
    User = get_user_model()
    field = User.USERNAME_FIELD
    others = User._default_manager.exclude(pk=pk) if pk is not None else User._default_manager.all()
    # Every name, folded here: the databases' case-insensitive matches fold neither NFKC nor, on
    # SQLite, anything outside ASCII. Accounts are people, so the list is short; this runs only
    # when a name is new.
    clash = look_alike_of(name, others.values_list(field, flat=True).iterator())
    if clash is None:
        return None
    return f"the user name {name!r} reads as the existing account {clash!r}: choose another"


def _refuse_look_alikes(sender, instance, raw=False, update_fields=None, **kwargs):
    if raw:  # loading fixtures
        return
    if update_fields is not None and instance.USERNAME_FIELD not in update_fields:
        return  # e.g. a sign-in's last_login: the name is not being written
    name = instance.get_username()
    if instance.pk is not None:
        # Only a new name is checked: an account saved again (last_login, a password) keeps its own.
        old = type(instance)._default_manager.filter(pk=instance.pk).values_list(
            instance.USERNAME_FIELD, flat=True).first()
        if old == name:
            return
    error = look_alike_error(name, pk=instance.pk)
    if error:
        raise ValidationError(error)


def connect() -> None:
    pre_save.connect(_refuse_look_alikes, sender=get_user_model(), dispatch_uid="refuse-look-alike-usernames")
