// Command mathrunner serves the math orchestra with toy prompts as a gateway runner
// (pkg/gateway/mathrunner): the built-in toy-math team's calls, made through drmas's OpenAI-compatible
// gateway. scripts/gateway-equivalence.sh and scripts/gateway-overhead.sh train with it to compare the
// gateway with the built-in orchestra.
//
//	go build -o bin/mathrunner ./scripts/mathrunner
//	orchestra: {type: gateway, runner: {url: "http://127.0.0.1:18124", command: bin/mathrunner}}
//
// It listens on the address of --addr, else of DRMAS_RUNNER_URL (set by drmas for a runner it starts).
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"

	"github.com/drmas/drmas/pkg/gateway/mathrunner"
)

func main() {
	addr := flag.String("addr", "", "host:port to listen on (default: DRMAS_RUNNER_URL's)")
	maxLoop := flag.Int("max-loop", 2, "Solver calls at most (orchestra.max_loop_num)")
	flag.Parse()
	if *addr == "" {
		u, err := url.Parse(os.Getenv("DRMAS_RUNNER_URL"))
		if err != nil || u.Host == "" {
			fmt.Fprintln(os.Stderr, "mathrunner: give --addr host:port or set DRMAS_RUNNER_URL")
			os.Exit(2)
		}
		*addr = u.Host
	}
	if h, _, err := net.SplitHostPort(*addr); err != nil || (h != "127.0.0.1" && h != "localhost" && h != "::1") {
		fmt.Fprintf(os.Stderr, "mathrunner: %s is not a loopback address: the runner holds each episode's API key\n", *addr)
		os.Exit(2)
	}
	err := http.ListenAndServe(*addr, mathrunner.Runner{MaxLoop: *maxLoop})
	fmt.Fprintln(os.Stderr, "mathrunner:", err)
	os.Exit(1)
}
