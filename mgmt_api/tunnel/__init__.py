"""The agent tunnel inside ``mgmt-api serve``: connected agents, and calls routed to them."""
