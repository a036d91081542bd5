from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "scheduler_project.web"
    label = "web"
    verbose_name = "HTTP surface"

    def ready(self):
        from scheduler_project.web import lookalikes

        lookalikes.connect()
