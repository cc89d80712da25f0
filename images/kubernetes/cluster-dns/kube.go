package main

// Answers for the cluster's zone from the Services and Endpoints the informers keep, after
// Kubernetes's DNS-based service discovery specification (version 1.1.0):
//   <service>.<ns>.svc.<zone>                 A/AAAA: the cluster IP, or a headless service's ready endpoints;
//                                             CNAME for an ExternalName service
//   <host>.<service>.<ns>.svc.<zone>          A/AAAA: a headless service's endpoint by hostname (or dashed IP)
//   _<port>._<proto>.<service>.<ns>.svc.<zone> SRV: a named port, with its targets' addresses
//   <a-b-c-d>.<ns>.pod.<zone>                 A: with "pods insecure", the address in the name
//   dns-version.<zone>                        TXT: the specification's version
// and PTR records for service and endpoint addresses in the reverse zones.

import (
	"net"
	"strings"

	"github.com/miekg/dns"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
)

const specVersion = "1.1.0"

type kubeData struct {
	services  corelisters.ServiceLister
	endpoints corelisters.EndpointsLister
	synced    func() bool
}

// A kubeAnswer is what the cluster's data says of one question: records, or that the name does
// not exist (nxdomain), or that it exists without records of the type asked (neither).
type kubeAnswer struct {
	answer   []dns.RR
	extra    []dns.RR
	nxdomain bool
}

type endpointAddr struct {
	host string // the endpoint's hostname, or its address with dashes
	ip   net.IP
}

func header(name string, rrtype uint16, ttl uint32) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: rrtype, Class: dns.ClassINET, Ttl: ttl}
}

// addressRR gives the A or AAAA record of ip when it is of the type asked (ANY takes both).
func addressRR(name string, qtype uint16, ip net.IP, ttl uint32) dns.RR {
	if v4 := ip.To4(); v4 != nil {
		if qtype == dns.TypeA || qtype == dns.TypeANY {
			return &dns.A{Hdr: header(name, dns.TypeA, ttl), A: v4}
		}
		return nil
	}
	if qtype == dns.TypeAAAA || qtype == dns.TypeANY {
		return &dns.AAAA{Hdr: header(name, dns.TypeAAAA, ttl), AAAA: ip}
	}
	return nil
}

func dashed(ip net.IP) string {
	if v4 := ip.To4(); v4 != nil {
		return strings.ReplaceAll(v4.String(), ".", "-")
	}
	return strings.ReplaceAll(ip.String(), ":", "-")
}

func (k *kubeData) service(name, ns string) *v1.Service {
	svc, err := k.services.Services(ns).Get(name)
	if err != nil {
		return nil
	}
	return svc
}

func (k *kubeData) readyAddresses(name, ns string) []endpointAddr {
	ep, err := k.endpoints.Endpoints(ns).Get(name)
	if err != nil {
		return nil
	}
	var out []endpointAddr
	for _, s := range ep.Subsets {
		for _, a := range s.Addresses {
			ip := net.ParseIP(a.IP)
			if ip == nil {
				continue
			}
			host := a.Hostname
			if host == "" {
				host = dashed(ip)
			}
			out = append(out, endpointAddr{host: strings.ToLower(host), ip: ip})
		}
	}
	return out
}

func clusterIPs(svc *v1.Service) []net.IP {
	var out []net.IP
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	for _, s := range ips {
		if ip := net.ParseIP(s); ip != nil {
			out = append(out, ip)
		}
	}
	return out
}

func headless(svc *v1.Service) bool {
	return svc.Spec.Type != v1.ServiceTypeExternalName && svc.Spec.ClusterIP == v1.ClusterIPNone
}

// answer resolves a question in one of the forward zones; rest is the name's labels left of
// the zone, lower case.
func (k *kubeData) answer(cfg *kubeConfig, zone string, q dns.Question, rest []string) kubeAnswer {
	n := len(rest)
	switch {
	case n == 0:
		return apexAnswer(cfg, zone, q)
	case n == 1 && rest[0] == "dns-version":
		if q.Qtype == dns.TypeTXT || q.Qtype == dns.TypeANY {
			return kubeAnswer{answer: []dns.RR{&dns.TXT{Hdr: header(q.Name, dns.TypeTXT, cfg.ttl), Txt: []string{specVersion}}}}
		}
		return kubeAnswer{}
	case rest[n-1] == "svc":
		return k.serviceAnswer(cfg, zone, q, rest[:n-1])
	case rest[n-1] == "pod" && n == 3 && cfg.pods != "disabled":
		ip := net.ParseIP(strings.ReplaceAll(rest[0], "-", "."))
		if ip == nil {
			ip = net.ParseIP(strings.ReplaceAll(rest[0], "-", ":"))
		}
		if ip == nil {
			return kubeAnswer{nxdomain: true}
		}
		if rr := addressRR(q.Name, q.Qtype, ip, cfg.ttl); rr != nil {
			return kubeAnswer{answer: []dns.RR{rr}}
		}
		return kubeAnswer{}
	case n == 1 && rest[0] == "pod" && cfg.pods != "disabled":
		return kubeAnswer{}
	}
	return kubeAnswer{nxdomain: true}
}

func apexAnswer(cfg *kubeConfig, zone string, q dns.Question) kubeAnswer {
	switch q.Qtype {
	case dns.TypeSOA:
		return kubeAnswer{answer: []dns.RR{soa(zone, cfg.ttl)}}
	case dns.TypeNS:
		return kubeAnswer{answer: []dns.RR{&dns.NS{Hdr: header(q.Name, dns.TypeNS, cfg.ttl), Ns: "ns.dns." + zone}}}
	}
	return kubeAnswer{}
}

// soa is the zone's authority record, also sent with negative answers so that resolvers cache
// them for at most the ttl.
func soa(zone string, ttl uint32) dns.RR {
	return &dns.SOA{Hdr: header(zone, dns.TypeSOA, ttl), Ns: "ns.dns." + zone, Mbox: "hostmaster." + zone,
		Serial: 1, Refresh: 7200, Retry: 1800, Expire: 86400, Minttl: ttl}
}

func (k *kubeData) serviceAnswer(cfg *kubeConfig, zone string, q dns.Question, rest []string) kubeAnswer {
	switch len(rest) {
	case 0: // svc.<zone>: a name with names below it
		return kubeAnswer{}
	case 1: // <ns>.svc.<zone>
		list, err := k.services.Services(rest[0]).List(labels.Everything())
		if err != nil || len(list) == 0 {
			return kubeAnswer{nxdomain: true}
		}
		return kubeAnswer{}
	case 2:
		return k.serviceRecords(cfg, zone, q, rest[0], rest[1])
	case 3:
		if strings.HasPrefix(rest[0], "_") { // _<proto>.<service>...: a name above the SRV records
			return k.emptyIfService(rest[1], rest[2])
		}
		return k.endpointRecords(cfg, q, rest[0], rest[1], rest[2])
	case 4:
		if strings.HasPrefix(rest[0], "_") && strings.HasPrefix(rest[1], "_") {
			return k.srvRecords(cfg, zone, q, rest[0][1:], rest[1][1:], rest[2], rest[3])
		}
	}
	return kubeAnswer{nxdomain: true}
}

func (k *kubeData) emptyIfService(name, ns string) kubeAnswer {
	if k.service(name, ns) == nil {
		return kubeAnswer{nxdomain: true}
	}
	return kubeAnswer{}
}

func (k *kubeData) serviceRecords(cfg *kubeConfig, zone string, q dns.Question, name, ns string) kubeAnswer {
	svc := k.service(name, ns)
	if svc == nil {
		return kubeAnswer{nxdomain: true}
	}
	if svc.Spec.Type == v1.ServiceTypeExternalName {
		if q.Qtype == dns.TypeSRV {
			return kubeAnswer{}
		}
		return kubeAnswer{answer: []dns.RR{&dns.CNAME{Hdr: header(q.Name, dns.TypeCNAME, cfg.ttl), Target: dns.Fqdn(svc.Spec.ExternalName)}}}
	}
	if q.Qtype == dns.TypeSRV {
		return k.srvRecords(cfg, zone, q, "", "", name, ns)
	}
	var ans kubeAnswer
	if headless(svc) {
		for _, a := range k.readyAddresses(name, ns) {
			if rr := addressRR(q.Name, q.Qtype, a.ip, cfg.ttl); rr != nil {
				ans.answer = append(ans.answer, rr)
			}
		}
		return ans
	}
	for _, ip := range clusterIPs(svc) {
		if rr := addressRR(q.Name, q.Qtype, ip, cfg.ttl); rr != nil {
			ans.answer = append(ans.answer, rr)
		}
	}
	return ans
}

func (k *kubeData) endpointRecords(cfg *kubeConfig, q dns.Question, host, name, ns string) kubeAnswer {
	svc := k.service(name, ns)
	if svc == nil || !headless(svc) {
		return kubeAnswer{nxdomain: true}
	}
	var ans kubeAnswer
	found := false
	for _, a := range k.readyAddresses(name, ns) {
		if a.host != host {
			continue
		}
		found = true
		if rr := addressRR(q.Name, q.Qtype, a.ip, cfg.ttl); rr != nil {
			ans.answer = append(ans.answer, rr)
		}
	}
	ans.nxdomain = !found
	return ans
}

// srvRecords answers _port._proto.<service> (port and proto given) or <service> itself (both
// empty: every named port).
func (k *kubeData) srvRecords(cfg *kubeConfig, zone string, q dns.Question, port, proto, name, ns string) kubeAnswer {
	svc := k.service(name, ns)
	if svc == nil {
		return kubeAnswer{nxdomain: true}
	}
	if q.Qtype != dns.TypeSRV && q.Qtype != dns.TypeANY {
		return k.emptyIfService(name, ns)
	}
	base := name + "." + ns + ".svc." + zone
	var ans kubeAnswer
	matched := false
	for _, p := range svc.Spec.Ports {
		if p.Name == "" || port != "" && (strings.ToLower(p.Name) != port || strings.ToLower(string(p.Protocol)) != proto) {
			continue
		}
		matched = true
		if !headless(svc) {
			ans.answer = append(ans.answer, &dns.SRV{Hdr: header(q.Name, dns.TypeSRV, cfg.ttl), Priority: 0, Weight: 100, Port: uint16(p.Port), Target: base})
			for _, ip := range clusterIPs(svc) {
				if rr := addressRR(base, dns.TypeANY, ip, cfg.ttl); rr != nil {
					ans.extra = append(ans.extra, rr)
				}
			}
			continue
		}
		for _, a := range k.readyAddresses(name, ns) {
			target := a.host + "." + base
			ans.answer = append(ans.answer, &dns.SRV{Hdr: header(q.Name, dns.TypeSRV, cfg.ttl), Priority: 0, Weight: 100, Port: uint16(p.TargetPort.IntValue()), Target: target})
			if p.TargetPort.IntValue() == 0 {
				ans.answer[len(ans.answer)-1].(*dns.SRV).Port = uint16(p.Port)
			}
			ans.extra = append(ans.extra, addressRR(target, dns.TypeANY, a.ip, cfg.ttl))
		}
	}
	if port != "" && !matched {
		ans.nxdomain = true
	}
	return ans
}

// reverseIP reads the address of a PTR name in in-addr.arpa or ip6.arpa.
func reverseIP(name string) net.IP {
	name = strings.TrimSuffix(name, ".")
	switch {
	case strings.HasSuffix(name, ".in-addr.arpa"):
		l := strings.Split(strings.TrimSuffix(name, ".in-addr.arpa"), ".")
		if len(l) != 4 {
			return nil
		}
		return net.ParseIP(l[3] + "." + l[2] + "." + l[1] + "." + l[0]).To4()
	case strings.HasSuffix(name, ".ip6.arpa"):
		l := strings.Split(strings.TrimSuffix(name, ".ip6.arpa"), ".")
		if len(l) != 32 {
			return nil
		}
		var b strings.Builder
		for i := 31; i >= 0; i-- {
			if len(l[i]) != 1 {
				return nil
			}
			b.WriteString(l[i])
			if i%4 == 0 && i > 0 {
				b.WriteByte(':')
			}
		}
		return net.ParseIP(b.String())
	}
	return nil
}

// ptr finds the service or endpoint that has the address; zone is the cluster's forward zone.
func (k *kubeData) ptr(cfg *kubeConfig, zone string, q dns.Question) []dns.RR {
	ip := reverseIP(strings.ToLower(q.Name))
	if ip == nil {
		return nil
	}
	list, err := k.services.List(labels.Everything())
	if err != nil {
		return nil
	}
	var out []dns.RR
	for _, svc := range list {
		base := svc.Name + "." + svc.Namespace + ".svc." + zone
		for _, c := range clusterIPs(svc) {
			if c.Equal(ip) {
				out = append(out, &dns.PTR{Hdr: header(q.Name, dns.TypePTR, cfg.ttl), Ptr: base})
			}
		}
		if !headless(svc) {
			continue
		}
		for _, a := range k.readyAddresses(svc.Name, svc.Namespace) {
			if a.ip.Equal(ip) {
				out = append(out, &dns.PTR{Hdr: header(q.Name, dns.TypePTR, cfg.ttl), Ptr: a.host + "." + base})
			}
		}
	}
	return out
}
