// draharness runs the kubelet's own DRA manager
// (k8s.io/kubernetes/pkg/kubelet/cm/dra) and its plugin manager
// (k8s.io/kubernetes/pkg/kubelet/pluginmanager, with the DRA manager's
// handler for DRAPlugin), against a real API server, driven by one command
// per line on stdin and answering each with one JSON object per line on
// stdout. A DRA driver that puts its registration socket in the registry
// directory is found, registered and called exactly as a kubelet does;
// pods and ResourceClaims are read from the API server. README.md lists
// the commands.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"

	"powerdev.local/conformance/lineproto"
)

// The DRA manager's checkpoint, in STATE_DIR (dra.draManagerStateFileName).
const checkpointFile = "dra_manager_state"

// How long prepare and unprepare may take: the DRA manager gives each
// driver call 45 s, and reads each claim from the API server first.
const callLimit = 2 * time.Minute

type reply map[string]any

type dirs struct{ registry, plugins, state string }

// instance: one kubelet's worth of managers, from start (or restart) to stop.
type instance struct {
	dra       *dra.Manager
	plugins   *draplugin.DRAPluginManager
	cancel    context.CancelFunc
	stopCh    chan struct{}
	done      chan struct{} // closed when the plugin manager's Run returned
	firstWipe int           // index in the board's wipes where this instance began
}

type harness struct {
	logger klog.Logger
	api    *apiView
	board  *board
	dirs   *dirs
	cur    *instance
}

type allSourcesReady struct{}

func (allSourcesReady) AddSource(string) {}
func (allSourcesReady) AllReady() bool   { return true }

// startInstance makes the managers as a starting kubelet does: the DRA
// manager on its state directory (reading its checkpoint), started; then
// the plugin manager on the registry directory with the DRA manager's
// handler for DRAPlugin, run.
func (h *harness) startInstance() error {
	d := h.dirs
	for _, dir := range []string{d.registry, d.plugins, d.state} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	// Before Start: its wipe of the node's ResourceSlices begins there.
	var firstWipe int
	h.board.read(func(s *state) { firstWipe = len(s.wipes) })
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), h.logger))
	mgr, err := dra.NewManager(h.logger, h.api.client, d.state)
	if err != nil {
		cancel()
		return err
	}
	if err := mgr.Start(ctx, h.api.activePods, h.api.getNode, allSourcesReady{}); err != nil {
		cancel()
		return err
	}
	handler := mgr.GetWatcherHandler()
	plugins, ok := handler.(*draplugin.DRAPluginManager)
	if !ok {
		cancel()
		return fmt.Errorf("the DRA manager's plugin handler is a %T, not a *plugin.DRAPluginManager", handler)
	}
	// The kubelet's sync loop reads the manager's Updates (pods whose
	// devices' health changed) and writes those pods' status again; here
	// each one is written down on the board, which wakes waithealth.
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case update := <-mgr.Updates():
				h.board.update(func(s *state) {
					s.updates = append(s.updates, podUpdate{T: time.Now().UnixMilli(), Pods: update.PodUIDs})
				})
			}
		}
	}()
	pm := pluginmanager.NewPluginManager(d.registry, &record.FakeRecorder{})
	pm.AddHandler(registerapi.DRAPlugin, &recordingHandler{inner: handler, board: h.board, plugins: d.plugins})
	stopCh, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		pm.Run(ctx, allSourcesReady{}, stopCh)
	}()
	h.cur = &instance{dra: mgr, plugins: plugins, cancel: cancel, stopCh: stopCh, done: done, firstWipe: firstWipe}
	return nil
}

// stopInstance ends both managers: no more registrations, the drivers'
// connections closed, background work cancelled. What a kubelet leaves
// behind when it stops (the checkpoint, the drivers' sockets) stays.
func (h *harness) stopInstance() {
	cur := h.cur
	if cur == nil {
		return
	}
	h.cur = nil
	close(cur.stopCh)
	<-cur.done
	cur.plugins.Stop()
	cur.cancel()
	h.board.update(func(s *state) { s.drivers = nil })
}

func (h *harness) started() (*instance, error) {
	if h.cur == nil {
		return nil, errors.New("not started: send 'start REGISTRY_DIR PLUGINS_DIR STATE_DIR' first")
	}
	return h.cur, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// containers: every container of the pod, init containers first.
func containers(pod *v1.Pod) []*v1.Container {
	var all []*v1.Container
	for i := range pod.Spec.InitContainers {
		all = append(all, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		all = append(all, &pod.Spec.Containers[i])
	}
	return all
}

// cdiDevices: GetResources for each container, as the kubelet asks when it
// makes the container's runtime config: container name -> CDI device IDs.
func cdiDevices(mgr *dra.Manager, pod *v1.Pod) (map[string][]string, error) {
	out := map[string][]string{}
	for _, c := range containers(pod) {
		info, err := mgr.GetResources(pod, c)
		if err != nil {
			return out, fmt.Errorf("container %s: %w", c.Name, err)
		}
		ids := []string{}
		for _, device := range info.CDIDevices {
			ids = append(ids, device.Name)
		}
		out[c.Name] = ids
	}
	return out, nil
}

// onPod: what every command on one pod starts from, the started kubelet, a
// context bounded by callLimit and the pod, handed to do with the reply
// that names the pod.
func (h *harness) onPod(ref string, do func(ctx context.Context, cur *instance, pod *v1.Pod, answer reply) (reply, error)) (reply, error) {
	cur, err := h.started()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), h.logger), callLimit)
	defer cancel()
	pod, remembered, err := h.api.pod(ctx, ref)
	if err != nil {
		return nil, err
	}
	return do(ctx, cur, pod, reply{"pod": ref, "uid": string(pod.UID), "remembered": remembered})
}

func (h *harness) podCommand(verb, ref string) (reply, error) {
	return h.onPod(ref, func(ctx context.Context, cur *instance, pod *v1.Pod, answer reply) (reply, error) {
		return podVerb(ctx, cur, pod, answer, verb)
	})
}

func podVerb(ctx context.Context, cur *instance, pod *v1.Pod, answer reply, verb string) (reply, error) {
	var err error
	began := time.Now()
	switch verb {
	case "prepare":
		err = cur.dra.PrepareResources(ctx, pod)
		answer["ms"] = ms(time.Since(began))
		if err != nil {
			return answer, err
		}
		answer["containers"], err = cdiDevices(cur.dra, pod)
		return answer, err
	case "unprepare":
		err = cur.dra.UnprepareResources(ctx, pod)
		answer["ms"] = ms(time.Since(began))
		return answer, err
	case "resources":
		answer["containers"], err = cdiDevices(cur.dra, pod)
		return answer, err
	case "health":
		answer["containers"] = healthOf(cur.dra, pod)
		return answer, nil
	}
	return nil, fmt.Errorf("unknown pod command %q", verb)
}

// healthOf: each container's AllocatedResourcesStatus, as the kubelet puts
// it into the pod's status from the DRA manager's health cache.
func healthOf(mgr *dra.Manager, pod *v1.Pod) map[string][]v1.ResourceStatus {
	status := &v1.PodStatus{}
	for _, c := range pod.Spec.Containers {
		status.ContainerStatuses = append(status.ContainerStatuses, v1.ContainerStatus{Name: c.Name})
	}
	mgr.UpdateAllocatedResourcesStatus(pod, status)
	health := map[string][]v1.ResourceStatus{}
	for _, s := range status.ContainerStatuses {
		health[s.Name] = append([]v1.ResourceStatus{}, s.AllocatedResourcesStatus...)
	}
	return health
}

// allReport: at least one device is reported, and every one as want.
func allReport(health map[string][]v1.ResourceStatus, want v1.ResourceHealthStatus) bool {
	seen := 0
	for _, statuses := range health {
		for _, s := range statuses {
			for _, r := range s.Resources {
				if r.Health != want {
					return false
				}
				seen++
			}
		}
	}
	return seen > 0
}

// A kubelet writes a pod's status when the manager asks (its Updates) and
// at every other sync of the pod; the manager asks only when a report
// changes a device some cached claim holds, so a report that comes before
// the claim is cached (the driver may send it before its prepare answer)
// is seen at the pod's next sync. waithealth looks again at this pace too.
const healthSync = 100 * time.Millisecond

// waitHealth: until every device the pod's containers hold is reported as
// want, looked at again whenever the board changes (the manager's pod
// updates above, as the kubelet's sync loop is woken by them) and every
// healthSync.
func (h *harness) waitHealth(ref, want string, timeout time.Duration) (reply, error) {
	return h.onPod(ref, func(_ context.Context, cur *instance, pod *v1.Pod, answer reply) (reply, error) {
		return h.awaitHealth(cur, pod, answer, ref, want, timeout)
	})
}

func (h *harness) awaitHealth(cur *instance, pod *v1.Pod, answer reply, ref, want string, timeout time.Duration) (reply, error) {
	var health map[string][]v1.ResourceStatus
	began := time.Now()
	ok := false
	for !ok && time.Since(began) < timeout {
		ok = h.board.waitFor(min(healthSync, timeout-time.Since(began)), func(*state) bool {
			health = healthOf(cur.dra, pod)
			return allReport(health, v1.ResourceHealthStatus(want))
		})
	}
	answer["ok"], answer["waited_ms"], answer["containers"] = ok, ms(time.Since(began)), health
	if !ok {
		return answer, fmt.Errorf("waithealth: not every device of %s is %s after %d ms", ref, want, timeout.Milliseconds())
	}
	return answer, nil
}

func intArg(words []string, i int) (int, error) {
	if i >= len(words) {
		return 0, fmt.Errorf("%s: argument %d is missing", words[0], i)
	}
	n, err := strconv.Atoi(words[i])
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s: argument %d: %q is not a whole number >= 0", words[0], i, words[i])
	}
	return n, nil
}

func millis(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func (h *harness) run(words []string) (reply, error) {
	need := func(n int) error {
		if len(words) < n {
			return fmt.Errorf("%s needs %d argument(s)", words[0], n-1)
		}
		return nil
	}
	switch words[0] {
	case "start":
		if err := need(4); err != nil {
			return nil, err
		}
		if h.cur != nil {
			return nil, errors.New("started already: stop first, or restart")
		}
		abs := make([]string, 3)
		for i := range abs {
			path, err := filepath.Abs(words[i+1])
			if err != nil {
				return nil, err
			}
			abs[i] = path
		}
		h.dirs = &dirs{registry: abs[0], plugins: abs[1], state: abs[2]}
		began := time.Now()
		if err := h.startInstance(); err != nil {
			return nil, err
		}
		return reply{
			"registry_dir": abs[0], "plugins_dir": abs[1], "state_dir": abs[2],
			"checkpoint": filepath.Join(abs[2], checkpointFile), "node": h.api.nodeName,
			"ms": ms(time.Since(began)),
		}, nil
	case "stop":
		h.stopInstance()
		return reply{}, nil
	case "restart":
		if h.dirs == nil {
			return nil, errors.New("never started: nothing to restart")
		}
		began := time.Now()
		h.stopInstance()
		down := time.Since(began)
		if err := h.startInstance(); err != nil {
			return nil, err
		}
		return reply{"stop_ms": ms(down), "ms": ms(time.Since(began))}, nil
	case "drivers":
		var found []registration
		h.board.read(func(s *state) { found = s.registered() })
		return reply{"drivers": found}, nil
	case "events":
		var events []handlerEvent
		h.board.read(func(s *state) { events = append([]handlerEvent{}, s.events...) })
		return reply{"events": events}, nil
	case "waitdriver", "waitgone":
		if err := need(3); err != nil {
			return nil, err
		}
		timeout, err := intArg(words, 2)
		if err != nil {
			return nil, err
		}
		name, want := words[1], words[0] == "waitdriver"
		began := time.Now()
		ok := h.board.waitFor(millis(timeout), func(s *state) bool { return s.has(name) == want })
		var found []registration
		h.board.read(func(s *state) { found = s.registered() })
		answer := reply{"ok": ok, "waited_ms": ms(time.Since(began)), "drivers": found}
		if !ok {
			return answer, fmt.Errorf("%s: %s after %d ms", words[0], map[bool]string{true: "not registered", false: "still registered"}[want], timeout)
		}
		return answer, nil
	case "wipes":
		var wipes []wipe
		h.board.read(func(s *state) { wipes = append([]wipe{}, s.wipes...) })
		return reply{"wipes": wipes}, nil
	case "waitwipe":
		if err := need(3); err != nil {
			return nil, err
		}
		cur, err := h.started()
		if err != nil {
			return nil, err
		}
		n, err := intArg(words, 1)
		if err != nil {
			return nil, err
		}
		timeout, err := intArg(words, 2)
		if err != nil {
			return nil, err
		}
		var since []wipe
		done := func(s *state) bool {
			since = since[:0]
			for _, w := range s.wipes[cur.firstWipe:] {
				if w.ok() {
					since = append(since, w)
				}
			}
			return len(since) >= n
		}
		began := time.Now()
		ok := h.board.waitFor(millis(timeout), done)
		answer := reply{"ok": ok, "waited_ms": ms(time.Since(began)), "wipes": append([]wipe{}, since...)}
		if !ok {
			return answer, fmt.Errorf("waitwipe: %d of %d ResourceSlice deletions after %d ms", len(since), n, timeout)
		}
		return answer, nil
	case "prepare", "unprepare", "resources", "health":
		if err := need(2); err != nil {
			return nil, err
		}
		return h.podCommand(words[0], words[1])
	case "waithealth":
		if err := need(4); err != nil {
			return nil, err
		}
		switch words[2] {
		case string(v1.ResourceHealthStatusHealthy), string(v1.ResourceHealthStatusUnhealthy), string(v1.ResourceHealthStatusUnknown):
		default:
			return nil, fmt.Errorf("waithealth: %q is not Healthy, Unhealthy or Unknown", words[2])
		}
		timeout, err := intArg(words, 3)
		if err != nil {
			return nil, err
		}
		return h.waitHealth(words[1], words[2], millis(timeout))
	case "updates":
		var updates []podUpdate
		h.board.read(func(s *state) { updates = append([]podUpdate{}, s.updates...) })
		return reply{"updates": updates}, nil
	case "checkpoint":
		if h.dirs == nil {
			return nil, errors.New("never started: no state directory")
		}
		path := filepath.Join(h.dirs.state, checkpointFile)
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var parsed any
		if err := json.Unmarshal(raw, &parsed); err != nil {
			return reply{"path": path, "raw": string(raw)}, fmt.Errorf("%s is not JSON: %w", path, err)
		}
		answer := reply{"path": path, "raw": string(raw), "checkpoint": parsed}
		// The claims are a JSON document of their own, in a string beside its checksum.
		if outer, ok := parsed.(map[string]any); ok {
			if data, ok := outer["Data"].(string); ok {
				var claims any
				if err := json.Unmarshal([]byte(data), &claims); err == nil {
					answer["data"] = claims
				}
			}
		}
		return answer, nil
	case "sleep":
		n, err := intArg(words, 1)
		if err != nil {
			return nil, err
		}
		time.Sleep(millis(n)) // asked for by name
		return reply{}, nil
	case "quit":
		return reply{}, nil
	}
	return nil, fmt.Errorf("unknown command %q", words[0])
}

func main() {
	klog.InitFlags(nil)
	hostname, _ := os.Hostname()
	kubeconfig := flag.String("kubeconfig", "", "the API server to read pods and ResourceClaims from (and to wipe the node's ResourceSlices on, as a kubelet does); without it, only registration works")
	nodeName := flag.String("node-name", strings.ToLower(hostname), "the Node this kubelet is")
	flag.Parse()
	b := newBoard()
	api := &apiView{nodeName: *nodeName}
	if *kubeconfig != "" {
		client, err := newClient(*kubeconfig, b)
		if err != nil {
			fmt.Fprintln(os.Stderr, "draharness:", err)
			os.Exit(1)
		}
		api.client = client
	}
	h := &harness{logger: klog.Background(), api: api, board: b}
	lineproto.Serve("draharness", func(words []string) (map[string]any, error) { return h.run(words) })
	h.stopInstance()
}
