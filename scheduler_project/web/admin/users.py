"""The admin's user pages, as Django makes them, refusing a user name that reads as another
account's (`ｖｉｃｔｉｍ` beside `victim`) with a message on the form (scheduler_project.web.lookalikes)."""

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.forms import AdminUserCreationForm, UserChangeForm

from scheduler_project.web.lookalikes import look_alike_error


class _NoLookAlikes:
    def clean_username(self):
        name = super().clean_username() if hasattr(super(), "clean_username") else self.cleaned_data["username"]
        error = look_alike_error(name, pk=self.instance.pk)
        if error:
            raise forms.ValidationError(error)
        return name


class CreationForm(_NoLookAlikes, AdminUserCreationForm):
    pass


class ChangeForm(_NoLookAlikes, UserChangeForm):
    pass


User = get_user_model()
if admin.site.is_registered(User):
    admin.site.unregister(User)


@admin.register(User)
class AccountAdmin(UserAdmin):
    add_form = CreationForm
    form = ChangeForm
