package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// tmpSuffix ends the name of every temporary file this package makes.
const tmpSuffix = ".drmas-tmp"

// Write creates or replaces path with what write writes. On any error path is left as it was and
// the temporary file is removed.
func Write(path string, write func(io.Writer) error) error {
	dir := filepath.Dir(path)
	RemoveStale(path)
	tmp := filepath.Join(dir, "."+filepath.Base(path)+"."+strconv.Itoa(os.Getpid())+"-"+strconv.FormatUint(rand.Uint64(), 36)+tmpSuffix)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := write(f); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	// Without the fsync a zero-length file is a possible outcome after the rename (ext4 data=ordered).
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		done = true
		return fmt.Errorf("write %s: %w", path, err)
	}
	done = true
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// WriteBytes creates or replaces path with data.
func WriteBytes(path string, data []byte) error {
	return Write(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// RemoveStale removes the temporary files that Write left beside path in processes that no longer
// run (a SIGKILL or a power loss during the write). Files of a live process, and every other file,
// are left alone. Errors are ignored: a leftover is harmless.
func RemoveStale(path string) {
	dir, base := filepath.Dir(path), filepath.Base(path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	prefix := "." + base + "."
	for _, e := range entries {
		name := e.Name()
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if rest, ok = strings.CutSuffix(rest, tmpSuffix); !ok {
			continue
		}
		pid, rnd, ok := strings.Cut(rest, "-")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n <= 0 || rnd == "" || strings.ContainsAny(rnd, ".-") {
			continue
		}
		if processGone(n) {
			_ = os.Remove(filepath.Join(dir, name))
		}
	}
}

// processGone reports whether no process has the PID (a process of another user counts as alive).
func processGone(pid int) bool {
	if pid == os.Getpid() {
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// SyncDir flushes a folder's entries (names created, renamed or removed in it) to disk.
func SyncDir(dir string) error { return syncPath(dir) }

// syncPath flushes one file or folder to disk.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}

// SyncTree flushes every file and folder under root (root included) to disk: for a folder whose files
// were written without a sync, before it is renamed into place.
func SyncTree(root string) error {
	return filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		return syncPath(path)
	})
}
