"""Compilers from management-plane resources to what the services load.

Every artifact here has exactly the format the services accept from a file
(``ratelimit serve --config``, ``extauthz serve --config``), so streamed and
static modes share one loader, and what the management plane sends can be
reproduced and inspected by hand.
"""
