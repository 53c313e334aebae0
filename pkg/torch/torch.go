package torch

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sugarme/gotch"
	lib "github.com/sugarme/gotch/libtch"
	"github.com/sugarme/gotch/ts"
)

// Version is the version of the libtorch drmas is linked with.
func Version() string { return lib.TorchVersion }

// CUDAAvailable reports whether libtorch sees a usable CUDA device.
func CUDAAvailable() bool { return gotch.CUDA.IsAvailable() }

// CUDADeviceCount returns the number of CUDA devices libtorch sees.
func CUDADeviceCount() int {
	if !CUDAAvailable() {
		return 0
	}
	return int(gotch.CUDA.DeviceCount())
}

// ManualSeed seeds libtorch's generators (CPU and CUDA).
func ManualSeed(seed int64) { lib.AtManualSeed(seed) }

// ParseDevice turns "auto", "cpu", "cuda" or "cuda:N" into a gotch device. "auto" is the first CUDA
// device when one is available, else the CPU.
func ParseDevice(s string) (gotch.Device, error) {
	switch s := strings.ToLower(strings.TrimSpace(s)); {
	case s == "" || s == "auto":
		if CUDAAvailable() {
			return gotch.CudaBuilder(0), nil
		}
		return gotch.CPU, nil
	case s == "cpu":
		return gotch.CPU, nil
	case s == "cuda" || strings.HasPrefix(s, "cuda:"):
		idx := 0
		if rest, ok := strings.CutPrefix(s, "cuda:"); ok {
			n, err := strconv.Atoi(rest)
			if err != nil || n < 0 {
				return gotch.CPU, fmt.Errorf("device %q: want cuda:N with N ≥ 0", s)
			}
			idx = n
		}
		if n := CUDADeviceCount(); idx >= n {
			return gotch.CPU, fmt.Errorf("device %q: libtorch %s sees %d CUDA device(s)", s, Version(), n)
		}
		return gotch.CudaBuilder(uint(idx)), nil
	default:
		return gotch.CPU, fmt.Errorf("device %q: want auto, cpu, cuda or cuda:N", s)
	}
}

// DeviceString names a device the way ParseDevice reads it.
func DeviceString(d gotch.Device) string {
	if d.IsCuda() {
		return fmt.Sprintf("cuda:%d", d.Value)
	}
	return "cpu"
}

var worker struct {
	once sync.Once
	jobs chan func()
}

// startWorker runs the torch thread. If a job ends its goroutine (runtime.Goexit, as t.Fatal does in
// a test), a new worker takes over so that later calls do not hang.
func startWorker() {
	go func() {
		runtime.LockOSThread()
		exited := true
		defer func() {
			if exited {
				startWorker()
			}
		}()
		for job := range worker.jobs {
			job()
		}
		exited = false
	}()
}

// waiting counts the callers of Do whose fn has not started.
var waiting atomic.Int64

// Waiting is the number of callers of Do waiting for the torch thread: long work on it (a server's
// continuous generation) can yield to them.
func Waiting() int64 { return waiting.Load() }

// Do runs fn on the one OS thread that does all of drmas's libtorch work and waits for it. libtorch's
// grad mode and other settings are per thread, so running everything there keeps them coherent.
// A panic in fn is re-raised in the caller. Do must not be called from inside fn (it would deadlock):
// code already on the torch thread calls functions directly.
func Do(fn func() error) error {
	worker.once.Do(func() {
		worker.jobs = make(chan func())
		startWorker()
	})
	var err error
	var panicked any
	done := make(chan struct{})
	waiting.Add(1)
	worker.jobs <- func() {
		waiting.Add(-1)
		defer close(done)
		defer func() { panicked = recover() }()
		err = fn()
	}
	<-done
	if panicked != nil {
		panic(panicked)
	}
	return err
}

// NoGrad runs fn with gradient recording off and restores the previous mode afterwards, also on panic.
// Unlike gotch's ts.NoGrad it nests: an inner NoGrad does not re-enable gradients for the outer one.
func NoGrad(fn func() error) error {
	prev := ts.MustGradSetEnabled(false)
	defer ts.MustGradSetEnabled(prev)
	return fn()
}
