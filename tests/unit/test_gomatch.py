"""Patterns mean what Go's path/filepath Match and Glob make of them: a table
of cases from Go's documented pattern syntax, and Glob over a temp tree."""

import pytest

from powerdev.devices import gomatch

MATCHES = [
    ("abc", "abc", True),
    ("*", "abc", True),
    ("*c", "abc", True),
    ("a*", "a", True),
    ("a*", "abc", True),
    ("a*", "ab/c", False),  # '*' never crosses a '/'
    ("a*/b", "abc/b", True),
    ("a*/b", "a/c/b", False),
    ("a*b*c*d*e*/f", "axbxcxdxe/f", True),
    ("a*b?c*x", "abxbbxdbxebxczzx", True),
    ("a*b?c*x", "abxbbxdbxebxczzy", False),
    ("ab[c]", "abc", True),
    ("ab[b-d]", "abc", True),
    ("ab[e-g]", "abc", False),
    ("ab[^c]", "abc", False),  # Go negates with '^'
    ("ab[^b-d]", "abc", False),
    ("ab[^e-g]", "abc", True),
    ("sd[!0-9]", "sd!", True),  # ... and '!' is an ordinary character
    ("sd[!0-9]", "sda", False),
    ("sd[^0-9]", "sda", True),
    ("a\\*b", "a*b", True),  # a backslash makes the next character literal
    ("a\\*b", "ab", False),
    ("dm\\-0", "dm-0", True),
    ("a?b", "a☺b", True),
    ("a[^a]b", "a☺b", True),
    ("a???b", "a☺b", False),
    ("[a-ζ]*", "\u03b1", True),  # alpha
    ("*[a-ζ]", "A", False),
    ("a?b", "a/b", False),
    ("a*b", "a/b", False),
    ("[\\]a]", "]", True),
    ("[\\-]", "-", True),
    ("[x\\-]", "x", True),
    ("[x\\-]", "-", True),
    ("[x\\-]", "z", False),
    ("[\\-x]", "-", True),
    ("[\\-x]", "a", False),
    ("[z-a]", "m", False),  # a reversed range matches nothing
    ("*x", "xxx", True),
    ("/dev/mapper/*", "/dev/mapper/mpatha", True),
    ("/dev/dm-*", "/dev/mapper/x", False),
    ("/dev/.hidden*", "/dev/.hidden1", True),
]

BAD = [
    "[]a]",  # a class must not be empty
    "[-]",
    "[x-]",
    "[-x]",
    "\\",  # a trailing backslash escapes nothing
    "a\\",
    "[a-b-c]",
    "[",
    "[^",
    "[^bc",
    "a[",
    "/dev/sd[a-",
]


@pytest.mark.parametrize(("pattern", "name", "hit"), MATCHES)
def test_match_as_go(pattern, name, hit):
    assert gomatch.match(pattern, name) is hit


@pytest.mark.parametrize("pattern", BAD)
def test_bad_patterns_as_go(pattern):
    assert gomatch.problem(pattern)
    with pytest.raises(gomatch.BadPattern):
        gomatch.match(pattern, "a")


def test_glob_walks_one_element_at_a_time(tmp_path):
    for rel in [
        "sda",
        "sdb1",
        "sd!",
        "dm-0",
        "mapper/mpatha",
        "mapper/control",
        "disk/by-id/wwn-1",
    ]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).touch()
    assert gomatch.glob(tmp_path, "/sd[^0-9]") == ["/sd!", "/sda"]
    assert gomatch.glob(tmp_path, "/sd[!0-9]") == ["/sd!"]
    assert gomatch.glob(tmp_path, "/mapper/*") == ["/mapper/control", "/mapper/mpatha"]
    assert gomatch.glob(tmp_path, "/disk/by-*/wwn-*") == ["/disk/by-id/wwn-1"]
    assert gomatch.glob(tmp_path, "/nothere/*") == []
    assert gomatch.glob(tmp_path, "/dm\\-0") == ["/dm-0"]


@pytest.mark.parametrize(
    ("a", "b", "common"),
    [
        ("/dev/dm-*", "/dev/dm-1", True),
        ("/dev/dm-*", "/dev/sd*", False),
        ("/dev/mapper/*", "/dev/mapper/mpath?", True),
        ("/dev/mapper/*", "/dev/*", False),  # '*' never crosses a '/'
        ("/dev/sd[a-c]", "/dev/sd[d-f]", False),
        ("/dev/sd[^a]", "/dev/sda", False),
        ("/dev/sd[^a]", "/dev/sdb", True),
        ("/dev/*a", "/dev/b*", True),  # "/dev/ba"
        ("mpath-*", "LVM-*", False),
        ("/dev/loop3[0-9][0-9]", "/dev/loop39[0-9]", True),
        ("a\\*", "a*", True),  # "a*" itself
        ("a\\*", "ab", False),
        ("[z-a]x", "*", False),  # a reversed range matches nothing
    ],
)
def test_overlap_says_whether_two_patterns_share_a_name(a, b, common):
    assert gomatch.overlap(a, b) is common
    assert gomatch.overlap(b, a) is common
