"""`manage.py audit`: the name the operations contract gives the invariant checker. It is
`check_invariants` (in this code base "audit" is the audit log of who changed what)."""

from dispatch.management.commands.check_invariants import Command  # noqa: F401
