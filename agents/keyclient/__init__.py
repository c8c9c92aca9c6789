"""The agent's side of the key server: its identity, the key cache, the event spool
(and, with issue 4's server routes, the mTLS client)."""
