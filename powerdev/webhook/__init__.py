"""The mutating admission webhook: `powerdev webhook` adds the device resource
to the pods of chosen namespaces. config.py reads webhook.json, patch.py
decides and builds the JSONPatch, review.py answers an AdmissionReview,
tls.py keeps the served key pair current, server.py serves it all over
HTTPS in a Trio nursery. Its sub-commands are powerdev.cli.webhook, its
bench powerdev.devtools.webhook_bench.

May import: support, config (its errors and file checks, the config watch)."""
