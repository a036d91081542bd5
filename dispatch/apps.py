from django.apps import AppConfig


class DispatchConfig(AppConfig):
    name = "dispatch"
    default_auto_field = "django.db.models.BigAutoField"
