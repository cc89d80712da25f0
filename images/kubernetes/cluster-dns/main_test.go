package main

// Queries through a real DNS listener on the loopback, answered from a fake API server's
// Services and Endpoints (client-go's fake clientset) and, for other names, from a second
// listener standing in for the upstream resolver.

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
)

// kubeadm 1.20's Corefile, as its coredns ConfigMap carries it (the upstream filled in).
const kubeadmCorefile = `.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . UPSTREAM {
       max_concurrent 1000
    }
    cache 30
    loop
    reload
    loadbalance
}
`

func objects() []runtime.Object {
	return []runtime.Object{
		&v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"},
			Spec: v1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []v1.ServicePort{{Name: "https", Port: 443, Protocol: v1.ProtocolTCP}}}},
		&v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "apps"},
			Spec: v1.ServiceSpec{ClusterIP: v1.ClusterIPNone, Ports: []v1.ServicePort{{Name: "pg", Port: 5432, TargetPort: intstr.FromInt(5433), Protocol: v1.ProtocolTCP}}}},
		&v1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "apps"},
			Subsets: []v1.EndpointSubset{{
				Addresses:         []v1.EndpointAddress{{IP: "10.244.1.5", Hostname: "db-0"}, {IP: "10.244.2.7"}},
				NotReadyAddresses: []v1.EndpointAddress{{IP: "10.244.3.9"}},
			}}},
		&v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: "apps"},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeExternalName, ExternalName: "db.example.org"}},
	}
}

// listen starts h on a loopback UDP port and returns the address.
func listen(t *testing.T, h dns.Handler) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: h}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return pc.LocalAddr().String()
}

func start(t *testing.T, corefile string) (addr string, upstreamQueries *int) {
	n := 0
	upstream := listen(t, dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		n++
		m := new(dns.Msg)
		m.SetReply(r)
		if strings.EqualFold(r.Question[0].Name, "example.org.") {
			m.Answer = append(m.Answer, &dns.A{Hdr: header(r.Question[0].Name, dns.TypeA, 300), A: net.ParseIP("192.0.2.1")})
		} else {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	}))
	cfg, err := parseCorefile(strings.Replace(corefile, "UPSTREAM", upstream, 1))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	client := fake.NewSimpleClientset(objects()...)
	kube := newKubeData(informers.NewSharedInformerFactory(client, 0), stop)
	deadline := time.Now().Add(10 * time.Second)
	for !kube.synced() {
		if time.Now().After(deadline) {
			t.Fatal("the informers never synced")
		}
		time.Sleep(10 * time.Millisecond)
	}
	s := &server{kube: kube, cache: &answerCache{max: 100, entries: map[string]cacheEntry{}},
		metrics: &metrics{counts: map[string]uint64{}}, sem: make(chan struct{}, 10), timeout: time.Second}
	s.cfg.Store(cfg)
	return listen(t, s), &n
}

func query(t *testing.T, addr, name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	r, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s: %v", name, dns.TypeToString[qtype], err)
	}
	return r
}

func answers(r *dns.Msg) []string {
	var out []string
	for _, rr := range r.Answer {
		f := strings.Fields(rr.String())
		out = append(out, strings.Join(f[3:], " "))
	}
	return out
}

func expect(t *testing.T, addr, name string, qtype uint16, rcode int, want ...string) *dns.Msg {
	t.Helper()
	r := query(t, addr, name, qtype)
	if r.Rcode != rcode {
		t.Fatalf("%s %s: rcode %s, want %s", name, dns.TypeToString[qtype], dns.RcodeToString[r.Rcode], dns.RcodeToString[rcode])
	}
	got := answers(r)
	if strings.Join(sorted(got), "|") != strings.Join(sorted(want), "|") {
		t.Fatalf("%s %s: answers %q, want %q", name, dns.TypeToString[qtype], got, want)
	}
	return r
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestKubeadmCorefileParses(t *testing.T) {
	cfg, err := parseCorefile(strings.Replace(kubeadmCorefile, "UPSTREAM", "/nonexistent-resolv.conf", 1))
	if err == nil || !strings.Contains(err.Error(), "nonexistent-resolv.conf") {
		t.Fatalf("a missing resolv.conf: %v", err)
	}
	cfg, err = parseCorefile(strings.Replace(kubeadmCorefile, "UPSTREAM", "192.0.2.53", 1))
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.blocks[0]
	if cfg.port != "53" || cfg.healthAddr != ":8080" || cfg.lameduck != 5*time.Second || cfg.readyAddr != ":8181" ||
		cfg.metricsAddr != ":9153" || cfg.reload == 0 || b.cacheTTL != 30 || !b.loopCheck || !b.loadbalance {
		t.Fatalf("parsed %+v %+v", cfg, b)
	}
	if b.kube.pods != "insecure" || b.kube.ttl != 30 || len(b.kube.zones) != 3 || !b.kube.fallsThrough("in-addr.arpa.") || b.kube.fallsThrough("cluster.local.") {
		t.Fatalf("kubernetes %+v", b.kube)
	}
	if b.forward.upstreams[0] != "192.0.2.53:53" || b.forward.maxConcurrent != 1000 {
		t.Fatalf("forward %+v", b.forward)
	}
}

func TestCorefileRefusals(t *testing.T) {
	for text, want := range map[string]string{
		".:53 {\n rewrite name a b\n}\n":                         `plugin "rewrite" is not supported`,
		".:53 {\n kubernetes cluster.local {\n  upstream\n }\n}": `kubernetes option "upstream"`,
		".:53 {\n forward . tls://1.1.1.1\n}\n":                  "only plain DNS upstreams",
		".:53 {\n errors\n":                                      "ends inside a block",
		"errors\n":                                               "not a server block",
		".:53 {\n}\n.:54 {\n}\n":                                 "one port",
		".:99999 {\n}\n":                                         "bad port",
	} {
		if _, err := parseCorefile(text); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", text, err, want)
		}
	}
}

func TestServices(t *testing.T) {
	addr, _ := start(t, kubeadmCorefile)
	expect(t, addr, "kubernetes.default.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, "A 10.96.0.1")
	expect(t, addr, "KUBERNETES.Default.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, "A 10.96.0.1")
	expect(t, addr, "kubernetes.default.svc.cluster.local.", dns.TypeAAAA, dns.RcodeSuccess)
	r := expect(t, addr, "_https._tcp.kubernetes.default.svc.cluster.local.", dns.TypeSRV, dns.RcodeSuccess,
		"SRV 0 100 443 kubernetes.default.svc.cluster.local.")
	if len(r.Extra) != 1 || !strings.Contains(r.Extra[0].String(), "10.96.0.1") {
		t.Fatalf("SRV extra %v", r.Extra)
	}
	expect(t, addr, "_http._tcp.kubernetes.default.svc.cluster.local.", dns.TypeSRV, dns.RcodeNameError)
	// a headless service: its ready endpoints, never the ones not ready
	expect(t, addr, "db.apps.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, "A 10.244.1.5", "A 10.244.2.7")
	expect(t, addr, "db-0.db.apps.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, "A 10.244.1.5")
	expect(t, addr, "10-244-2-7.db.apps.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, "A 10.244.2.7")
	expect(t, addr, "10-244-3-9.db.apps.svc.cluster.local.", dns.TypeA, dns.RcodeNameError)
	expect(t, addr, "_pg._tcp.db.apps.svc.cluster.local.", dns.TypeSRV, dns.RcodeSuccess,
		"SRV 0 100 5433 db-0.db.apps.svc.cluster.local.", "SRV 0 100 5433 10-244-2-7.db.apps.svc.cluster.local.")
	expect(t, addr, "ext.apps.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, "CNAME db.example.org.")
	expect(t, addr, "10-1-2-3.apps.pod.cluster.local.", dns.TypeA, dns.RcodeSuccess, "A 10.1.2.3")
	expect(t, addr, "dns-version.cluster.local.", dns.TypeTXT, dns.RcodeSuccess, `TXT "1.1.0"`)
	// names that exist without records of the type, and names that do not exist
	r = expect(t, addr, "apps.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess)
	if len(r.Ns) != 1 || r.Ns[0].Header().Rrtype != dns.TypeSOA {
		t.Fatalf("NODATA without the zone's SOA: %v", r.Ns)
	}
	expect(t, addr, "nosuch.default.svc.cluster.local.", dns.TypeA, dns.RcodeNameError)
	expect(t, addr, "kubernetes.default.default.svc.cluster.local.", dns.TypeA, dns.RcodeNameError)
	expect(t, addr, "nosuch.svc.cluster.local.", dns.TypeA, dns.RcodeNameError)
	expect(t, addr, "cluster.local.", dns.TypeSOA, dns.RcodeSuccess,
		"SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 30")
}

func TestReverseAndForward(t *testing.T) {
	addr, upstream := start(t, kubeadmCorefile)
	expect(t, addr, "1.0.96.10.in-addr.arpa.", dns.TypePTR, dns.RcodeSuccess, "PTR kubernetes.default.svc.cluster.local.")
	expect(t, addr, "5.1.244.10.in-addr.arpa.", dns.TypePTR, dns.RcodeSuccess, "PTR db-0.db.apps.svc.cluster.local.")
	before := *upstream
	// an address the cluster does not know falls through to the upstream
	expect(t, addr, "4.3.2.1.in-addr.arpa.", dns.TypePTR, dns.RcodeNameError)
	if *upstream != before+1 {
		t.Fatalf("the reverse miss did not reach the upstream (%d queries)", *upstream-before)
	}
	expect(t, addr, "example.org.", dns.TypeA, dns.RcodeSuccess, "A 192.0.2.1")
	n := *upstream
	// cached for 30 s: the same question again does not reach the upstream
	r := expect(t, addr, "example.org.", dns.TypeA, dns.RcodeSuccess, "A 192.0.2.1")
	if *upstream != n || r.Answer[0].Header().Ttl > 30 {
		t.Fatalf("a cached answer went upstream (%d) or kept ttl %d", *upstream-n, r.Answer[0].Header().Ttl)
	}
	// a zone not falling through: the cluster's own names never reach the upstream
	n = *upstream
	expect(t, addr, "nosuch.cluster.local.", dns.TypeA, dns.RcodeNameError)
	if *upstream != n {
		t.Fatal("a miss in cluster.local went upstream")
	}
}

func TestUpstreamDown(t *testing.T) {
	pc, _ := net.ListenPacket("udp", "127.0.0.1:0")
	dead := pc.LocalAddr().String()
	pc.Close()
	cfg := strings.Replace(kubeadmCorefile, "forward . UPSTREAM", "forward . "+dead, 1)
	addr, _ := start(t, cfg)
	expect(t, addr, "example.org.", dns.TypeA, dns.RcodeServerFailure)
	expect(t, addr, "kubernetes.default.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, "A 10.96.0.1")
}
