// Package atomicfile writes files all at once or not at all: through a temporary file in the target's
// folder, synced and renamed over the target (github.com/google/renameio), so that a crash or an
// error leaves the previous file, never a partial one. New files get mode 0644 (less the umask).
package atomicfile

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/google/renameio/v2"
)

// Write creates or replaces path with what write writes. On any error path is left as it was and
// the temporary file is removed.
func Write(path string, write func(io.Writer) error) error {
	f, err := renameio.NewPendingFile(path, renameio.WithTempDir(filepath.Dir(path)), renameio.WithPermissions(0o644))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer f.Cleanup()
	if err := write(f); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.CloseAtomicallyReplace(); err != nil {
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
