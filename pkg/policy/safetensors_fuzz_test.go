package policy

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// stBytes builds a safetensors file from a header and data.
func stBytes(header string, data []byte) []byte {
	b := make([]byte, 8, 8+len(header)+len(data))
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	return append(append(b, header...), data...)
}

// FuzzSafetensorsHeader feeds arbitrary files to the safetensors reader: it never panics, and
// reading every tensor a checked file declares (with its own shape) stays inside the file.
func FuzzSafetensorsHeader(f *testing.F) {
	f.Add(stBytes(`{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}`, make([]byte, 8)))
	f.Add(stBytes(`{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}`, make([]byte, 4)))
	f.Add(stBytes(`{"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}`, make([]byte, 8)))
	f.Add(stBytes(`{"w": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]}}`, nil))
	f.Add(stBytes(`{"__metadata__": {"format": "pt"}}`, nil))
	f.Add(stBytes(`not json`, nil))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "m.safetensors")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		checked := CheckSafetensors(p) == nil
		st, err := openSafetensors(p)
		if err != nil {
			if checked {
				t.Fatal("CheckSafetensors accepted a file openSafetensors refuses")
			}
			return
		}
		defer st.Close()
		for name, e := range st.entries {
			if _, _, err := st.read(name, e.Shape); err != nil && checked {
				if _, known := stDTypes[e.DType]; known {
					t.Fatalf("checked file: tensor %s does not read: %v", name, err)
				}
			}
		}
	})
}
