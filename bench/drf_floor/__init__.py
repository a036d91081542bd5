"""The framework's floor for bench/api_create.py: the smallest Django REST framework app that
creates one row per POST (issue 31). One model of 10 columns, one ModelSerializer, one
CreateAPIView; no authentication, no quota, no audit log, Django's security and common middleware
only. It is served by the same gunicorn (same workers) and loaded by the same wrk script and body
as the real create, in the same command, so that the ratio of the two says what the product adds
to the framework's own cost per create. Not part of the product: nothing imports it.
"""
