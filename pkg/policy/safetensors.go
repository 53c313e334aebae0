package policy

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/files"

	"github.com/sugarme/gotch"
)

// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON mapping each
// tensor name to {dtype, shape, data_offsets: [begin, end)} (offsets relative to the end of the
// header) plus an optional "__metadata__" string map, then the raw little-endian data.

// stEntry is one tensor in a safetensors header.
type stEntry struct {
	DType   string   `json:"dtype"`
	Shape   []int64  `json:"shape"`
	Offsets [2]int64 `json:"data_offsets"`
}

// stDTypes maps safetensors dtype names to gotch dtypes (the ones a checkpoint's float weights use).
var stDTypes = map[string]gotch.DType{"F32": gotch.Float, "BF16": gotch.BFloat16, "F16": gotch.Half, "F64": gotch.Double}

func stDTypeName(d gotch.DType) string {
	for k, v := range stDTypes {
		if v == d {
			return k
		}
	}
	return ""
}

// stFile is an open safetensors file.
type stFile struct {
	path    string
	f       *os.File
	base    int64 // where the data starts
	entries map[string]stEntry
}

// maxHeader bounds the JSON header; real ones are well under a megabyte per thousand tensors.
const maxHeader = 100 << 20

func openSafetensors(path string) (*stFile, error) {
	f, err := files.Open(path, 0) // regular files only: a FIFO would block

	if err != nil {
		return nil, err
	}
	st, err := readHeader(f, path)
	if err != nil {
		f.Close()
		return nil, err
	}
	return st, nil
}

func readHeader(f *os.File, path string) (*stFile, error) {
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	var lenBuf [8]byte
	if _, err := io.ReadFull(f, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("%s: truncated: no header (%d bytes)", path, info.Size())
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > maxHeader || int64(n) > info.Size()-8 {
		return nil, fmt.Errorf("%s: header length %d does not fit the file (%d bytes): truncated or not safetensors", path, n, info.Size())
	}
	hdr := make([]byte, n)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil, fmt.Errorf("%s: reading header: %w", path, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &raw); err != nil {
		return nil, fmt.Errorf("%s: header: %w", path, err)
	}
	st := &stFile{path: path, f: f, base: 8 + int64(n), entries: make(map[string]stEntry, len(raw))}
	dataLen := info.Size() - st.base
	for name, v := range raw {
		if name == "__metadata__" {
			continue
		}
		var e stEntry
		if err := json.Unmarshal(v, &e); err != nil {
			return nil, fmt.Errorf("%s: tensor %s: %w", path, name, err)
		}
		if e.Offsets[0] < 0 || e.Offsets[1] < e.Offsets[0] {
			return nil, fmt.Errorf("%s: tensor %s: bad data_offsets %v", path, name, e.Offsets)
		}
		if e.Offsets[1] > dataLen {
			return nil, fmt.Errorf("%s: tensor %s: data [%d, %d) runs past the end of the file (%d data bytes): truncated",
				path, name, e.Offsets[0], e.Offsets[1], dataLen)
		}
		st.entries[name] = e
	}
	if err := checkTiling(st.entries, dataLen); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

// checkTiling checks that the tensors' data_offsets tile the data section exactly, as the reference
// loader (safetensors' validate_offsets) requires: sorted by offset, each tensor begins where the
// one before ends, and the last ends with the file. Overlapping tensors would share bytes (the
// second reading the first one's data), and a gap or a tail hides bytes no tensor accounts for.
func checkTiling(entries map[string]stEntry, dataLen int64) error {
	names := slices.Collect(maps.Keys(entries))
	slices.SortFunc(names, func(a, b string) int {
		ea, eb := entries[a].Offsets, entries[b].Offsets
		if c := cmp.Compare(ea[0], eb[0]); c != 0 {
			return c
		}
		if c := cmp.Compare(ea[1], eb[1]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	var end int64
	prev := ""
	for _, name := range names {
		o := entries[name].Offsets
		switch {
		case o[0] < end:
			return fmt.Errorf("tensor %s: data [%d, %d) overlaps tensor %s's, which ends at %d", name, o[0], o[1], prev, end)
		case o[0] > end && prev == "":
			return fmt.Errorf("tensor %s: data [%d, %d) leaves the first %d data bytes to no tensor", name, o[0], o[1], o[0])
		case o[0] > end:
			return fmt.Errorf("tensor %s: data [%d, %d) leaves a gap of %d bytes after tensor %s's, which ends at %d", name, o[0], o[1], o[0]-end, prev, end)
		}
		end, prev = o[1], name
	}
	if end != dataLen {
		return fmt.Errorf("the tensors' data end at byte %d of the %d-byte data section: %d bytes belong to no tensor", end, dataLen, dataLen-end)
	}
	return nil
}

// read returns the raw bytes and dtype of a tensor, checking its shape against want.
func (s *stFile) read(name string, want []int64) ([]byte, gotch.DType, error) {
	e, ok := s.entries[name]
	if !ok {
		return nil, 0, fmt.Errorf("%s: missing tensor %s", s.path, name)
	}
	dt, ok := stDTypes[e.DType]
	if !ok {
		return nil, 0, fmt.Errorf("%s: tensor %s: dtype %s is not supported (want F32, BF16, F16 or F64)", s.path, name, e.DType)
	}
	if !slices.Equal(e.Shape, want) {
		return nil, 0, fmt.Errorf("%s: tensor %s has shape %v, want %v", s.path, name, e.Shape, want)
	}
	n, err := numBytes(e.Shape, int64(dt.Size()))
	if err != nil || e.Offsets[1]-e.Offsets[0] != n {
		return nil, 0, fmt.Errorf("%s: tensor %s: %d data bytes for %s%v, want %d", s.path, name, e.Offsets[1]-e.Offsets[0], e.DType, e.Shape, n)
	}
	buf := make([]byte, n)
	if _, err := s.f.ReadAt(buf, s.base+e.Offsets[0]); err != nil {
		return nil, 0, fmt.Errorf("%s: tensor %s: %w", s.path, name, err)
	}
	return buf, dt, nil
}

func (s *stFile) Close() error { return s.f.Close() }

// checkpoint is the set of safetensors files of a model folder, indexed by tensor name.
type checkpoint struct {
	files  []*stFile
	byName map[string]*stFile
}

// openCheckpoint opens dir/model.safetensors, or the shards listed by
// dir/model.safetensors.index.json.
func openCheckpoint(dir string) (*checkpoint, error) {
	ck := &checkpoint{byName: map[string]*stFile{}}
	single := filepath.Join(dir, "model.safetensors")
	if _, err := os.Stat(single); err == nil {
		st, err := openSafetensors(single)
		if err != nil {
			return nil, err
		}
		ck.files = append(ck.files, st)
		for name := range st.entries {
			ck.byName[name] = st
		}
		return ck, nil
	}
	indexPath := filepath.Join(dir, "model.safetensors.index.json")
	data, err := files.Read(indexPath, files.MaxJSON)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: no model.safetensors or model.safetensors.index.json", dir)
	}
	if err != nil {
		return nil, err
	}
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &index); err != nil {
		return nil, fmt.Errorf("%s: %w", indexPath, err)
	}
	shards := map[string]*stFile{}
	for _, shard := range slices.Sorted(maps.Values(index.WeightMap)) {
		if shards[shard] != nil {
			continue
		}
		if strings.Contains(shard, "/") || strings.Contains(shard, `\`) {
			ck.Close()
			return nil, fmt.Errorf("%s: shard %q must be a file name in the folder", indexPath, shard)
		}
		st, err := openSafetensors(filepath.Join(dir, shard))
		if err != nil {
			ck.Close()
			return nil, err
		}
		shards[shard] = st
		ck.files = append(ck.files, st)
	}
	for name, shard := range index.WeightMap {
		ck.byName[name] = shards[shard]
	}
	return ck, nil
}

func (c *checkpoint) read(name string, shape []int64) ([]byte, gotch.DType, error) {
	st, ok := c.byName[name]
	if !ok {
		return nil, 0, fmt.Errorf("missing tensor %s", name)
	}
	return st.read(name, shape)
}

func (c *checkpoint) has(name string) bool { _, ok := c.byName[name]; return ok }

func (c *checkpoint) Close() {
	for _, f := range c.files {
		f.Close()
	}
}

// stTensor is one tensor to write; Data is called once, when its turn comes, so that a large
// model is never held twice in memory.
type stTensor struct {
	Name  string
	DType gotch.DType
	Shape []int64
	Data  func() ([]byte, error)
}

func (t stTensor) nbytes() int64 {
	n := int64(t.DType.Size())
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// writeSafetensors writes tensors (in the order given) to path, through a temporary file so that a
// failed write never leaves a half-written checkpoint under the final name.
func writeSafetensors(path string, tensors []stTensor, metadata map[string]string) error {
	header := map[string]any{}
	if metadata != nil {
		header["__metadata__"] = metadata
	}
	var off int64
	for _, t := range tensors {
		name := stDTypeName(t.DType)
		if name == "" {
			return fmt.Errorf("tensor %s: dtype %v cannot be saved", t.Name, t.DType)
		}
		header[t.Name] = stEntry{DType: name, Shape: t.Shape, Offsets: [2]int64{off, off + t.nbytes()}}
		off += t.nbytes()
	}
	hdr, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(hdr)%8 != 0 { // the data should start 8-byte aligned
		hdr = append(hdr, ' ')
	}
	return atomicfile.Write(path, func(f io.Writer) error {
		w := bufio.NewWriterSize(f, 1<<20)
		var lenBuf [8]byte
		binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(hdr)))
		w.Write(lenBuf[:])
		w.Write(hdr)
		for _, t := range tensors {
			data, err := t.Data()
			if err != nil {
				return fmt.Errorf("tensor %s: %w", t.Name, err)
			}
			if int64(len(data)) != t.nbytes() {
				return fmt.Errorf("tensor %s: %d bytes, want %d", t.Name, len(data), t.nbytes())
			}
			if _, err := w.Write(data); err != nil {
				return err
			}
		}
		return w.Flush()
	})
}

// CheckSafetensors checks that a safetensors file is whole: a readable header whose tensors all lie
// inside the file with as many bytes as their dtype and shape need. It reads no tensor data.
func CheckSafetensors(path string) error {
	st, err := openSafetensors(path)
	if err != nil {
		return err
	}
	defer st.Close()
	for name, e := range st.entries {
		size, ok := stSizes[e.DType]
		if !ok {
			continue // a dtype drmas does not load is not damage
		}
		n, err := numBytes(e.Shape, size)
		if err != nil || n != e.Offsets[1]-e.Offsets[0] {
			return fmt.Errorf("%s: tensor %s: %d data bytes for %s%v", path, name, e.Offsets[1]-e.Offsets[0], e.DType, e.Shape)
		}
	}
	return nil
}

// stSizes are the element sizes of the safetensors dtypes.
var stSizes = map[string]int64{"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}

// numBytes is the byte size of a tensor, refusing negative dimensions and overflow.
func numBytes(shape []int64, elem int64) (int64, error) {
	n := elem
	for _, d := range shape {
		if d < 0 || (d > 0 && n > math.MaxInt64/d) {
			return 0, fmt.Errorf("shape %v: negative or too large", shape)
		}
		n *= d
	}
	return n, nil
}

// DefaultMaxShardBytes is the largest safetensors file Save writes before it shards, as transformers'
// save_pretrained (max_shard_size "5GB").
const DefaultMaxShardBytes int64 = 5_000_000_000

// shardName is transformers' name of shard i (0-based) of n.
func shardName(i, n int) string { return fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, n) }

// planShards splits tensors, in order, into runs of at most maxBytes data bytes each (a tensor larger
// than maxBytes gets a shard of its own), as transformers does.
func planShards(tensors []stTensor, maxBytes int64) [][]stTensor {
	var shards [][]stTensor
	var size int64
	for _, t := range tensors {
		if len(shards) == 0 || (size+t.nbytes() > maxBytes && size > 0) {
			shards = append(shards, nil)
			size = 0
		}
		shards[len(shards)-1] = append(shards[len(shards)-1], t)
		size += t.nbytes()
	}
	return shards
}

// writeCheckpoint writes tensors to dir as model.safetensors when their data fit in maxBytes, else as
// transformers' shards model-0000i-of-0000n.safetensors with model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {tensor: shard}}). Each tensor's data is fetched
// when it is written, so memory holds one tensor's bytes at a time, never a copy of the model. Files of
// the other layout left by an earlier save to dir (which openCheckpoint would otherwise read) are
// removed once the new layout is complete.
func writeCheckpoint(dir string, tensors []stTensor, maxBytes int64, metadata map[string]string) error {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxShardBytes
	}
	single := filepath.Join(dir, "model.safetensors")
	indexPath := filepath.Join(dir, "model.safetensors.index.json")
	shards := planShards(tensors, maxBytes)
	if len(shards) <= 1 {
		if err := writeSafetensors(single, tensors, metadata); err != nil {
			return fmt.Errorf("save %s: %w", single, err)
		}
		return removeShards(dir, indexPath)
	}
	weightMap := map[string]string{}
	var total int64
	for i, shard := range shards {
		name := shardName(i, len(shards))
		if err := writeSafetensors(filepath.Join(dir, name), shard, metadata); err != nil {
			return fmt.Errorf("save %s: %w", filepath.Join(dir, name), err)
		}
		for _, t := range shard {
			weightMap[t.Name] = name
			total += t.nbytes()
		}
	}
	old, _ := readWeightMap(indexPath) // shards of an earlier save that this one does not overwrite
	index := struct {
		Metadata  map[string]int64  `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}{map[string]int64{"total_size": total}, weightMap}
	js, err := json.MarshalIndent(index, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteBytes(indexPath, append(js, '\n')); err != nil {
		return fmt.Errorf("save %s: %w", indexPath, err)
	}
	for _, shard := range old {
		if !slices.Contains(slices.Collect(maps.Values(weightMap)), shard) && shardPattern(shard) {
			os.Remove(filepath.Join(dir, shard))
		}
	}
	if err := os.Remove(single); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("save %s: removing the single-file checkpoint of an earlier save: %w", dir, err)
	}
	return nil
}

// readWeightMap returns the shard file names an index lists (nil when there is no index).
func readWeightMap(indexPath string) ([]string, error) {
	data, err := os.ReadFile(indexPath)
	if err != nil {
		return nil, err
	}
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &index); err != nil {
		return nil, err
	}
	return slices.Compact(slices.Sorted(maps.Values(index.WeightMap))), nil
}

// removeShards removes a sharded checkpoint's index and the shards it lists (only files named as
// transformers and drmas name shards), after a single-file save to the same folder.
func removeShards(dir, indexPath string) error {
	shards, err := readWeightMap(indexPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := os.Remove(indexPath); err != nil {
		return fmt.Errorf("save %s: removing the shard index of an earlier save: %w", dir, err)
	}
	for _, s := range shards {
		if shardPattern(s) {
			os.Remove(filepath.Join(dir, s))
		}
	}
	return nil
}

// shardPattern reports whether name is a shard name of the form model-00001-of-00002.safetensors.
func shardPattern(name string) bool {
	var i, n int
	_, err := fmt.Sscanf(name, "model-%05d-of-%05d.safetensors", &i, &n)
	return err == nil && name == shardName(i-1, n) && !strings.ContainsAny(name, `/\`)
}
