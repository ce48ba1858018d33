"""Names fixed by the device plugin API, and where the kubelet finds DRA drivers."""

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"  # the kubelet's; never touched
API_VERSION = "v1beta1"
# The kubelet's PodResources API (which pod holds which device).
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# DRA: the plugin watcher's registry, and where drivers serve (<dir>/<driver>/).
DEFAULT_DRA_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_DRA_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_DRA_DRIVER = "dra.powerdev.io"  # ours unless --dra-driver says otherwise
