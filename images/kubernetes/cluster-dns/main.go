// cluster-dns: the cluster DNS of vm-manager's Kubernetes sysext. kubeadm deploys a DNS add-on
// from the image CoreDNS publishes, and no Debian release packages CoreDNS; this program is built
// from Debian's own Kubernetes source (its vendored client-go and miekg/dns) and carried under the
// image name kubeadm asks for, so that a cluster made without a registry has service discovery.
// It is not CoreDNS: it reads the Corefile kubeadm writes (the plugins errors, log, health,
// ready, kubernetes, prometheus, forward, cache, loop, reload and loadbalance, with the options
// kubeadm's Corefile uses) and refuses any other by name.
// scripts/kubernetes-bins.sh copies this directory into the tree as cmd/cluster-dns, runs its
// tests and builds it with the rest.
package main

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"log"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

const version = "1.0.0"

type server struct {
	cfg     atomic.Value // *config
	kube    *kubeData
	cache   *answerCache
	metrics *metrics
	sem     chan struct{}
	timeout time.Duration

	loopName string
	loopSeen int32
}

func (s *server) config() *config { return s.cfg.Load().(*config) }

func reply(w dns.ResponseWriter, r *dns.Msg, m *dns.Msg, s *server) {
	s.metrics.add("cluster_dns_responses_total", "rcode", dns.RcodeToString[m.Rcode])
	if err := w.WriteMsg(m); err != nil {
		log.Printf("cluster-dns: writing the answer to %s: %v", w.RemoteAddr(), err)
	}
}

func (s *server) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	cfg := s.config()
	m := new(dns.Msg)
	if r.Opcode != dns.OpcodeQuery || len(r.Question) != 1 {
		m.SetRcode(r, dns.RcodeNotImplemented)
		if len(r.Question) != 1 {
			m.SetRcode(r, dns.RcodeFormatError)
		}
		reply(w, r, m, s)
		return
	}
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	s.metrics.add("cluster_dns_requests_total", "type", dns.TypeToString[q.Qtype])
	if s.loopName != "" && name == s.loopName {
		if atomic.AddInt32(&s.loopSeen, 1) > 2 {
			log.Fatalf("cluster-dns: a forwarding loop: the check query %s came back to this server; the upstream of forward must not be this server", s.loopName)
		}
	}
	blk, _ := cfg.blockFor(name)
	if blk == nil {
		m.SetRcode(r, dns.RcodeRefused)
		reply(w, r, m, s)
		return
	}
	if blk.logQueries {
		log.Printf("cluster-dns: %s %s %s", w.RemoteAddr(), dns.TypeToString[q.Qtype], q.Name)
	}
	if blk.kube != nil {
		if m := s.kubeReply(blk, r, q, name); m != nil {
			reply(w, r, m, s)
			return
		}
	}
	if blk.forward != nil && inZone(name, blk.forward.from) {
		s.forward(w, r, blk)
		return
	}
	m.SetRcode(r, dns.RcodeServerFailure)
	if blk.logErrors {
		log.Printf("cluster-dns: %s %s: no plugin answers this name", dns.TypeToString[q.Qtype], q.Name)
	}
	reply(w, r, m, s)
}

// forwardZone is the first forward zone of the kubernetes plugin: the one PTR records name.
func forwardZone(k *kubeConfig) string {
	for _, z := range k.zones {
		if !strings.HasSuffix(z, ".arpa.") {
			return z
		}
	}
	return "cluster.local."
}

func (k *kubeConfig) fallsThrough(zone string) bool {
	if k.fallAll {
		return true
	}
	for _, z := range k.fallZones {
		if z == zone {
			return true
		}
	}
	return false
}

// kubeReply answers from the cluster's data, or returns nil for a name outside the plugin's
// zones or a reverse lookup that falls through to forward.
func (s *server) kubeReply(blk *serverBlock, r *dns.Msg, q dns.Question, name string) *dns.Msg {
	zone := ""
	for _, z := range blk.kube.zones {
		if inZone(name, z) && len(z) > len(zone) {
			zone = z
		}
	}
	if zone == "" {
		return nil
	}
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	if !s.kube.synced() {
		m.SetRcode(r, dns.RcodeServerFailure)
		return m
	}
	var ans kubeAnswer
	if strings.HasSuffix(zone, ".arpa.") {
		if q.Qtype == dns.TypePTR || q.Qtype == dns.TypeANY {
			ans.answer = s.kube.ptr(blk.kube, forwardZone(blk.kube), q)
		}
		if len(ans.answer) == 0 {
			if blk.kube.fallsThrough(zone) {
				return nil
			}
			ans.nxdomain = true
		}
	} else {
		rest := dns.SplitDomainName(strings.TrimSuffix(strings.TrimSuffix(name, zone), "."))
		ans = s.kube.answer(blk.kube, zone, q, rest)
		if ans.nxdomain && blk.kube.fallsThrough(zone) {
			return nil
		}
	}
	m.Answer = ans.answer
	for _, rr := range ans.extra {
		if rr != nil {
			m.Extra = append(m.Extra, rr)
		}
	}
	if blk.loadbalance {
		shuffleAddresses(m.Answer)
	}
	if len(m.Answer) == 0 {
		m.Ns = []dns.RR{soa(zone, blk.kube.ttl)}
		if ans.nxdomain {
			m.Rcode = dns.RcodeNameError
		}
	}
	return m
}

// shuffleAddresses is the loadbalance plugin: A and AAAA records in a random order, so that
// clients that take the first one spread over a headless service's endpoints.
func shuffleAddresses(rrs []dns.RR) {
	var idx []int
	for i, rr := range rrs {
		if t := rr.Header().Rrtype; t == dns.TypeA || t == dns.TypeAAAA {
			idx = append(idx, i)
		}
	}
	rand.Shuffle(len(idx), func(a, b int) { rrs[idx[a]], rrs[idx[b]] = rrs[idx[b]], rrs[idx[a]] })
}

func isTCP(w dns.ResponseWriter) bool {
	_, ok := w.RemoteAddr().(*net.TCPAddr)
	return ok
}

func (s *server) forward(w dns.ResponseWriter, r *dns.Msg, blk *serverBlock) {
	q := r.Question[0]
	if blk.cacheTTL > 0 {
		if m := s.cache.get(q, r.Id); m != nil {
			s.metrics.add("cluster_dns_cache_total", "result", "hit")
			reply(w, r, m, s)
			return
		}
		s.metrics.add("cluster_dns_cache_total", "result", "miss")
	}
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
	default:
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeRefused)
		reply(w, r, m, s)
		return
	}
	proto := "udp"
	if isTCP(w) {
		proto = "tcp"
	}
	ups := blk.forward.upstreams
	start := rand.Intn(len(ups))
	var lastErr error
	for i := range ups {
		up := ups[(start+i)%len(ups)]
		s.metrics.add("cluster_dns_forward_requests_total", "to", up)
		c := &dns.Client{Net: proto, Timeout: s.timeout}
		resp, _, err := c.Exchange(r, up)
		if err == nil && resp.Truncated && proto == "udp" {
			c.Net = "tcp"
			resp, _, err = c.Exchange(r, up)
		}
		if err != nil {
			lastErr = err
			continue
		}
		if blk.cacheTTL > 0 {
			s.cache.put(q, resp, blk.cacheTTL)
		}
		reply(w, r, resp, s)
		return
	}
	if blk.logErrors {
		log.Printf("cluster-dns: %s %s: every upstream failed, the last with: %v", dns.TypeToString[q.Qtype], q.Name, lastErr)
	}
	m := new(dns.Msg)
	m.SetRcode(r, dns.RcodeServerFailure)
	reply(w, r, m, s)
}

// answerCache keeps forwarded answers for the shorter of their smallest TTL and the cache's own;
// it holds at most max entries and drops an arbitrary one when full.
type answerCache struct {
	mu      sync.Mutex
	max     int
	entries map[string]cacheEntry
}

type cacheEntry struct {
	msg     *dns.Msg
	stored  time.Time
	expires time.Time
}

func cacheKey(q dns.Question) string {
	return fmt.Sprintf("%s/%d/%d", strings.ToLower(q.Name), q.Qtype, q.Qclass)
}

func (c *answerCache) get(q dns.Question, id uint16) *dns.Msg {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[cacheKey(q)]
	now := time.Now()
	if !ok || now.After(e.expires) {
		return nil
	}
	m := e.msg.Copy()
	m.Id = id
	age := uint32(now.Sub(e.stored) / time.Second)
	for _, section := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range section {
			if h := rr.Header(); h.Rrtype != dns.TypeOPT && h.Ttl > age {
				h.Ttl -= age
			} else if h.Rrtype != dns.TypeOPT {
				h.Ttl = 0
			}
		}
	}
	return m
}

func (c *answerCache) put(q dns.Question, m *dns.Msg, max uint32) {
	if m.Rcode != dns.RcodeSuccess && m.Rcode != dns.RcodeNameError || m.Truncated {
		return
	}
	ttl := max
	for _, section := range [][]dns.RR{m.Answer, m.Ns} {
		for _, rr := range section {
			if t := rr.Header().Ttl; t < ttl {
				ttl = t
			}
		}
	}
	if ttl == 0 {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		for k := range c.entries {
			delete(c.entries, k)
			break
		}
	}
	// The answer is kept no longer than the cache's own TTL, and says so to the client.
	kept := m.Copy()
	for _, section := range [][]dns.RR{kept.Answer, kept.Ns, kept.Extra} {
		for _, rr := range section {
			if h := rr.Header(); h.Rrtype != dns.TypeOPT && h.Ttl > max {
				h.Ttl = max
			}
		}
	}
	c.entries[cacheKey(q)] = cacheEntry{msg: kept, stored: now, expires: now.Add(time.Duration(ttl) * time.Second)}
}

// metrics are counters in Prometheus's text format, under names of this program's own.
type metrics struct {
	mu     sync.Mutex
	counts map[string]uint64
}

func (m *metrics) add(name, label, value string) {
	key := fmt.Sprintf("%s{%s=%q}", name, label, value)
	m.mu.Lock()
	m.counts[key]++
	m.mu.Unlock()
}

func (m *metrics) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	m.mu.Lock()
	keys := make([]string, 0, len(m.counts))
	for k := range m.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("# TYPE cluster_dns_build_info gauge\ncluster_dns_build_info{version=\"" + version + "\"} 1\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %d\n", k, m.counts[k])
	}
	m.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	_, _ = w.Write([]byte(b.String()))
}

func kubeClient(k *kubeConfig) (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if k.kubeconfig != "" {
		rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: k.kubeconfig}
		over := &clientcmd.ConfigOverrides{CurrentContext: k.kubeContext}
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, over).ClientConfig()
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "cluster-dns/" + version
	return kubernetes.NewForConfig(rc)
}

// startKube starts the informers of the first kubernetes plugin the configuration has.
func startKube(cfg *config, stop <-chan struct{}) (*kubeData, error) {
	var k *kubeConfig
	for _, b := range cfg.blocks {
		if b.kube != nil {
			k = b.kube
			break
		}
	}
	if k == nil {
		return &kubeData{synced: func() bool { return true }}, nil
	}
	client, err := kubeClient(k)
	if err != nil {
		return nil, fmt.Errorf("the kubernetes plugin cannot reach the API server: %v", err)
	}
	return newKubeData(informers.NewSharedInformerFactory(client, 0), stop), nil
}

func newKubeData(f informers.SharedInformerFactory, stop <-chan struct{}) *kubeData {
	svc := f.Core().V1().Services()
	ep := f.Core().V1().Endpoints()
	k := &kubeData{services: svc.Lister(), endpoints: ep.Lister()}
	svcSynced, epSynced := svc.Informer().HasSynced, ep.Informer().HasSynced
	k.synced = func() bool { return svcSynced() && epSynced() }
	f.Start(stop)
	go cache.WaitForCacheSync(stop, svcSynced, epSynced)
	return k
}

func serve(s *server, addr string) {
	for _, proto := range []string{"udp", "tcp"} {
		srv := &dns.Server{Addr: addr, Net: proto, Handler: s}
		go func() {
			if err := srv.ListenAndServe(); err != nil {
				log.Fatalf("cluster-dns: serving DNS on %s/%s: %v", srv.Addr, srv.Net, err)
			}
		}()
	}
}

func httpServe(addr, path string, h http.Handler) {
	mux := http.NewServeMux()
	mux.Handle(path, h)
	go func() {
		if err := http.ListenAndServe(addr, mux); err != nil {
			log.Fatalf("cluster-dns: serving %s on %s: %v", path, addr, err)
		}
	}()
}

// checkLoop sends one query for a random name through this server: if the forward upstream
// leads back here, the name arrives again and again and ServeDNS stops the program.
func checkLoop(s *server, port string) {
	s.loopName = fmt.Sprintf("%d.%d.cluster-dns-loop-check.", rand.Int63(), rand.Int63())
	time.Sleep(time.Second)
	m := new(dns.Msg)
	m.SetQuestion(s.loopName, dns.TypeHINFO)
	c := &dns.Client{Timeout: 5 * time.Second}
	_, _, _ = c.Exchange(m, net.JoinHostPort("127.0.0.1", port))
}

func watchReload(s *server, path string, sum [32]byte, every time.Duration) {
	for range time.Tick(every) {
		data, err := os.ReadFile(path)
		if err != nil || sha256.Sum256(data) == sum {
			continue
		}
		cfg, err := parseCorefile(string(data))
		if err != nil {
			log.Printf("cluster-dns: %s changed but is not used: %v", path, err)
			continue
		}
		old := s.config()
		if cfg.port != old.port || cfg.healthAddr != old.healthAddr || cfg.readyAddr != old.readyAddr || cfg.metricsAddr != old.metricsAddr {
			// A listener moves: start over with the new file rather than serve half of each.
			log.Printf("cluster-dns: %s changed its listeners; restarting", path)
			exe, _ := os.Executable()
			log.Fatal(syscall.Exec(exe, os.Args, os.Environ()))
		}
		sum = sha256.Sum256(data)
		s.cfg.Store(cfg)
		log.Printf("cluster-dns: %s reloaded", path)
	}
}

func main() {
	conf := flag.String("conf", "Corefile", "the Corefile to read")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Printf("cluster-dns %s (vm-manager; reads kubeadm's Corefile, not CoreDNS)\n", version)
		return
	}
	log.SetFlags(0)
	data, err := os.ReadFile(*conf)
	if err != nil {
		log.Fatalf("cluster-dns: %v", err)
	}
	cfg, err := parseCorefile(string(data))
	if err != nil {
		log.Fatalf("cluster-dns: %s: %v", *conf, err)
	}
	rand.Seed(time.Now().UnixNano())
	stop := make(chan struct{})
	kube, err := startKube(cfg, stop)
	if err != nil {
		log.Fatalf("cluster-dns: %v", err)
	}
	s := &server{kube: kube, cache: &answerCache{max: 10000, entries: map[string]cacheEntry{}},
		metrics: &metrics{counts: map[string]uint64{}}, sem: make(chan struct{}, maxConcurrent(cfg)),
		timeout: 2 * time.Second}
	s.cfg.Store(cfg)
	var healthy int32 = 1
	if cfg.healthAddr != "" {
		httpServe(cfg.healthAddr, "/health", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if atomic.LoadInt32(&healthy) == 0 {
				http.Error(w, "shutting down", http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("OK"))
		}))
	}
	if cfg.readyAddr != "" {
		httpServe(cfg.readyAddr, "/ready", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if !kube.synced() {
				http.Error(w, "kubernetes", http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("OK"))
		}))
	}
	if cfg.metricsAddr != "" {
		httpServe(cfg.metricsAddr, "/metrics", s.metrics)
	}
	serve(s, ":"+cfg.port)
	log.Printf("cluster-dns %s: serving %d server block(s) on port %s", version, len(cfg.blocks), cfg.port)
	for _, b := range cfg.blocks {
		if b.loopCheck && b.forward != nil {
			go checkLoop(s, cfg.port)
			break
		}
	}
	if cfg.reload > 0 {
		go watchReload(s, *conf, sha256.Sum256(data), cfg.reload)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	// lameduck: keep answering while the endpoint is taken out of the service.
	atomic.StoreInt32(&healthy, 0)
	log.Printf("cluster-dns: stopping after %s", s.config().lameduck)
	time.Sleep(s.config().lameduck)
	close(stop)
}

func maxConcurrent(cfg *config) int {
	n := 0
	for _, b := range cfg.blocks {
		if b.forward != nil && b.forward.maxConcurrent > n {
			n = b.forward.maxConcurrent
		}
	}
	if n == 0 {
		n = 1000
	}
	return n
}
