package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	sliceCollection = "/apis/resource.k8s.io/v1/resourceslices"
	apiTimeout      = 30 * time.Second
)

// wipe: one DeleteCollection of ResourceSlices that the DRA manager sent
// (at start for every driver of the node; for one driver when it has been
// away for the wiping delay), seen on the client's transport.
type wipe struct {
	T        int64  `json:"t"`
	Selector string `json:"field_selector"`
	Status   int    `json:"status"` // HTTP status; 0 when the request failed
	Error    string `json:"error,omitempty"`
}

func (w wipe) ok() bool { return w.Status >= 200 && w.Status < 300 }

// sliceWatcher passes every request on, and writes down the deletions of
// ResourceSlice collections with their outcome.
type sliceWatcher struct {
	next  http.RoundTripper
	board *board
}

func (s *sliceWatcher) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.next.RoundTrip(req)
	if req.Method == http.MethodDelete && strings.TrimSuffix(req.URL.Path, "/") == sliceCollection {
		seen := wipe{T: time.Now().UnixMilli(), Selector: req.URL.Query().Get("fieldSelector")}
		if err != nil {
			seen.Error = err.Error()
		} else {
			seen.Status = resp.StatusCode
		}
		s.board.update(func(st *state) { st.wipes = append(st.wipes, seen) })
	}
	return resp, err
}

// newClient: a clientset from the kubeconfig, its transport watched.
func newClient(kubeconfig string, b *board) (kubernetes.Interface, error) {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	config.UserAgent = "draharness"
	config.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &sliceWatcher{next: rt, board: b} })
	return kubernetes.NewForConfig(config)
}

// apiView is what the kubelet reads from the API server for the DRA
// manager: its Node, the pods bound to it, and single pods by name. It
// remembers the last version of each pod it read, as the kubelet keeps a
// pod it knows after the API server has forgotten it (force deletion).
type apiView struct {
	client   kubernetes.Interface
	nodeName string

	mu     sync.Mutex
	known  map[string]*v1.Pod // namespace/name -> last read
	active []*v1.Pod          // the last list that worked
}

func (a *apiView) getNode(ctx context.Context) (*v1.Node, error) {
	if a.client == nil {
		return nil, errors.New("no API server: start the harness with -kubeconfig")
	}
	return a.client.CoreV1().Nodes().Get(ctx, a.nodeName, metav1.GetOptions{})
}

// activePods: the pods bound to the node that are not Succeeded or Failed,
// as the kubelet's own list (from its API server source) has them. The DRA
// manager's reconcile loop unprepares claims of every other pod it knows.
// When the API server does not answer, the last list: a kubelet does not
// forget its pods when the API server is away.
func (a *apiView) activePods() []*v1.Pod {
	if a.client == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	selector := fields.OneTermEqualSelector("spec.nodeName", a.nodeName).String()
	list, err := a.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: selector})
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		return append([]*v1.Pod(nil), a.active...)
	}
	a.active = a.active[:0]
	for i := range list.Items {
		pod := &list.Items[i]
		if pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed {
			a.active = append(a.active, pod)
		}
	}
	return append([]*v1.Pod(nil), a.active...)
}

// pod: NAMESPACE/NAME from the API server; if it is gone there, the last
// version read (with "remembered": true).
func (a *apiView) pod(ctx context.Context, ref string) (*v1.Pod, bool, error) {
	namespace, name, ok := strings.Cut(ref, "/")
	if !ok || namespace == "" || name == "" {
		return nil, false, fmt.Errorf("%q: want NAMESPACE/POD", ref)
	}
	if a.client == nil {
		return nil, false, errors.New("no API server: start the harness with -kubeconfig")
	}
	pod, err := a.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.known == nil {
		a.known = map[string]*v1.Pod{}
	}
	if apierrors.IsNotFound(err) {
		if known := a.known[ref]; known != nil {
			return known, true, nil
		}
	}
	if err != nil {
		return nil, false, fmt.Errorf("get pod %s: %w", ref, err)
	}
	if pod.Spec.NodeName != a.nodeName {
		return nil, false, fmt.Errorf("pod %s is bound to node %q, not to this node %q", ref, pod.Spec.NodeName, a.nodeName)
	}
	a.known[ref] = pod
	return pod, false, nil
}
