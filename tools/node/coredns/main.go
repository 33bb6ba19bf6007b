// The real node's cluster DNS: CoreDNS built with the few plugins the test environment's
// Corefile uses (bind, kubernetes, forward, cache, errors, health, ready) instead of its default
// set, so the build compiles a fraction of its dependencies. The directive order is the
// one CoreDNS's own plugin.cfg gives these plugins.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "cache", "kubernetes", "forward"}
}

func main() {
	coremain.Run()
}
