// kubelet-topology-check admits pods through the kubelet's own Topology Manager and device manager
// (k8s.io/kubernetes v1.34.4 pkg/kubelet/cm/topologymanager and pkg/kubelet/cm/devicemanager), talking to a
// real device plugin over its Unix socket, and prints what the kubelet decided.
//
// It serves the device manager's registration socket <plugin-dir>/kubelet.sock (the plugin registers there
// and is dialled back as the kubelet would), then reads one JSON pod per stdin line:
//
//	{"name": "p", "uid": "u", "containers": [{"name": "main", "count": 2}]}
//
// and answers one JSON line per pod: {"pod", "admitted", "reason", "message", "devices": {container: [ids]}}.
// Admitted pods stay allocated (they are the active pods) until a line {"delete": "<name>"} ends one; the
// device manager frees its devices at the next admission (UpdateAllocatedDevices), as the kubelet does.
//
// Built by hack/build-kubelet-topology-check.sh into the tool cache; used by
// tests/integration/test_kubelet_topology_go.py. Our own code: it only calls the kubelet's packages.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	_ "unsafe" // go:linkname below

	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// newManagerImpl is the device manager's constructor with the socket path as a parameter
// (pkg/kubelet/cm/devicemanager/manager.go, v1.34.4); the exported NewManagerImpl fixes it to
// /var/lib/kubelet/device-plugins/kubelet.sock, and this check must not touch a real kubelet's folder.
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(socketPath string, topology []cadvisorapi.Node, store topologymanager.Store) (*devicemanager.ManagerImpl, error)

type allReady struct{}

func (allReady) AddSource(string) {}
func (allReady) AllReady() bool   { return true }

type containerIn struct {
	Name  string `json:"name"`
	Count int64  `json:"count"`
}

type podIn struct {
	Delete     string        `json:"delete"` // instead of a pod: the named pod ends (no answer line)
	Name       string        `json:"name"`
	UID        string        `json:"uid"`
	Containers []containerIn `json:"containers"`
}

type result struct {
	Pod      string              `json:"pod"`
	Admitted bool                `json:"admitted"`
	Reason   string              `json:"reason,omitempty"`
	Message  string              `json:"message,omitempty"`
	Devices  map[string][]string `json:"devices"`
}

func main() {
	dir := flag.String("plugin-dir", "", "folder for kubelet.sock (the plugin's socket is expected there too)")
	policy := flag.String("policy", "none", "topology manager policy")
	scope := flag.String("scope", "container", "topology manager scope")
	numa := flag.String("numa-nodes", "0,1", "the machine's NUMA node ids")
	res := flag.String("resource", "nvidia.com/gpu", "the device plugin's resource name")
	wait := flag.Duration("wait", 30*time.Second, "how long to wait for the plugin's devices")
	flag.Parse()
	klog.LogToStderr(true)
	if *dir == "" {
		fail("--plugin-dir is required")
	}
	var nodes []cadvisorapi.Node
	for _, s := range strings.Split(*numa, ",") {
		id, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			fail(fmt.Sprintf("--numa-nodes: %q is not a NUMA node id", s))
		}
		nodes = append(nodes, cadvisorapi.Node{Id: id})
	}
	tm, err := topologymanager.NewManager(nodes, *policy, *scope, nil)
	if err != nil {
		fail(fmt.Sprintf("topology manager: %v", err))
	}
	dm, err := newManagerImpl(filepath.Join(*dir, "kubelet.sock"), nodes, tm)
	if err != nil {
		fail(fmt.Sprintf("device manager: %v", err))
	}
	tm.AddHintProvider(dm)
	var mu sync.Mutex
	var active []*v1.Pod
	activePods := func() []*v1.Pod { mu.Lock(); defer mu.Unlock(); return append([]*v1.Pod(nil), active...) }
	if err := dm.Start(activePods, allReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		fail(fmt.Sprintf("device manager start: %v", err))
	}
	defer dm.Stop()

	deadline := time.Now().Add(*wait)
	for {
		_, allocatable, _ := dm.GetCapacity()
		if q, ok := allocatable[v1.ResourceName(*res)]; ok && q.Value() > 0 {
			emit(map[string]any{"ready": true, "resource": *res, "devices": q.Value(), "policy": *policy, "scope": *scope})
			break
		}
		if time.Now().After(deadline) {
			fail(fmt.Sprintf("no healthy %s devices registered within %s", *res, *wait))
		}
		time.Sleep(100 * time.Millisecond)
	}

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		var p podIn
		if err := json.Unmarshal(in.Bytes(), &p); err != nil {
			fail(fmt.Sprintf("bad pod line %q: %v", in.Text(), err))
		}
		if p.Delete != "" {
			mu.Lock()
			kept := active[:0]
			for _, a := range active {
				if a.Name != p.Delete {
					kept = append(kept, a)
				}
			}
			active = kept
			mu.Unlock()
			continue
		}
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: "ns", UID: types.UID(p.UID)}}
		for _, c := range p.Containers {
			q := *resource.NewQuantity(c.Count, resource.DecimalSI)
			pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{
				Name:      c.Name,
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceName(*res): q}, Requests: v1.ResourceList{v1.ResourceName(*res): q}},
			})
		}
		got := tm.Admit(&lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: activePods()})
		out := result{Pod: p.Name, Admitted: got.Admit, Reason: got.Reason, Message: got.Message, Devices: map[string][]string{}}
		if got.Admit {
			mu.Lock()
			active = append(active, pod)
			mu.Unlock()
		}
		for _, c := range p.Containers {
			ids := []string{}
			for id := range dm.GetDevices(p.UID, c.Name)[*res] {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			out.Devices[c.Name] = ids
		}
		emit(out)
	}
}

func emit(v any) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func fail(msg string) {
	emit(map[string]any{"error": msg})
	os.Exit(1)
}
