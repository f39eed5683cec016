"""Directory sync: users and teams from Microsoft Graph or LDAP, full and exact.

``model`` (the snapshot types), ``reconcile`` (pure planning), ``store``
(the ``DirectoryStore`` protocol the SQL store implements, plus an
in-memory one for tests), ``runner`` (fetch → plan → apply, last good state
kept on failure, the periodic job), and the sources ``graph`` and ``ldap``.
"""
