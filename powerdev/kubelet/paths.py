"""Names fixed by the device plugin API."""

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"  # the kubelet's; never touched
API_VERSION = "v1beta1"
# The kubelet's PodResources API (which pod holds which device).
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
