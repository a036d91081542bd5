from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "scheduler_project.web"
    label = "web"
    verbose_name = "HTTP surface"

    def ready(self):
        from scheduler_project.foundation import expiry
        from scheduler_project.web import lookalikes
        from scheduler_project.web.api import idempotency

        lookalikes.connect()
        # The reconciler prunes the expired Idempotency-Key records (this app owns their table).
        expiry.register("idempotency", idempotency.prune_expired, batch=idempotency.PRUNE_BATCH)
