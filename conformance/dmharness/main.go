// dmharness runs the kubelet's own device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager), with the topology
// manager (policy none), the kubelet's predicate admit handler and its
// PodResources v1 service, driven by one command per line on stdin and
// answering each with one JSON object per line on stdout. The commands are
// those the project's tests speak (the README's "The conformance kit"),
// plus podresources.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	cadvisorapi "github.com/google/cadvisor/info/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	"powerdev.local/conformance/lineproto"
)

type reply map[string]any

type harness struct {
	resource string
	logger   klog.Logger
	dir      string // the plugin directory, as the caller named it

	mu      sync.Mutex // guards the fields below
	mgr     *devicemanager.ManagerImpl
	topo    topologymanager.Manager
	podres  *grpc.Server
	cancel  context.CancelFunc // ends the PodResources server's rate limiter
	pods    []*v1.Pod          // the active pods, in the order they came
	stopped bool
}

func (h *harness) manager() *devicemanager.ManagerImpl {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mgr
}

func (h *harness) activePods() []*v1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*v1.Pod(nil), h.pods...)
}

func (h *harness) pod(name string) (*v1.Pod, error) {
	for _, pod := range h.activePods() {
		if pod.Name == name {
			return pod, nil
		}
	}
	return nil, fmt.Errorf("no pod %q", name)
}

func (h *harness) addPod(pod *v1.Pod) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pods = append(h.pods, pod)
}

func (h *harness) dropPod(name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, pod := range h.pods {
		if pod.Name == name {
			h.pods = append(h.pods[:i], h.pods[i+1:]...)
			return true
		}
	}
	return false
}

// numaNodes: the host's NUMA nodes, as cadvisor gives them to the kubelet.
func numaNodes() []cadvisorapi.Node {
	var nodes []cadvisorapi.Node
	paths, _ := filepath.Glob("/sys/devices/system/node/node[0-9]*")
	for _, path := range paths {
		if id, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(path), "node")); err == nil {
			nodes = append(nodes, cadvisorapi.Node{Id: id})
		}
	}
	if len(nodes) == 0 {
		nodes = []cadvisorapi.Node{{Id: 0}}
	}
	return nodes
}

type allSourcesReady struct{}

func (allSourcesReady) AddSource(string) {}
func (allSourcesReady) AllReady() bool   { return true }

// startManager: a new manager (and topology manager) as a starting kubelet
// makes them, started on the plugin dir; then the PodResources service.
func (h *harness) startManager() error {
	nodes := numaNodes()
	topo, err := topologymanager.NewManager(nodes, topologymanager.PolicyNone, topologymanager.ContainerTopologyScope, nil)
	if err != nil {
		return err
	}
	mgr, err := devicemanager.NewManagerImpl(nodes, topo)
	if err != nil {
		return err
	}
	topo.AddHintProvider(h.logger, mgr)
	if err := mgr.Start(h.logger, h.activePods, allSourcesReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	podres, err := servePodResources(ctx, h, podResourcesSocket(h.dir))
	if err != nil {
		cancel()
		_ = mgr.Stop(h.logger)
		return err
	}
	h.mu.Lock()
	h.mgr, h.topo, h.podres, h.cancel, h.stopped = mgr, topo, podres, cancel, false
	h.mu.Unlock()
	return nil
}

func (h *harness) stopManager() error {
	h.mu.Lock()
	mgr, podres, cancel, stopped := h.mgr, h.podres, h.cancel, h.stopped
	h.stopped = true
	h.mu.Unlock()
	if mgr == nil || stopped {
		return nil
	}
	podres.Stop()
	cancel()
	return mgr.Stop(h.logger)
}

func (h *harness) started() error {
	if h.manager() == nil {
		return errors.New("not started: send 'start DIR' first")
	}
	return nil
}

func counts(m *devicemanager.ManagerImpl, res string) (int64, int64, []string) {
	capacity, allocatable, removed := m.GetCapacity()
	c, a := capacity[v1.ResourceName(res)], allocatable[v1.ResourceName(res)]
	if removed == nil {
		removed = []string{}
	}
	sort.Strings(removed)
	return c.Value(), a.Value(), removed
}

// until polls cond every millisecond until it holds or the time is up.
func until(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func newPod(name string, count int64, res string) *v1.Pod {
	want := v1.ResourceList{v1.ResourceName(res): *resource.NewQuantity(count, resource.DecimalSI)}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{Containers: []v1.Container{{
			Name:      "c0",
			Resources: v1.ResourceRequirements{Limits: want, Requests: want},
		}}},
	}
}

// node is the Node the kubelet would report: room for any pod, plus the
// device plugin resources as GetCapacity says.
func (h *harness) node(context.Context, bool) (*v1.Node, error) {
	capacity := v1.ResourceList{
		v1.ResourceCPU:    resource.MustParse("64"),
		v1.ResourceMemory: resource.MustParse("256Gi"),
		v1.ResourcePods:   resource.MustParse("110"),
	}
	allocatable := capacity.DeepCopy()
	devCapacity, devAllocatable, _ := h.manager().GetCapacity()
	for name, q := range devCapacity {
		capacity[name] = q
	}
	for name, q := range devAllocatable {
		allocatable[name] = q
	}
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node", Labels: map[string]string{v1.LabelOSStable: "linux"}},
		Status:     v1.NodeStatus{Capacity: capacity, Allocatable: allocatable},
	}, nil
}

// noEviction: the kubelet's failure handler, for pods that are not critical.
type noEviction struct{}

func (noEviction) HandleAdmissionFailure(_ context.Context, _ *v1.Pod, reasons []lifecycle.PredicateFailureReason) ([]lifecycle.PredicateFailureReason, error) {
	return reasons, nil
}

func result(r lifecycle.PodAdmitResult) reply {
	return reply{"admit": r.Admit, "reason": r.Reason, "message": r.Message}
}

func (h *harness) runopts(pod *v1.Pod) (reply, error) {
	opts, err := h.manager().GetDeviceRunContainerOptions(context.Background(), pod, &pod.Spec.Containers[0])
	if err != nil {
		return nil, err
	}
	devices := []reply{}
	mounts := []reply{}
	envs := map[string]string{}
	annotations := map[string]string{}
	cdi := []string{}
	if opts != nil {
		for _, d := range opts.Devices {
			devices = append(devices, reply{"host": d.PathOnHost, "container": d.PathInContainer, "permissions": d.Permissions})
		}
		for _, m := range opts.Mounts {
			mounts = append(mounts, reply{"host": m.HostPath, "container": m.ContainerPath, "read_only": m.ReadOnly})
		}
		for _, e := range opts.Envs {
			envs[e.Name] = e.Value
		}
		for _, a := range opts.Annotations {
			annotations[a.Name] = a.Value
		}
		for _, c := range opts.CDIDevices {
			cdi = append(cdi, c.Name)
		}
	}
	return reply{"devices": devices, "mounts": mounts, "envs": envs, "annotations": annotations, "cdi_devices": cdi}, nil
}

// deviceIDs: what the manager recorded for the pod's container, all resources.
func (h *harness) deviceIDs(pod *v1.Pod) []string {
	ids := []string{}
	for _, devices := range h.manager().GetDevices(string(pod.UID), "c0") {
		for id := range devices {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// admit runs a new pod through admission as the kubelet orders it: the pod
// manager knows it first, then the topology manager's handler (which calls
// the device manager's Allocate), then the predicate handler. A rejected
// pod is no longer active.
func (h *harness) admit(name string, count int64, res string) (reply, error) {
	pod := newPod(name, count, res)
	others := h.activePods()
	h.addPod(pod)
	h.mu.Lock()
	topo, mgr := h.topo, h.mgr
	h.mu.Unlock()
	attrs := &lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: others, Operation: lifecycle.AddOperation}
	began := time.Now()
	allocated := topo.Admit(attrs)
	out := reply{"allocate_handler": result(allocated), "predicate": nil}
	admitted := allocated.Admit
	if admitted {
		predicate := lifecycle.NewPredicateAdmitHandler(h.node, noEviction{}, mgr.UpdatePluginResources).Admit(attrs)
		out["predicate"] = result(predicate)
		admitted = predicate.Admit
	}
	out["admit_ms"] = ms(time.Since(began))
	out["admitted"] = admitted
	if !admitted {
		h.dropPod(name)
		return out, nil
	}
	out["device_ids"] = h.deviceIDs(pod)
	opts, err := h.runopts(pod)
	if err != nil {
		return nil, err
	}
	out["runopts"] = opts
	return out, nil
}

func (h *harness) allocate(name string, count int64, res string) (reply, error) {
	pod := newPod(name, count, res)
	h.addPod(pod)
	if err := h.manager().Allocate(pod, &pod.Spec.Containers[0]); err != nil {
		h.dropPod(name)
		return nil, err
	}
	opts, err := h.runopts(pod)
	if err != nil {
		return nil, err
	}
	return reply{"device_ids": h.deviceIDs(pod), "runopts": opts}, nil
}

func (h *harness) state() reply {
	view := peek(h.manager(), h.resource)
	return reply{"state": reply{
		"healthy":         view.Healthy,
		"unhealthy":       view.Unhealthy,
		"allocated":       view.Allocated,
		"device_topology": view.Topology,
		"endpoint":        view.Endpoint,
		"endpoint_live":   view.Endpoint.Live,
		"options":         view.Endpoint.Options,
	}}
}

func (h *harness) live() bool {
	return peek(h.manager(), h.resource).Endpoint.Live
}

func (h *harness) restart(n int64, timeout, down time.Duration) (reply, error) {
	if n < 0 {
		n, _, _ = counts(h.manager(), h.resource)
	}
	if err := h.stopManager(); err != nil {
		return nil, err
	}
	time.Sleep(down) // the kubelet is down for this long: the command asks for it
	created := time.Now()
	if err := h.startManager(); err != nil {
		return nil, err
	}
	out := reply{"registered": false, "capacity_back": false}
	if until(timeout, h.live) {
		out["registered"], out["registered_ms"] = true, ms(time.Since(created))
	}
	if until(timeout-time.Since(created), func() bool {
		c, a, _ := counts(h.manager(), h.resource)
		return c == n && a == n
	}) {
		out["capacity_back"], out["capacity_back_ms"] = true, ms(time.Since(created))
	}
	out["capacity"], out["allocatable"], _ = counts(h.manager(), h.resource)
	return out, nil
}

// rawalloc calls Allocate on a plugin socket straight, as the kubelet's
// endpoint client would, and reports the gRPC status.
func (h *harness) rawalloc(socket string, ids []string) (reply, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(h.dir, socket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := pluginapi.NewDevicePluginClient(conn).Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}},
	})
	st := status.Convert(err)
	out := reply{"grpc_code": st.Code().String(), "grpc_message": st.Message(), "devices": 0}
	if err == nil && len(resp.ContainerResponses) > 0 {
		out["devices"] = len(resp.ContainerResponses[0].Devices)
		out["cdi_devices"] = len(resp.ContainerResponses[0].CdiDevices)
	}
	return out, nil
}

// podResources asks the kubelet's PodResources service, over its socket,
// as a node agent would: List and GetAllocatableResources.
func (h *harness) podResources() (reply, error) {
	conn, err := grpc.NewClient("unix://"+podResourcesSocket(h.dir), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := podresourcesapi.NewPodResourcesListerClient(conn)
	list, err := client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, err
	}
	held := map[string]map[string][]string{} // pod -> resource -> IDs
	for _, pod := range list.PodResources {
		byResource := map[string][]string{}
		for _, container := range pod.Containers {
			for _, devices := range container.Devices {
				byResource[devices.ResourceName] = append(byResource[devices.ResourceName], devices.DeviceIds...)
			}
		}
		for _, ids := range byResource {
			sort.Strings(ids)
		}
		held[pod.Namespace+"/"+pod.Name] = byResource
	}
	allocatable, err := client.GetAllocatableResources(ctx, &podresourcesapi.AllocatableResourcesRequest{})
	if err != nil {
		return nil, err
	}
	free := map[string][]string{}
	for _, devices := range allocatable.Devices {
		free[devices.ResourceName] = append(free[devices.ResourceName], devices.DeviceIds...)
	}
	for _, ids := range free {
		sort.Strings(ids)
	}
	return reply{"socket": podResourcesSocket(h.dir), "pods": held, "allocatable": free}, nil
}

func intArg(words []string, i int, fallback int64) (int64, error) {
	if len(words) <= i {
		return fallback, nil
	}
	return strconv.ParseInt(words[i], 10, 64)
}

func millis(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// run executes one command line.
func (h *harness) run(words []string) (reply, error) {
	need := func(n int) error {
		if len(words) < n {
			return fmt.Errorf("%s needs %d argument(s)", words[0], n-1)
		}
		return nil
	}
	res := func(i int) string {
		if len(words) > i {
			return words[i]
		}
		return h.resource
	}
	if words[0] != "start" && words[0] != "sleep" && words[0] != "quit" && words[0] != "addpod" {
		if err := h.started(); err != nil {
			return nil, err
		}
	}
	switch words[0] {
	case "start":
		if err := need(2); err != nil {
			return nil, err
		}
		dir, err := filepath.Abs(words[1])
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, err
		}
		if err := h.stopManager(); err != nil { // a second start: the first manager goes
			return nil, err
		}
		if err := mountPluginDir(dir); err != nil {
			return nil, err
		}
		h.dir = dir
		if err := h.startManager(); err != nil {
			return nil, err
		}
		return reply{"kubelet_socket": filepath.Join(dir, "kubelet.sock"), "podresources_socket": podResourcesSocket(dir)}, nil
	case "stop":
		return reply{}, h.stopManager()
	case "restart":
		n, err := intArg(words, 1, -1)
		if err != nil {
			return nil, err
		}
		timeout, err := intArg(words, 2, 10000)
		if err != nil {
			return nil, err
		}
		down, err := intArg(words, 3, 100)
		if err != nil {
			return nil, err
		}
		return h.restart(n, millis(timeout), millis(down))
	case "cap":
		c, a, removed := counts(h.manager(), h.resource)
		return reply{"capacity": c, "allocatable": a, "removed": removed}, nil
	case "state":
		return h.state(), nil
	case "wait":
		if err := need(4); err != nil {
			return nil, err
		}
		var want [3]int64
		for i := range want {
			v, err := intArg(words, i+1, 0)
			if err != nil {
				return nil, err
			}
			want[i] = v
		}
		began := time.Now()
		ok := until(millis(want[2]), func() bool {
			c, a, _ := counts(h.manager(), h.resource)
			return c == want[0] && a == want[1]
		})
		c, a, _ := counts(h.manager(), h.resource)
		return reply{"ok": ok, "capacity": c, "allocatable": a, "waited_ms": ms(time.Since(began))}, nil
	case "waitlive":
		timeout, err := intArg(words, 1, 10000)
		if err != nil {
			return nil, err
		}
		return reply{"ok": until(millis(timeout), h.live)}, nil
	case "admit", "allocate", "addpod":
		if err := need(3); err != nil {
			return nil, err
		}
		count, err := intArg(words, 2, 0)
		if err != nil {
			return nil, err
		}
		if _, err := h.pod(words[1]); err == nil {
			return nil, fmt.Errorf("pod %q exists already", words[1])
		}
		switch words[0] {
		case "admit":
			return h.admit(words[1], count, res(3))
		case "allocate":
			return h.allocate(words[1], count, res(3))
		}
		h.addPod(newPod(words[1], count, res(3)))
		return reply{}, nil
	case "runopts", "devices", "delpod":
		if err := need(2); err != nil {
			return nil, err
		}
		pod, err := h.pod(words[1])
		if err != nil {
			return nil, err
		}
		switch words[0] {
		case "runopts":
			opts, err := h.runopts(pod)
			return reply{"runopts": opts}, err
		case "devices":
			return reply{"device_ids": h.deviceIDs(pod)}, nil
		}
		h.dropPod(words[1])
		return reply{}, nil
	case "checkpoint":
		raw, err := os.ReadFile(filepath.Join(h.dir, "kubelet_internal_checkpoint"))
		if err != nil {
			return nil, err
		}
		var checkpoint any
		if err := json.Unmarshal(raw, &checkpoint); err != nil {
			return nil, err
		}
		return reply{"checkpoint": checkpoint}, nil
	case "rawalloc":
		if err := need(3); err != nil {
			return nil, err
		}
		return h.rawalloc(words[1], strings.Split(words[2], ","))
	case "podresources":
		return h.podResources()
	case "quit":
		return reply{}, nil
	case "sleep":
		n, err := intArg(words, 1, 0)
		if err != nil {
			return nil, err
		}
		time.Sleep(millis(n)) // asked for by name
		return reply{}, nil
	}
	return nil, fmt.Errorf("unknown command %q", words[0])
}

func main() {
	klog.InitFlags(nil)
	resource := flag.String("resource", "power-dev-plugin/dev", "the resource that cap, state, wait and admit look at")
	flag.Parse()
	if err := enterPrivateMountNamespace(); err != nil {
		fmt.Fprintln(os.Stderr, "dmharness:", err)
		os.Exit(1)
	}
	h := &harness{resource: *resource, logger: klog.Background()}
	lineproto.Serve("dmharness", func(words []string) (map[string]any, error) { return h.run(words) })
	_ = h.stopManager()
}
