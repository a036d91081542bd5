import ipaddress

import pytest

from dispatch.safehttp import AddressPolicy, parse_networks

REFUSED_BY_DEFAULT = [
    "10.0.0.1",
    "172.16.5.4",
    "192.168.1.1",
    "127.0.0.1",
    "127.255.255.254",
    "0.0.0.0",
    "169.254.169.254",
    "169.254.170.2",
    "169.254.1.1",
    "100.64.0.1",
    "100.100.100.200",
    "168.63.129.16",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    "198.18.0.1",
    "::",
    "::1",
    "fe80::1",
    "fe80::1%1",
    "fc00::1",
    "fd00:ec2::254",
    "ff02::1",
    "ff0e::1",  # global-scope multicast: is_global says yes, still refused
    "fec0::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "::ffff:0.0.0.0",
    "64:ff9b::a9fe:a9fe",  # NAT64 spelling of 169.254.169.254
    "2002:a00:1::",  # 6to4 spelling of 10.0.0.1
    "::127.0.0.1",  # deprecated IPv4-compatible form
]


@pytest.mark.parametrize("address", REFUSED_BY_DEFAULT)
def test_it_refuses_non_public_addresses_by_default(address):
    reason = AddressPolicy().refusal(ipaddress.ip_address(address))
    assert reason is not None and "is " in reason


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8", "2002:808:808::"])
def test_it_allows_public_addresses(address):
    assert AddressPolicy().refusal(ipaddress.ip_address(address)) is None


def test_reasons_name_the_kind_of_address():
    policy = AddressPolicy()
    assert policy.refusal_for_host("169.254.169.254") == "169.254.169.254 is a cloud metadata address"
    assert policy.refusal_for_host("10.0.0.1") == "10.0.0.1 is a private address"
    assert policy.refusal_for_host("127.0.0.1") == "127.0.0.1 is a loopback address"
    assert policy.refusal_for_host("100.64.0.1") == "100.64.0.1 is a carrier-grade NAT address"
    assert "leads to 127.0.0.1 is a loopback address" in policy.refusal_for_host("::ffff:127.0.0.1")


def test_an_operator_network_allows_its_addresses_in_both_spellings():
    policy = AddressPolicy(parse_networks(["127.0.0.0/8"]))
    assert policy.refusal_for_host("127.0.0.1") is None
    assert policy.refusal_for_host("127.9.9.9") is None
    assert policy.refusal_for_host("::ffff:127.0.0.1") is None
    assert policy.refusal_for_host("::1") is not None  # IPv6 loopback is another network
    assert policy.refusal_for_host("10.0.0.1") is not None


def test_metadata_addresses_stay_refused_under_a_broad_operator_network():
    policy = AddressPolicy(parse_networks(["169.254.0.0/16", "100.64.0.0/10", "fd00::/8"]))
    assert policy.refusal_for_host("169.254.1.1") is None
    assert policy.refusal_for_host("169.254.169.254") is not None
    assert policy.refusal_for_host("::ffff:169.254.169.254") is not None
    assert policy.refusal_for_host("100.100.100.200") is not None
    assert policy.refusal_for_host("fd00:ec2::254") is not None


def test_a_metadata_address_named_exactly_is_allowed():
    policy = AddressPolicy(parse_networks(["169.254.169.254/32"]))
    assert policy.refusal_for_host("169.254.169.254") is None
    assert policy.refusal_for_host("169.254.170.2") is not None


def test_non_address_strings_are_refused():
    assert AddressPolicy().refusal_for_host("example.com") is not None
    assert AddressPolicy().refusal_for_host("127.1") is not None


def test_parse_networks_accepts_cidrs_bare_addresses_and_blanks():
    nets = parse_networks(["127.0.0.0/8", " ::1 ", "", "fd00::/8"])
    assert [str(n) for n in nets] == ["127.0.0.0/8", "::1/128", "fd00::/8"]


def test_parse_networks_explains_a_cidr_with_host_bits():
    with pytest.raises(ValueError, match=r"'127.0.0.1/8'.*did you mean 127.0.0.0/8"):
        parse_networks(["127.0.0.1/8"])


def test_parse_networks_rejects_garbage_clearly():
    with pytest.raises(ValueError, match="'localhost' is not a valid IP network"):
        parse_networks(["localhost"])
    with pytest.raises(ValueError, match="'10.0.0.0/33'"):
        parse_networks(["10.0.0.0/33"])
