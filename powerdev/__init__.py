"""powerdev: a Kubernetes device plugin that hands host device nodes to
non-privileged containers, as a drop-in replacement for IBM's Power Device
Plugin (same config.json, resource name and socket name)."""

__version__ = "0.1.0"
