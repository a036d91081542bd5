"""Issue 26, finding 11: `/api/v1/`, printed as the API's address, answered 404. It answers with
where the API's parts are, the same with a key, without one, or with a wrong one (it names
nothing of any tenant)."""

from rest_framework.test import APIClient


def test_the_api_root_answers_with_links_with_and_without_a_key(api):
    anonymous = APIClient()
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Bearer sk_not_a_key")
    bodies = []
    for client in (anonymous, api, wrong):
        for path in ("/api/v1/", "/api/v1"):
            resp = client.get(path)
            assert resp.status_code == 200, (path, resp.status_code)
            assert resp["Content-Type"].startswith("application/json")
            bodies.append(resp.json())
    assert all(b == bodies[0] for b in bodies)
    links = bodies[0]["links"]
    assert links["schedules"].endswith("/api/v1/schedules") and links["runs"].endswith("/api/v1/runs")
    assert links["docs"].endswith("/api/docs/") and links["openapi"].endswith("/api/schema/")
    for url in links.values():
        assert url.startswith("http://testserver/")
    assert anonymous.post("/api/v1/", {}, format="json").status_code == 405
