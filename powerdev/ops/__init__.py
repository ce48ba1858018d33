"""The operator's surface: what an admin reads and asks. The Prometheus
metrics, the ops HTTP port (/metrics, /healthz, /readyz), the log lines and
their format, the status file and `powerdev health`, and `powerdev scan`.

May import: support, devices, config, resources. Never rpc, daemon or cli.
"""
