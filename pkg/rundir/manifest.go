package rundir

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/files"
)

// ManifestFile is written last into a checkpoint folder: the step, the world size and every file the
// folder holds with its size and CRC-32C. A checkpoint is complete only when its manifest agrees with
// the folder's name and with its files (see Verify in resume.go).
const ManifestFile = "manifest.json"

// manifestFormat is the version of the manifest layout.
const manifestFormat = 1

// maxManifestFiles bounds the entries a manifest may list (a checkpoint holds a handful per model).
const maxManifestFiles = 100_000

// castagnoli is the CRC-32C table (SSE4.2 / ARMv8 CRC instructions where the CPU has them).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Manifest is what ManifestFile records.
type Manifest struct {
	Format    int             `json:"format"`
	Step      *int            `json:"step"`
	WorldSize int             `json:"world_size"`
	Files     []ManifestEntry `json:"files"`
}

type ManifestEntry struct {
	Path   string `json:"path"` // slash-separated, relative to the checkpoint folder
	Size   int64  `json:"size"`
	CRC32C string `json:"crc32c"` // 8 hex digits
}

// ErrNoManifest is returned by ReadManifest for a folder without ManifestFile (a checkpoint written
// before manifests).
var ErrNoManifest = errors.New("no " + ManifestFile)

// fileCRC32C returns a file's CRC-32C as 8 hex digits and its size.
func fileCRC32C(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := crc32.New(castagnoli)
	n, err := io.CopyBuffer(h, f, make([]byte, 4<<20))
	if err != nil {
		return "", 0, fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// Files lists the regular files under dir (slash-separated relative paths, sorted), the
// manifest apart. Anything that is neither a regular file nor a folder is an error.
func ListFiles(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file (%v)", path, d.Type())
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		if rel = filepath.ToSlash(rel); rel != ManifestFile {
			out = append(out, rel)
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

// WriteManifest checksums every file in a checkpoint folder and writes the manifest (synced, with the
// folder). Call it last, once every other file is written and synced.
func WriteManifest(dir string, step, worldSize int) error {
	names, err := ListFiles(dir)
	if err != nil {
		return err
	}
	m := Manifest{Format: manifestFormat, Step: &step, WorldSize: worldSize, Files: []ManifestEntry{}}
	for _, n := range names {
		sum, size, err := fileCRC32C(filepath.Join(dir, filepath.FromSlash(n)))
		if err != nil {
			return err
		}
		m.Files = append(m.Files, ManifestEntry{Path: n, Size: size, CRC32C: sum})
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteBytes(filepath.Join(dir, ManifestFile), append(b, '\n'))
}

// ReadManifest reads and checks a checkpoint's manifest against the folder's step (any step when
// step < 0): ErrNoManifest when there is none.
func ReadManifest(dir string, step int) (*Manifest, error) {
	path := filepath.Join(dir, ManifestFile)
	b, err := files.Read(path, files.MaxJSON)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoManifest
	}
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case m.Format != manifestFormat:
		return nil, fmt.Errorf("%s: format %d, want %d (written by another drmas?)", path, m.Format, manifestFormat)
	case m.Step == nil:
		return nil, fmt.Errorf("%s: no step", path)
	case step >= 0 && *m.Step != step:
		return nil, fmt.Errorf("%s: step %d, but the folder is %s%d", path, *m.Step, StepPrefix, step)
	case m.WorldSize < 1:
		return nil, fmt.Errorf("%s: world_size %d, want ≥ 1", path, m.WorldSize)
	case len(m.Files) == 0 || len(m.Files) > maxManifestFiles:
		return nil, fmt.Errorf("%s: lists %d files", path, len(m.Files))
	}
	seen := map[string]bool{}
	for i, f := range m.Files {
		p := filepath.FromSlash(f.Path)
		switch {
		case !filepath.IsLocal(p) || f.Path != filepath.ToSlash(filepath.Clean(p)) || f.Path == ManifestFile:
			return nil, fmt.Errorf("%s: files[%d]: path %q is not a file inside the checkpoint", path, i, f.Path)
		case seen[f.Path]:
			return nil, fmt.Errorf("%s: files[%d]: %s listed twice", path, i, f.Path)
		case f.Size < 0 || len(f.CRC32C) != 8:
			return nil, fmt.Errorf("%s: files[%d] (%s): bad size or crc32c", path, i, f.Path)
		}
		seen[f.Path] = true
	}
	return &m, nil
}

// CheckManifest compares a checkpoint folder with its manifest: the same files (none missing, none
// added), each of the recorded size and CRC-32C. The error names the first file that differs.
func CheckManifest(dir string, m *Manifest) error {
	names, err := ListFiles(dir)
	if err != nil {
		return err
	}
	listed := map[string]bool{}
	for _, f := range m.Files {
		listed[f.Path] = true
	}
	for _, n := range names {
		if !listed[n] {
			return fmt.Errorf("%s: not in %s (added after the checkpoint was written)", filepath.Join(dir, n), ManifestFile)
		}
	}
	for _, f := range m.Files {
		path := filepath.Join(dir, filepath.FromSlash(f.Path))
		st, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: missing (listed in %s)", path, ManifestFile)
		}
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%s: not a regular file (%v)", path, st.Mode().Type())
		}
		if st.Size() != f.Size {
			return fmt.Errorf("%s: %d bytes, %s says %d", path, st.Size(), ManifestFile, f.Size)
		}
		sum, _, err := fileCRC32C(path)
		if err != nil {
			return err
		}
		if sum != f.CRC32C {
			return fmt.Errorf("%s: CRC-32C %s, %s says %s (the bytes changed after the checkpoint was written)", path, sum, ManifestFile, f.CRC32C)
		}
	}
	return nil
}

// VerifyManifest checks a checkpoint folder given by hand (drmas eval --checkpoint) against its
// manifest: every file there, of the recorded size and CRC-32C, and the step its name says when it is
// named step-N. A folder without a manifest (a model folder, a checkpoint from an older drmas) passes.
func VerifyManifest(dir string) error {
	m, err := ReadManifest(dir, StepOf(dir))
	if errors.Is(err, ErrNoManifest) {
		return nil
	}
	if err != nil {
		return err
	}
	return CheckManifest(dir, m)
}
