package rundir

import (
	"path/filepath"
	"slices"
	"sync"
)

// Besides its own files (checkpoints, metrics.jsonl, config.yaml, the lock), a run folder holds what
// other packages write at its top: the engines' published weights and managed replicas, the
// reporter's transcripts, event files and curves, the trainer's KL reference and warm-up report.
// Each registers the names it writes (Own), so that the run folder knows them as drmas's — --force
// deletes them, a foreign folder is one holding anything else — without knowing who writes them.
// Files inside a checkpoint are checked for damage by kind (CheckFiles: safetensors headers).

var (
	mu     sync.RWMutex
	owned  []string                               // registered top-level names
	checks = map[string]func(path string) error{} // by extension
)

// Own registers names written at the top of a run folder by the calling package; it returns the
// first, so that a package can declare and register its name in one line:
//
//	var WeightsDir = rundir.Own("weights")
func Own(names ...string) string {
	mu.Lock()
	defer mu.Unlock()
	for _, n := range names {
		if !slices.Contains(owned, n) {
			owned = append(owned, n)
		}
	}
	return names[0]
}

// CheckFiles registers how a checkpoint's files with extension ext (".safetensors") are checked
// for damage, by Verify; check reads the file and returns what is wrong with it.
func CheckFiles(ext string, check func(path string) error) bool {
	mu.Lock()
	defer mu.Unlock()
	checks[ext] = check
	return true
}

// ownedName says whether a name at the top of a run folder is drmas's.
func ownedName(name string) bool {
	if ownedRE.MatchString(name) {
		return true
	}
	mu.RLock()
	defer mu.RUnlock()
	return slices.Contains(owned, name)
}

// checkFile checks a checkpoint file by its kind (nil when no check is registered for it).
func checkFile(path string) error {
	mu.RLock()
	check := checks[filepath.Ext(path)]
	mu.RUnlock()
	if check == nil {
		return nil
	}
	return check(path)
}
