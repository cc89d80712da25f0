// crictl: the CRI client kubeadm needs on a node, for the Kubernetes sysext built from Debian's
// kubernetes source (Debian packages no cri-tools). kubeadm 1.20 requires a crictl in PATH for a
// CRI runtime and runs `crictl -r ENDPOINT` with info, pods -q, stopp, rmp, pull and inspecti; an
// operator following kubeadm's hints runs ps -a and logs. Those commands are here, spoken over the
// CRI (v1alpha2, what kubelet 1.20 speaks) with the kubelet's own client from the same tree.
// scripts/kubernetes-bins.sh copies this file into the tree as cmd/crictl and builds it with the
// rest.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1alpha2"
	"k8s.io/kubernetes/pkg/kubelet/cri/remote"
)

const defaultEndpoint = "unix:///run/containerd/containerd.sock"

func usage() {
	fmt.Fprintf(os.Stderr, `usage: crictl [-r ENDPOINT] [-t TIMEOUT] COMMAND [ARGS]
commands: version, info, images [-q], inspecti IMAGE, pull IMAGE, rmi IMAGE, pods [-q],
          stopp POD..., rmp POD..., ps [-a] [-q], logs CONTAINER
ENDPOINT defaults to $CONTAINER_RUNTIME_ENDPOINT, else %s
`, defaultEndpoint)
	os.Exit(2)
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "crictl: "+format+"\n", args...)
	os.Exit(1)
}

func endpointOf(e string) string {
	if strings.HasPrefix(e, "/") {
		return "unix://" + e
	}
	return e
}

func main() {
	endpoint := os.Getenv("CONTAINER_RUNTIME_ENDPOINT")
	flag.StringVar(&endpoint, "r", endpoint, "CRI endpoint")
	flag.StringVar(&endpoint, "runtime-endpoint", endpoint, "CRI endpoint")
	flag.StringVar(&endpoint, "i", endpoint, "image endpoint (the same here)")
	flag.StringVar(&endpoint, "image-endpoint", endpoint, "image endpoint (the same here)")
	timeout := flag.Duration("t", 2*time.Minute, "timeout of a call")
	flag.Usage = usage
	flag.Parse()
	if flag.NArg() < 1 {
		usage()
	}
	if endpoint == "" {
		endpoint = defaultEndpoint
	}
	endpoint = endpointOf(endpoint)
	cmd, args := flag.Arg(0), flag.Args()[1:]

	sub := flag.NewFlagSet(cmd, flag.ExitOnError)
	quiet := sub.Bool("q", false, "IDs only")
	all := sub.Bool("a", false, "all containers, not only running ones")
	sub.BoolVar(all, "all", false, "all containers")
	sub.Parse(args)
	args = sub.Args()

	switch cmd {
	case "version", "info", "pods", "stopp", "rmp", "ps", "logs":
		rs, err := remote.NewRemoteRuntimeService(endpoint, *timeout)
		if err != nil {
			fail("connect to %s: %v", endpoint, err)
		}
		runtimeCommand(rs, cmd, args, *quiet, *all)
	case "images", "inspecti", "pull", "rmi":
		is, err := remote.NewRemoteImageService(endpoint, *timeout)
		if err != nil {
			fail("connect to %s: %v", endpoint, err)
		}
		imageCommand(is, cmd, args, *quiet)
	default:
		usage()
	}
}

func runtimeCommand(rs interface {
	Version(string) (*runtimeapi.VersionResponse, error)
	Status() (*runtimeapi.RuntimeStatus, error)
	ListPodSandbox(*runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error)
	StopPodSandbox(string) error
	RemovePodSandbox(string) error
	ListContainers(*runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error)
	ContainerStatus(string) (*runtimeapi.ContainerStatus, error)
}, cmd string, args []string, quiet, all bool) {
	switch cmd {
	case "version":
		v, err := rs.Version("v1alpha2")
		if err != nil {
			fail("version: %v", err)
		}
		fmt.Printf("RuntimeName: %s\nRuntimeVersion: %s\nRuntimeApiVersion: %s\n", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
	case "info":
		st, err := rs.Status()
		if err != nil {
			fail("info: %v", err)
		}
		ok := true
		for _, c := range st.GetConditions() {
			fmt.Printf("%s: %v %s %s\n", c.Type, c.Status, c.Reason, c.Message)
			if c.Type == runtimeapi.RuntimeReady && !c.Status {
				ok = false
			}
		}
		if !ok {
			fail("the runtime is not ready")
		}
	case "pods":
		pods, err := rs.ListPodSandbox(nil)
		if err != nil {
			fail("pods: %v", err)
		}
		for _, p := range pods {
			if quiet {
				fmt.Println(p.Id)
			} else {
				fmt.Printf("%.13s  %-8s %s/%s\n", p.Id, strings.TrimPrefix(p.State.String(), "SANDBOX_"), p.GetMetadata().GetNamespace(), p.GetMetadata().GetName())
			}
		}
	case "stopp", "rmp":
		if len(args) == 0 {
			usage()
		}
		for _, id := range args {
			var err error
			if cmd == "stopp" {
				err = rs.StopPodSandbox(id)
			} else {
				err = rs.RemovePodSandbox(id)
			}
			if err != nil {
				fail("%s %s: %v", cmd, id, err)
			}
			fmt.Println(id)
		}
	case "ps":
		var filter *runtimeapi.ContainerFilter
		if !all {
			filter = &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}
		}
		cs, err := rs.ListContainers(filter)
		if err != nil {
			fail("ps: %v", err)
		}
		for _, c := range cs {
			if quiet {
				fmt.Println(c.Id)
			} else {
				fmt.Printf("%.13s  %-9s %-30s %s\n", c.Id, strings.TrimPrefix(c.State.String(), "CONTAINER_"), c.GetMetadata().GetName(), c.GetImage().GetImage())
			}
		}
	case "logs":
		if len(args) != 1 {
			usage()
		}
		st, err := rs.ContainerStatus(args[0])
		if err != nil {
			fail("logs %s: %v", args[0], err)
		}
		f, err := os.Open(st.LogPath)
		if err != nil {
			fail("logs %s: %v", args[0], err)
		}
		defer f.Close()
		io.Copy(os.Stdout, f)
	}
}

func imageCommand(is interface {
	ListImages(*runtimeapi.ImageFilter) ([]*runtimeapi.Image, error)
	ImageStatus(*runtimeapi.ImageSpec) (*runtimeapi.Image, error)
	PullImage(*runtimeapi.ImageSpec, *runtimeapi.AuthConfig, *runtimeapi.PodSandboxConfig) (string, error)
	RemoveImage(*runtimeapi.ImageSpec) error
}, cmd string, args []string, quiet bool) {
	switch cmd {
	case "images":
		imgs, err := is.ListImages(nil)
		if err != nil {
			fail("images: %v", err)
		}
		for _, i := range imgs {
			if quiet {
				fmt.Println(i.Id)
				continue
			}
			for _, t := range i.RepoTags {
				fmt.Printf("%-60s %.19s %d\n", t, strings.TrimPrefix(i.Id, "sha256:"), i.Size_)
			}
		}
	case "inspecti", "pull", "rmi":
		if len(args) != 1 {
			usage()
		}
		spec := &runtimeapi.ImageSpec{Image: args[0]}
		switch cmd {
		case "inspecti":
			img, err := is.ImageStatus(spec)
			if err != nil {
				fail("inspecti %s: %v", args[0], err)
			}
			if img == nil {
				fail("no such image %s present", args[0])
			}
			fmt.Printf("%s %s\n", img.Id, strings.Join(img.RepoTags, ","))
		case "pull":
			ref, err := is.PullImage(spec, nil, nil)
			if err != nil {
				fail("pull %s: %v", args[0], err)
			}
			fmt.Printf("Image is up to date for %s\n", ref)
		case "rmi":
			if err := is.RemoveImage(spec); err != nil {
				fail("rmi %s: %v", args[0], err)
			}
			fmt.Printf("Deleted: %s\n", args[0])
		}
	}
}
