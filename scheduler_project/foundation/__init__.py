"""Helpers every app uses (errors, the database clock, NOTIFY, migration operations, the
PostgreSQL backend): the bottom layer. It imports no app and nothing of the HTTP surface."""
