package main

// What the device manager knows but does not export (healthy and unhealthy
// IDs, each device's topology, the plugin's options, whether its endpoint
// is live), read through reflection under the manager's own locks, in the
// order the manager takes them (its mutex, then the endpoint's). Reading
// only: the harness never writes the manager's state.

import (
	"reflect"
	"sort"
	"sync"
	"time"
	"unsafe"

	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// private makes an unexported, addressable field readable.
func private(v reflect.Value) reflect.Value {
	return reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem()
}

func field(v reflect.Value, name string) reflect.Value {
	return private(v.FieldByName(name))
}

type endpointView struct {
	Present bool                           `json:"present"`
	Live    bool                           `json:"live"`
	Options *pluginapi.DevicePluginOptions `json:"options"`
}

type managerView struct {
	Healthy   []string
	Unhealthy []string
	Allocated []string
	Topology  map[string]*pluginapi.TopologyInfo
	Endpoint  endpointView
}

func sortedIDs(set sets.Set[string]) []string {
	ids := sets.List(set)
	if ids == nil {
		ids = []string{}
	}
	return ids
}

// peek reads what the manager holds for one resource.
func peek(m *devicemanager.ManagerImpl, resource string) managerView {
	mv := reflect.ValueOf(m).Elem()
	lock := field(mv, "mutex").Addr().Interface().(*sync.Mutex)
	lock.Lock()
	defer lock.Unlock()

	healthy := field(mv, "healthyDevices").Interface().(map[string]sets.Set[string])
	unhealthy := field(mv, "unhealthyDevices").Interface().(map[string]sets.Set[string])
	allocated := field(mv, "allocatedDevices").Interface().(map[string]sets.Set[string])
	all := field(mv, "allDevices").Interface().(devicemanager.ResourceDeviceInstances)
	view := managerView{
		Healthy:   sortedIDs(healthy[resource]),
		Unhealthy: sortedIDs(unhealthy[resource]),
		Allocated: sortedIDs(allocated[resource]),
		Topology:  map[string]*pluginapi.TopologyInfo{},
	}
	for id, device := range all[resource] {
		view.Topology[id] = device.GetTopology()
	}
	info := field(mv, "endpoints").MapIndex(reflect.ValueOf(resource))
	if info.IsValid() {
		copied := reflect.New(info.Type()).Elem()
		copied.Set(info)
		view.Endpoint.Present = true
		view.Endpoint.Options = field(copied, "opts").Interface().(*pluginapi.DevicePluginOptions)
		view.Endpoint.Live = endpointLive(field(copied, "e"))
	}
	return view
}

// endpointLive: the endpoint has no stop time (the kubelet's isStopped).
func endpointLive(e reflect.Value) bool {
	if e.IsNil() {
		return false
	}
	impl := e.Elem().Elem() // interface -> *endpointImpl -> endpointImpl
	lock := field(impl, "mutex").Addr().Interface().(*sync.Mutex)
	lock.Lock()
	defer lock.Unlock()
	return field(impl, "stopTime").Interface().(time.Time).IsZero()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
