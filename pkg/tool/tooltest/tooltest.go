// Package tooltest gives tests the MCP project's reference test server (npm
// @modelcontextprotocol/server-everything, installed by scripts/mcp-everything.sh): over stdio, and
// over streamable HTTP on a loopback port.
package tooltest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// loopbackShim makes a Node server that listens on a bare port (server-everything's streamableHttp
// transport: app.listen(PORT), all interfaces) listen on 127.0.0.1 only. It is preloaded with
// node --import.
const loopbackShim = `import net from "node:net";
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (/^\d+$/.test(String(args[0])) && typeof args[1] !== "string") args.splice(1, 0, "127.0.0.1");
  return listen.apply(this, args);
};
`

// Everything finds the reference MCP test server (npm @modelcontextprotocol/server-everything,
// installed by scripts/mcp-everything.sh into .cache/mcp-everything, or DRMAS_MCP_EVERYTHING) and node;
// without them the test skips. root is the repository's root, relative to the test's folder.
func Everything(t testing.TB, root string) (node, entry string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found: the MCP server-everything test needs Node.js and scripts/mcp-everything.sh")
	}
	dir := os.Getenv("DRMAS_MCP_EVERYTHING")
	if dir == "" {
		dir = filepath.Join(root, ".cache", "mcp-everything")
	}
	entry = filepath.Join(dir, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js")
	if _, err := os.Stat(entry); err != nil {
		t.Skipf("@modelcontextprotocol/server-everything is not installed in %s: run scripts/mcp-everything.sh (make test does)", dir)
	}
	return node, entry
}

// EverythingHTTP runs server-everything's streamable-HTTP transport on a free loopback port and
// returns its endpoint once it accepts connections.
func EverythingHTTP(t testing.TB, node, entry string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	shim := filepath.Join(t.TempDir(), "loopback.mjs")
	if err := os.WriteFile(shim, []byte(loopbackShim), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, "--import", shim, entry, "streamableHttp")
	cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "listening on port") {
				listening <- sc.Text()
			}
		}
	}()
	select {
	case line := <-listening:
		t.Logf("server-everything: %s (loopback)", line)
	case <-time.After(30 * time.Second):
		t.Fatal("server-everything's streamable HTTP server did not start within 30 s")
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("server-everything does not accept connections on %s: %v", addr, err)
	}
	c.Close()
	return "http://" + addr + "/mcp"
}
