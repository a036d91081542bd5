from django.urls import path

from drf_floor.views import FloorCreate

urlpatterns = [path("items", FloorCreate.as_view())]
