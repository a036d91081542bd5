import pytest

from dispatch.safehttp import url_allowed

API = ["https://api.example.com"]
HOOKS = ["https://a.example.com/hooks/"]


@pytest.mark.parametrize(
    "url",
    [
        "https://api.example.com",
        "https://api.example.com/",
        "https://api.example.com/v1/run?x=1",
        "https://API.Example.COM/v1",  # hosts compare case-insensitively
        "https://api.example.com:443/v1",  # default port filled in
        "https://api.example.com./v1",  # the fully-qualified spelling is the same host
    ],
)
def test_it_allows_urls_under_a_host_prefix(url):
    assert url_allowed(url, API)


@pytest.mark.parametrize(
    "url",
    [
        "https://api.example.com.evil.net/",
        "https://api.example.com@evil.net/",
        "https://api.example.com:443@evil.net/",
        "https://user:pw@api.example.com/",  # userinfo is refused even on the right host
        "https://@api.example.com/",
        "http://api.example.com/",  # scheme is part of the prefix
        "https://api.example.com:8443/",  # so is the port
        "https://evil.net/https://api.example.com",
        "https://evil.net/?u=https://api.example.com",
        "https://api.example.com\\@evil.net/",
        "https://api.example.com\t.evil.net/",
        "ftp://api.example.com/",
        "file:///etc/passwd",
        "//api.example.com/",
        "api.example.com/",
        "",
    ],
)
def test_it_refuses_lookalikes_of_a_host_prefix(url):
    assert not url_allowed(url, API)


def test_it_allows_paths_under_a_prefix_ending_in_a_slash():
    assert url_allowed("https://a.example.com/hooks/run", HOOKS)
    assert url_allowed("https://a.example.com/hooks/", HOOKS)
    assert url_allowed("https://a.example.com/hooks/a/b?c=d", HOOKS)


def test_it_refuses_paths_outside_a_prefix_ending_in_a_slash():
    assert not url_allowed("https://a.example.com/hooks", HOOKS)
    assert not url_allowed("https://a.example.com/hooksevil/run", HOOKS)
    assert not url_allowed("https://a.example.com/other/hooks/run", HOOKS)
    assert not url_allowed("https://a.example.com/", HOOKS)


def test_a_prefix_without_a_trailing_slash_matches_on_a_segment_boundary():
    prefixes = ["https://a.example.com/hooks"]
    assert url_allowed("https://a.example.com/hooks", prefixes)
    assert url_allowed("https://a.example.com/hooks/run", prefixes)
    assert not url_allowed("https://a.example.com/hooksevil", prefixes)
    assert not url_allowed("https://a.example.com/hooks.evil", prefixes)


@pytest.mark.parametrize(
    "url",
    [
        "https://a.example.com/hooks/../admin",
        "https://a.example.com/hooks/%2e%2e/admin",
        "https://a.example.com/hooks/%2E%2E/admin",
        "https://a.example.com/hooks/..%2fadmin",
        "https://a.example.com/hooks/%2e%2e%2fadmin",
    ],
)
def test_it_refuses_dot_segments_that_climb_out_of_the_prefix(url):
    assert not url_allowed(url, HOOKS)


def test_it_compares_ports_with_defaults_filled_in():
    assert url_allowed("http://h.example.com/x", ["http://h.example.com:80"])
    assert url_allowed("http://h.example.com:80/x", ["http://h.example.com"])
    assert not url_allowed("http://h.example.com:8080/x", ["http://h.example.com"])
    assert url_allowed("http://h.example.com:8080/x", ["http://h.example.com:8080/"])


def test_it_compares_ip_literal_hosts_in_normal_form():
    assert url_allowed("http://[::1]:8080/x", ["http://[0:0::1]:8080/"])
    assert url_allowed("http://127.0.0.1:8080/x", ["http://127.0.0.1:8080"])
    assert not url_allowed("http://127.0.0.2:8080/x", ["http://127.0.0.1:8080"])


def test_it_compares_internationalised_hosts_in_their_ascii_form():
    assert url_allowed("https://xn--bcher-kva.example/x", ["https://bücher.example/"])
    assert url_allowed("https://bücher.example/x", ["https://xn--bcher-kva.example/"])


def test_it_matches_any_of_several_prefixes():
    prefixes = ["https://one.example.com/a/", "https://two.example.com"]
    assert url_allowed("https://two.example.com/z", prefixes)
    assert url_allowed("https://one.example.com/a/z", prefixes)
    assert not url_allowed("https://one.example.com/b/z", prefixes)


def test_no_prefixes_allow_nothing():
    assert not url_allowed("https://api.example.com/", [])


@pytest.mark.parametrize(
    "prefix",
    [
        "https://api.example.com/?x=1",  # a query in a prefix has no sound meaning
        "https://api.example.com/#frag",
        "https://user@api.example.com/",
        "api.example.com",
        "not a url",
        "",
    ],
)
def test_malformed_prefixes_match_nothing(prefix):
    assert not url_allowed("https://api.example.com/?x=1", [prefix])
