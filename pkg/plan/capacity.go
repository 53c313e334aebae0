package plan

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Where Probe looks; tests point them elsewhere.
var (
	meminfoPath   = "/proc/meminfo"
	cgroupMaxPath = "/sys/fs/cgroup/memory.max"
	nvidiaSMI     = "nvidia-smi"
)

// Probe asks this machine for a device's memory.
//
// CPU: MemAvailable from /proc/meminfo (MemTotal where the kernel has no MemAvailable), capped by
// the cgroup's memory.max when one is set. Available rather than total: the plan is made just
// before the run starts, on a machine other processes share, and memory they hold (page cache
// aside, which MemAvailable already counts as free) is not the run's to take.
//
// CUDA: the GPU's total memory from nvidia-smi (memory.total; CUDA_VISIBLE_DEVICES maps cuda:N to
// the N-th device it lists, as CUDA does). Total rather than free: the run is the GPU's only
// tenant, and the CUDA context it creates is in the plan's overhead. nvidia-smi needs no CUDA
// context, so asking does not take memory from the GPU; without it the capacity is unknown.
func Probe(device string) (int64, string, error) {
	if device == "cpu" {
		return cpuMemory()
	}
	if !strings.HasPrefix(device, "cuda:") {
		return 0, "", fmt.Errorf("device %q: no way to ask its memory", device)
	}
	out, err := nvidiaQuery(device, "memory.total")
	if err != nil {
		return 0, "", err
	}
	mib, err := strconv.ParseFloat(out, 64)
	if err != nil || mib <= 0 {
		return 0, "", fmt.Errorf("%s: nvidia-smi memory.total %q: not a number of MiB", device, out)
	}
	return int64(mib * (1 << 20)), "nvidia-smi memory.total", nil
}

// GPUName is nvidia-smi's name of a CUDA device ("cuda:N", as Probe maps it), e.g. "NVIDIA H200".
func GPUName(device string) (string, error) {
	return nvidiaQuery(device, "name")
}

// nvidiaQuery asks nvidia-smi for one field of device cuda:N (CUDA_VISIBLE_DEVICES maps N to the
// N-th device it lists, as CUDA does); the first line of the answer, trimmed.
func nvidiaQuery(device, field string) (string, error) {
	idx, ok := strings.CutPrefix(device, "cuda:")
	if !ok {
		return "", fmt.Errorf("device %q: not a CUDA device", device)
	}
	sel := idx
	if vis, set := os.LookupEnv("CUDA_VISIBLE_DEVICES"); set {
		n, _ := strconv.Atoi(idx)
		ids := strings.Split(vis, ",")
		if n >= len(ids) || strings.TrimSpace(ids[n]) == "" {
			return "", fmt.Errorf("%s: CUDA_VISIBLE_DEVICES=%q lists %d device(s)", device, vis, len(ids))
		}
		sel = strings.TrimSpace(ids[n])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, nvidiaSMI, "--query-gpu="+field, "--format=csv,noheader,nounits", "-i", sel).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return "", fmt.Errorf("%s: nvidia-smi: %w", device, err)
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]), nil
}

func cpuMemory() (int64, string, error) {
	f, err := os.Open(meminfoPath)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	kb := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 0 {
			continue
		}
		if n, err := strconv.ParseInt(fs[0], 10, 64); err == nil {
			kb[k] = n
		}
	}
	bytes, source := kb["MemAvailable"]*1024, "MemAvailable (/proc/meminfo)"
	if _, ok := kb["MemAvailable"]; !ok {
		bytes, source = kb["MemTotal"]*1024, "MemTotal (/proc/meminfo; the kernel reports no MemAvailable)"
	}
	if bytes <= 0 {
		return 0, "", fmt.Errorf("%s: no MemAvailable or MemTotal", meminfoPath)
	}
	if b, err := os.ReadFile(cgroupMaxPath); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n < bytes {
			bytes, source = n, "cgroup memory.max"
		}
	}
	return bytes, source, nil
}

// Capacities fills in each device's capacity: from opt.Memory when it names the device (or "" for
// every device), else from opt.Capacity (Probe by default). A device whose memory cannot be found
// keeps capacity 0 (unknown) and gets a note.
func (pl *Plan) Capacities(opt Options) {
	probe := opt.Capacity
	if probe == nil {
		probe = Probe
	}
	for i := range pl.Devices {
		d := &pl.Devices[i]
		d.CapacityBytes, d.CapacitySource, d.Fits, d.Fix, d.FixSets, d.FixPeak, d.Alternatives = 0, "", nil, "", nil, 0, nil
		if n, ok := opt.Memory[d.Device]; ok {
			d.CapacityBytes, d.CapacitySource = n, "--device-memory"
		} else if n, ok := opt.Memory[""]; ok {
			d.CapacityBytes, d.CapacitySource = n, "--device-memory"
		} else if n, src, err := probe(d.Device); err != nil {
			d.CapacitySource = "unknown: " + err.Error()
		} else {
			d.CapacityBytes, d.CapacitySource = n, src
		}
		if d.CapacityBytes > 0 {
			fits := d.PeakBytes <= d.CapacityBytes
			d.Fits = &fits
			if !fits {
				pl.fix(d)
			}
		}
	}
}

// Check says whether every device holds its plan: an error naming, for each device that does not,
// its peak and capacity and the config keys that would make it fit; a warning for each device
// whose capacity is unknown (a plan never blocks a run it cannot judge).
func (pl *Plan) Check() (warnings []string, err error) {
	var errs []string
	for _, d := range pl.Devices {
		switch {
		case d.Fits == nil:
			warnings = append(warnings, fmt.Sprintf("memory plan: %s needs %s at its peak; its memory is unknown (%s), so the plan is not checked: --device-memory %s=SIZE states it",
				d.Device, Bytes(d.PeakBytes), strings.TrimPrefix(d.CapacitySource, "unknown: "), d.Device))
		case !*d.Fits:
			errs = append(errs, pl.overflow(d))
		}
	}
	if len(errs) == 0 {
		return warnings, nil
	}
	// One line: errors are one-line messages (docs/run-folder.md "How drmas treats bad input").
	return warnings, errors.New(strings.Join(errs, " | "))
}

// overflow says why a device's plan exceeds its memory.
func (pl *Plan) overflow(d Device) string {
	var b strings.Builder
	phase := d.phase()
	if phase == "update" {
		phase = "training update"
	}
	fmt.Fprintf(&b, "memory plan: %s needs %s at its peak (the %s), more than its %s (%s)", d.Device, Bytes(d.PeakBytes), phase, Bytes(d.CapacityBytes), d.CapacitySource)
	if d.Fix != "" {
		fmt.Fprintf(&b, "; it fits with %s", d.Fix)
		for _, a := range d.Alternatives {
			fmt.Fprintf(&b, ", or with %s", a)
		}
	} else {
		b.WriteString("; no change of the keys below fits on its own or with gradient checkpointing, offload or sharding")
	}
	b.WriteString("; keys that change it:")
	for _, m := range pl.Models {
		if m.Device != d.Device {
			if d.Device == "cpu" && m.Offloaded > 0 {
				fmt.Fprintf(&b, " models[%d].optim.offload (cpu);", m.Index)
			}
			continue
		}
		for _, k := range m.keys {
			b.WriteString(" " + k + ";")
		}
	}
	b.WriteString(" or another machine: --device-memory plans for it (drmas train --dry-run prints the plan)")
	return b.String()
}

// ParseMemory reads --device-memory values: "80GB" (every device) or "cuda:1=40GB" (one device),
// sizes in B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024); each device once.
func ParseMemory(values []string) (map[string]int64, error) {
	out := map[string]int64{}
	given := map[string]string{} // the item that set each device, for the refusal of a second one
	for _, v := range values {
		for _, item := range strings.Split(v, ",") {
			dev, size, ok := strings.Cut(item, "=")
			if !ok {
				dev, size = "", item
			} else {
				if d := strings.ToLower(strings.TrimSpace(dev)); d == "" || d == "auto" {
					return nil, fmt.Errorf("--device-memory %q: name a device (cpu, cuda:N) or give the size alone for every device", item)
				}
				var err error
				if dev, err = deviceName(dev, nil); err != nil {
					return nil, fmt.Errorf("--device-memory %q: %w", item, err)
				}
			}
			n, err := ParseBytes(size)
			if err != nil {
				return nil, fmt.Errorf("--device-memory %q: %w", item, err)
			}
			if first, dup := given[dev]; dup {
				what := dev
				if dev == "" {
					what = "the size of every device"
				}
				return nil, fmt.Errorf("--device-memory %q: %s is given twice (%q before): give each device once", item, what, first)
			}
			given[dev] = item
			out[dev] = n
		}
	}
	return out, nil
}

// ParseBytes reads a size such as 80GB, 141GB, 512MiB or 1.5TB.
func ParseBytes(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	units := []struct {
		suffix string
		mult   float64
	}{{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"TIB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	mult := 1.0
	for _, u := range units {
		if num, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(num), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	// !(v > 0) refuses NaN too (NaN <= 0 is false: "NaN" became a size that turned the check off).
	if err != nil || !(v > 0) || math.IsInf(v*mult, 0) || v*mult > math.MaxInt64/2 {
		return 0, fmt.Errorf("%q: want a positive, finite size such as 80GB, 24GiB or 512MB", s)
	}
	return int64(v * mult), nil
}

// Bytes formats a size in GB (10⁹ bytes), or MB below 1 GB.
func Bytes(n int64) string {
	if n >= 1e9 || n <= -1e9 {
		return fmt.Sprintf("%.2f GB", float64(n)/1e9)
	}
	return fmt.Sprintf("%.1f MB", float64(n)/1e6)
}
