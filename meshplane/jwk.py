"""What makes a JSON Web Key private: one owner for every place that refuses or redacts one.

RFC 7518 section 6: ``k`` (a symmetric key), and ``d``, ``p``, ``q``,
``dp``, ``dq``, ``qi``, ``oth`` (an RSA or EC private key). mgmt-api refuses
them where only public keys belong and redacts them where people read
configuration; the cluster agent redacts them in every diagnostics answer.
"""

from __future__ import annotations

#: JWK members that hold key material which must never be shown or shared.
PRIVATE_MEMBERS = frozenset({"k", "d", "p", "q", "dp", "dq", "qi", "oth"})
