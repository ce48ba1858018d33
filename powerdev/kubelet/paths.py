"""Names fixed by the device plugin API."""

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"  # the kubelet's; never touched
API_VERSION = "v1beta1"
