"""Strongroom's host agent: the encrypted file format, guard points, the key client, the
`kms-agent` CLI and daemon. Shipped to hosts as the `strongroom-agent` wheel that the key
server builds from this package and serves under /downloads/."""

__version__ = "0.1.0"
