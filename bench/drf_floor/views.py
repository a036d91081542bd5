from rest_framework import generics, serializers

from drf_floor.models import FloorItem


class FloorItemSerializer(serializers.ModelSerializer):
    timeZone = serializers.CharField(source="time_zone", max_length=64, required=False)

    class Meta:
        model = FloorItem
        fields = ["id", "name", "expression", "timeZone", "target", "payload", "enabled", "version", "created_at",
                  "updated_at"]
        read_only_fields = ["id", "version", "created_at", "updated_at"]


class FloorCreate(generics.CreateAPIView):
    serializer_class = FloorItemSerializer
    queryset = FloorItem.objects.all()
