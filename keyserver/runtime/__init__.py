"""What runs the key server: worker processes and their sockets, the ASGI entry, TLS for
every port, the agent port beside the REST port, and the agent wheel it distributes.
`keyserver/api` (REST), `keyserver/kmip` and `keyserver/core` know nothing of this."""
