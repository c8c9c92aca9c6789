"""`kms-plugin`: the Kubernetes KMS v2 plugin. It serves `v2.KeyManagementService`
(compiled from the upstream api.proto in `v2/`) on a unix socket beside kube-apiserver and
does every Encrypt and Decrypt in the key server's HSM through its REST API, under its own
scoped API token — docs/integrations.md "Kubernetes: KMS v2 plugin", decision 0021.

`backend.py` the key server client and the key id format; `service.py` the gRPC service,
its health and its socket; `cli.py` the entry point. It imports nothing else of the agent's
but `agents.errors`."""
