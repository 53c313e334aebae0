package c10d

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// c10d's TCPStore cannot listen on one address in the libtorch drmas links (1.13: TCPStoreOptions has
// a port and no host, and the server binds the wildcard address, "*:PORT" in ss -ltn; 2.x adds a
// pre-bound descriptor, masterListenFd, but no host either). A store for ranks of one machine
// (MASTER_ADDR a loopback address, as Launch sets) is therefore restricted after the fact: its
// listening socket is bound to the loopback device (SO_BINDTODEVICE "lo"), so the kernel refuses
// connections that arrive on any other interface ("*%lo:PORT" in ss -ltn).

// isLoopback reports whether host names this machine's loopback.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// storeSockets returns this process's listening TCP sockets on port.
func storeSockets(port int) []int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if link, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || !strings.HasPrefix(link, "socket:") {
			continue
		}
		if v, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN); err != nil || v != 1 {
			continue
		}
		sa, err := syscall.Getsockname(fd)
		if err != nil {
			continue
		}
		switch a := sa.(type) {
		case *syscall.SockaddrInet4:
			if a.Port == port {
				out = append(out, fd)
			}
		case *syscall.SockaddrInet6:
			if a.Port == port {
				out = append(out, fd)
			}
		}
	}
	return out
}

// restrictToLoopback binds this process's listening sockets on port to the loopback device and
// returns how many it restricted.
func restrictToLoopback(port int) (int, error) {
	n := 0
	for _, fd := range storeSockets(port) {
		if boundDevice(fd) == "lo" {
			n++
			continue
		}
		if err := syscall.SetsockoptString(fd, syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE, "lo"); err != nil {
			return n, fmt.Errorf("bind the store's socket to the loopback device: %w", err)
		}
		n++
	}
	return n, nil
}

// boundDevice is the device a socket is bound to ("" for none).
func boundDevice(fd int) string {
	var buf [syscall.IFNAMSIZ]byte
	n := uint32(len(buf))
	_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, uintptr(fd), syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE,
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return ""
	}
	return strings.TrimRight(string(buf[:n]), "\x00")
}

// guardLoopbackStore restricts the store this process is about to serve on port to the loopback
// device as soon as it listens (the rendezvous that follows then only admits local ranks). It polls
// until stop is closed; the result says how many sockets it restricted.
func guardLoopbackStore(port int, stop <-chan struct{}) <-chan loopbackResult {
	res := make(chan loopbackResult, 1)
	go func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			n, err := restrictToLoopback(port)
			if n > 0 || err != nil {
				res <- loopbackResult{n, err}
				return
			}
			select {
			case <-stop:
				n, err := restrictToLoopback(port) // a last look: the store may have come up meanwhile
				res <- loopbackResult{n, err}
				return
			case <-tick.C:
			}
		}
	}()
	return res
}

type loopbackResult struct {
	sockets int
	err     error
}
