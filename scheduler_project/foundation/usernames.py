"""One spelling per user name, for everything that compares them: sign-in throttling, creating
accounts and finding a member by name.

Django's sign-in form folds a name with NFKC before it looks the account up, so `ｖｉｃｔｉｍ`
(fullwidth) or `victiⅿ` (the roman numeral) signs in as `victim`. Anything that counts or
compares names must fold them the same way, and case too (`Victim` is the same person to a
reader), or a look-alike spelling is a way around it.
"""

import unicodedata


def normalized_username(name: str) -> str:
    """What the sign-in form looks accounts up by (NFKC, as Django's UsernameField does)."""
    return unicodedata.normalize("NFKC", name or "").strip()


def canonical_username(name: str) -> str:
    """The folded form two names that read alike share: NFKC, case folded, NFKC again (folding
    can leave a string that is no longer NFKC)."""
    return unicodedata.normalize("NFKC", normalized_username(name).casefold())


def look_alike_of(name: str, existing, *, exclude=None) -> str | None:
    """The first of `existing` (user names) that reads as `name` does, other than `exclude`."""
    wanted = canonical_username(name)
    for other in existing:
        if other != exclude and canonical_username(other) == wanted:
            return other
    return None
