package main

// The part of the Corefile syntax this server reads: server blocks whose keys are zones with an
// optional port ("." or ".:53"), holding directives, each a line of words, some with a block of
// their own. The directives are those kubeadm's Corefile uses; anything else is refused by name,
// so that a configuration this server cannot honour is never run half-understood.

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

type kubeConfig struct {
	zones       []string // forward and reverse zones, lower case, ending in a dot
	pods        string   // "disabled", "insecure" or "verified"
	fallAll     bool     // fallthrough with no zones: every zone falls through
	fallZones   []string // the zones whose misses go on to the next plugin (forward)
	ttl         uint32
	kubeconfig  string // a kubeconfig file instead of the in-cluster service account
	kubeContext string
}

type forwardConfig struct {
	from          string   // the zone forwarded, "." for every name
	upstreams     []string // host:port
	maxConcurrent int
}

type serverBlock struct {
	zones       []string // the block's keys as zones
	port        string
	kube        *kubeConfig
	forward     *forwardConfig
	cacheTTL    uint32 // 0: no cache
	loadbalance bool
	logQueries  bool
	logErrors   bool
	loopCheck   bool
}

type config struct {
	blocks      []*serverBlock
	port        string
	healthAddr  string // empty: no health endpoint
	lameduck    time.Duration
	readyAddr   string
	metricsAddr string
	reload      time.Duration // 0: the file is read once
}

type directive struct {
	line     int
	words    []string
	block    []directive
	hasBlock bool
}

// tokenize splits a Corefile into lines of words; braces are words of their own and # starts a
// comment. Quotes are not part of kubeadm's Corefile and are refused.
func tokenize(text string) ([][]string, []int, error) {
	var lines [][]string
	var numbers []int
	sc := bufio.NewScanner(strings.NewReader(text))
	n := 0
	for sc.Scan() {
		n++
		l := sc.Text()
		if i := strings.IndexByte(l, '#'); i >= 0 {
			l = l[:i]
		}
		if strings.ContainsAny(l, "\"'`") {
			return nil, nil, fmt.Errorf("line %d: quoted words are not supported", n)
		}
		l = strings.ReplaceAll(l, "{", " { ")
		l = strings.ReplaceAll(l, "}", " } ")
		words := strings.Fields(l)
		if len(words) > 0 {
			lines = append(lines, words)
			numbers = append(numbers, n)
		}
	}
	return lines, numbers, sc.Err()
}

// parseDirectives reads lines until the closing brace of the block that contains them (or the
// end of the text at depth 0) and returns them with the index of the next line.
func parseDirectives(lines [][]string, numbers []int, i, depth int) ([]directive, int, error) {
	var out []directive
	for i < len(lines) {
		words := lines[i]
		if len(words) == 1 && words[0] == "}" {
			if depth == 0 {
				return nil, i, fmt.Errorf("line %d: a } without its {", numbers[i])
			}
			return out, i + 1, nil
		}
		d := directive{line: numbers[i], words: words}
		i++
		last := len(words) - 1
		if words[last] == "{" {
			d.words = words[:last]
			d.hasBlock = true
			var err error
			d.block, i, err = parseDirectives(lines, numbers, i, depth+1)
			if err != nil {
				return nil, i, err
			}
		}
		for _, w := range d.words {
			if w == "{" || w == "}" {
				return nil, i, fmt.Errorf("line %d: a brace must end its line or stand alone", d.line)
			}
		}
		if len(d.words) == 0 {
			return nil, i, fmt.Errorf("line %d: a block without a name", d.line)
		}
		out = append(out, d)
	}
	if depth > 0 {
		return nil, i, fmt.Errorf("the Corefile ends inside a block")
	}
	return out, i, nil
}

func fqdn(zone string) string {
	z := strings.ToLower(strings.TrimSuffix(zone, "."))
	if z == "" {
		return "."
	}
	return z + "."
}

// serverKey reads "ZONE", "ZONE:PORT" or "dns://ZONE:PORT".
func serverKey(key string) (zone, port string, err error) {
	key = strings.TrimPrefix(key, "dns://")
	if strings.Contains(key, "://") {
		return "", "", fmt.Errorf("server %q: only plain DNS is served", key)
	}
	zone, port = key, "53"
	if i := strings.LastIndexByte(key, ':'); i >= 0 {
		zone, port = key[:i], key[i+1:]
		if p, e := strconv.Atoi(port); e != nil || p < 1 || p > 65535 {
			return "", "", fmt.Errorf("server %q: bad port", key)
		}
	}
	return fqdn(zone), port, nil
}

// upstreamsOf reads forward's destinations: a resolv.conf path, IP, IP:PORT or dns://IP[:PORT].
func upstreamsOf(words []string) ([]string, error) {
	var out []string
	for _, w := range words {
		if strings.HasPrefix(w, "/") {
			servers, err := resolvConfServers(w)
			if err != nil {
				return nil, err
			}
			out = append(out, servers...)
			continue
		}
		w = strings.TrimPrefix(w, "dns://")
		if strings.Contains(w, "://") {
			return nil, fmt.Errorf("forward to %q: only plain DNS upstreams are supported", w)
		}
		if ip := net.ParseIP(w); ip != nil {
			out = append(out, net.JoinHostPort(w, "53"))
			continue
		}
		host, _, err := net.SplitHostPort(w)
		if err != nil || net.ParseIP(host) == nil {
			return nil, fmt.Errorf("forward to %q: not an address", w)
		}
		out = append(out, w)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("forward has no upstream")
	}
	return out, nil
}

func resolvConfServers(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("forward: %v", err)
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "nameserver" && net.ParseIP(f[1]) != nil {
			out = append(out, net.JoinHostPort(f[1], "53"))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("forward: %s names no nameserver", path)
	}
	return out, nil
}

func uintArg(d directive, what string, max uint64) (uint64, error) {
	if len(d.words) != 2 {
		return 0, fmt.Errorf("line %d: %s takes one number", d.line, what)
	}
	v, err := strconv.ParseUint(d.words[1], 10, 32)
	if err != nil || v > max {
		return 0, fmt.Errorf("line %d: %s %q is not a number up to %d", d.line, what, d.words[1], max)
	}
	return v, nil
}

func parseKubernetes(d directive, blk *serverBlock) (*kubeConfig, error) {
	k := &kubeConfig{pods: "disabled", ttl: 5}
	for _, z := range d.words[1:] {
		k.zones = append(k.zones, fqdn(z))
	}
	if len(k.zones) == 0 {
		k.zones = blk.zones
	}
	for _, s := range d.block {
		switch s.words[0] {
		case "pods":
			if len(s.words) != 2 || (s.words[1] != "disabled" && s.words[1] != "insecure" && s.words[1] != "verified") {
				return nil, fmt.Errorf("line %d: pods takes disabled, insecure or verified", s.line)
			}
			k.pods = s.words[1]
		case "fallthrough":
			if len(s.words) == 1 {
				k.fallAll = true
			}
			for _, z := range s.words[1:] {
				k.fallZones = append(k.fallZones, fqdn(z))
			}
		case "ttl":
			v, err := uintArg(s, "ttl", 3600)
			if err != nil {
				return nil, err
			}
			k.ttl = uint32(v)
		case "kubeconfig":
			if len(s.words) < 2 || len(s.words) > 3 {
				return nil, fmt.Errorf("line %d: kubeconfig takes a file and an optional context", s.line)
			}
			k.kubeconfig = s.words[1]
			if len(s.words) == 3 {
				k.kubeContext = s.words[2]
			}
		default:
			return nil, fmt.Errorf("line %d: kubernetes option %q is not supported by cluster-dns", s.line, s.words[0])
		}
	}
	return k, nil
}

func parseForward(d directive) (*forwardConfig, error) {
	if len(d.words) < 3 {
		return nil, fmt.Errorf("line %d: forward takes a zone and at least one upstream", d.line)
	}
	f := &forwardConfig{from: fqdn(d.words[1]), maxConcurrent: 1000}
	var err error
	if f.upstreams, err = upstreamsOf(d.words[2:]); err != nil {
		return nil, fmt.Errorf("line %d: %v", d.line, err)
	}
	for _, s := range d.block {
		switch s.words[0] {
		case "max_concurrent":
			v, err := uintArg(s, "max_concurrent", 1<<20)
			if err != nil {
				return nil, err
			}
			f.maxConcurrent = int(v)
		default:
			return nil, fmt.Errorf("line %d: forward option %q is not supported by cluster-dns", s.line, s.words[0])
		}
	}
	return f, nil
}

// listenArg reads the optional address of health, ready and prometheus.
func listenArg(d directive, def string) (string, error) {
	switch len(d.words) {
	case 1:
		return def, nil
	case 2:
		if _, _, err := net.SplitHostPort(d.words[1]); err != nil {
			return "", fmt.Errorf("line %d: %s address %q: %v", d.line, d.words[0], d.words[1], err)
		}
		return d.words[1], nil
	}
	return "", fmt.Errorf("line %d: %s takes at most one address", d.line, d.words[0])
}

func parsePlugin(d directive, blk *serverBlock, cfg *config) error {
	var err error
	switch d.words[0] {
	case "errors":
		blk.logErrors = true
	case "log":
		blk.logQueries = true
	case "health":
		if cfg.healthAddr, err = listenArg(d, ":8080"); err != nil {
			return err
		}
		for _, s := range d.block {
			if s.words[0] != "lameduck" || len(s.words) != 2 {
				return fmt.Errorf("line %d: health takes only lameduck DURATION", s.line)
			}
			if cfg.lameduck, err = time.ParseDuration(s.words[1]); err != nil {
				return fmt.Errorf("line %d: lameduck: %v", s.line, err)
			}
		}
	case "ready":
		cfg.readyAddr, err = listenArg(d, ":8181")
	case "prometheus":
		cfg.metricsAddr, err = listenArg(d, ":9153")
	case "kubernetes":
		blk.kube, err = parseKubernetes(d, blk)
	case "forward":
		blk.forward, err = parseForward(d)
	case "cache":
		blk.cacheTTL = 3600
		if len(d.words) > 1 {
			var v uint64
			v, err = uintArg(directive{line: d.line, words: d.words[:2]}, "cache", 86400)
			blk.cacheTTL = uint32(v)
		}
		if len(d.block) > 0 {
			err = fmt.Errorf("line %d: cache takes no options here", d.line)
		}
	case "loop":
		blk.loopCheck = true
	case "reload":
		cfg.reload = 30 * time.Second
		if len(d.words) > 1 {
			cfg.reload, err = time.ParseDuration(d.words[1])
		}
	case "loadbalance":
		blk.loadbalance = true
	default:
		return fmt.Errorf("line %d: plugin %q is not supported by cluster-dns", d.line, d.words[0])
	}
	return err
}

func parseCorefile(text string) (*config, error) {
	lines, numbers, err := tokenize(text)
	if err != nil {
		return nil, err
	}
	top, _, err := parseDirectives(lines, numbers, 0, 0)
	if err != nil {
		return nil, err
	}
	cfg := &config{}
	for _, sb := range top {
		if !sb.hasBlock {
			return nil, fmt.Errorf("line %d: %q is not a server block", sb.line, strings.Join(sb.words, " "))
		}
		blk := &serverBlock{}
		for _, key := range sb.words {
			zone, port, err := serverKey(key)
			if err != nil {
				return nil, fmt.Errorf("line %d: %v", sb.line, err)
			}
			if blk.port != "" && blk.port != port || cfg.port != "" && cfg.port != port {
				return nil, fmt.Errorf("line %d: every server block must use one port", sb.line)
			}
			blk.port, cfg.port = port, port
			blk.zones = append(blk.zones, zone)
		}
		for _, d := range sb.block {
			if err := parsePlugin(d, blk, cfg); err != nil {
				return nil, err
			}
		}
		cfg.blocks = append(cfg.blocks, blk)
	}
	if len(cfg.blocks) == 0 {
		return nil, fmt.Errorf("the Corefile has no server block")
	}
	kubes := 0
	for _, b := range cfg.blocks {
		if b.kube != nil {
			kubes++
		}
	}
	if kubes > 1 {
		return nil, fmt.Errorf("only one server block may have the kubernetes plugin")
	}
	return cfg, nil
}

// blockFor picks the server block whose zone is the longest suffix of name.
func (c *config) blockFor(name string) (*serverBlock, string) {
	var best *serverBlock
	bestZone := ""
	for _, b := range c.blocks {
		for _, z := range b.zones {
			if inZone(name, z) && (best == nil || len(z) > len(bestZone)) {
				best, bestZone = b, z
			}
		}
	}
	return best, bestZone
}

// inZone says whether the lower-case, fully qualified name is the zone or below it.
func inZone(name, zone string) bool {
	if zone == "." {
		return true
	}
	return name == zone || strings.HasSuffix(name, "."+zone)
}
