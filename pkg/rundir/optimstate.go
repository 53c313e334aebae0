package rundir

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// OptimMeta is what an optimizer state file carries in its safetensors __metadata__: the step of the
// checkpoint and the model it belongs to, and the rank of world that wrote it (0 of 1 unsharded), so
// that a file of another checkpoint or model put in its place is found (a manifest alone vouches
// only for the bytes it lists).
func OptimMeta(step int, model string, rank, world int) map[string]string {
	return map[string]string{"drmas.step": strconv.Itoa(step), "drmas.model": model,
		"drmas.rank": strconv.Itoa(rank), "drmas.world": strconv.Itoa(world)}
}

// OptimState is a model folder's optim.json: its optimizer's step and learning rate, beside the
// optimizer's tensors (optim.safetensors, or the ranks' files optim.index.json names), whatever shard
// stage wrote them.
type OptimState struct {
	Step int     `json:"step"`
	LR   float64 `json:"lr"`
}

// WriteOptimState writes dir's optim.json.
func WriteOptimState(dir string, st OptimState) error {
	b, _ := json.MarshalIndent(st, "", "  ")
	return os.WriteFile(filepath.Join(dir, "optim.json"), b, 0o644)
}

// ReadOptimState reads dir's optim.json.
func ReadOptimState(dir string) (OptimState, error) {
	var st OptimState
	b, err := os.ReadFile(filepath.Join(dir, "optim.json"))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", filepath.Join(dir, "optim.json"), err)
	}
	return st, nil
}

// checkOptimState checks, without loading it, that a model folder's optimizer state can be restored:
// the tensors the index of a sharded state (optim.index.json) assigns to a file are in that file, and
// the state holds exp_avg.X and exp_avg_sq.X for the same names X, which for a full model (not an
// adapter) are weights of the model; each file belongs to this checkpoint's step and model
// (OptimMeta; a checkpoint of an older drmas carries none in any file). An index that names a file
// that lacks its tensors, another model's tensors, or a file of another step is damage like a
// truncated file: --resume falls back to an older checkpoint instead of training from it.
func checkOptimState(dir string, adapter bool, step int, model string) error {
	idx, sharded, err := ReadOptimIndex(dir)
	if err != nil {
		return err
	}
	where := filepath.Join(dir, "optim.safetensors")
	var names []string
	files := map[string]map[string]string{} // file → its metadata
	if sharded {
		where = filepath.Join(dir, OptimIndexFile)
		byFile := map[string][]string{}
		for t, f := range idx.WeightMap {
			byFile[f] = append(byFile[f], t)
			names = append(names, t)
		}
		for f, want := range byFile {
			have, meta, err := safetensorsHeader(filepath.Join(dir, f))
			if err != nil {
				return err
			}
			files[f] = meta
			for _, t := range want {
				if !have[t] {
					return fmt.Errorf("%s: tensor %s is not in %s, which it names", where, t, f)
				}
			}
		}
	} else {
		have, meta, err := safetensorsHeader(where)
		if err != nil {
			return err
		}
		files["optim.safetensors"] = meta
		for t := range have {
			names = append(names, t)
		}
	}
	if err := checkOptimMeta(dir, files, step, model, idx.WorldSize); err != nil {
		return err
	}
	return checkMoments(dir, where, names, adapter)
}

// checkOptimMeta checks that the optimizer files of a model folder belong to the checkpoint (step)
// and the model they are in, each partition to the rank its name gives: all of them carry OptimMeta,
// or none does (an older drmas's checkpoint).
func checkOptimMeta(dir string, files map[string]map[string]string, step int, model string, world int) error {
	carried := 0
	for _, meta := range files {
		if meta["drmas.step"] != "" {
			carried++
		}
	}
	if carried == 0 {
		return nil
	}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		meta, path := files[f], filepath.Join(dir, f)
		want := OptimMeta(step, model, 0, 1)
		if world > 0 {
			var r, w int
			if _, err := fmt.Sscanf(f, "optim.rank-%d-of-%d.safetensors", &r, &w); err == nil {
				want = OptimMeta(step, model, r, w)
			}
		}
		if meta["drmas.step"] == "" {
			return fmt.Errorf("%s: carries no step and model while the folder's other optimizer files do: a file of another checkpoint (an older drmas's)", path)
		}
		for _, k := range []string{"drmas.step", "drmas.model", "drmas.rank", "drmas.world"} {
			if meta[k] != want[k] {
				return fmt.Errorf("%s: %s %q, but it is in the checkpoint of step %d, model %s (want %q): a file of another checkpoint or model", path, k, meta[k], step, model, want[k])
			}
		}
	}
	return nil
}

// checkMoments checks that optimizer tensor names (from where) pair exp_avg.X with exp_avg_sq.X
// and, for a full model, that every X is a weight of the model folder dir.
func checkMoments(dir, where string, names []string, adapter bool) error {
	moments := map[string]int{}
	for _, n := range names {
		switch {
		case strings.HasPrefix(n, "exp_avg."):
			moments[strings.TrimPrefix(n, "exp_avg.")]++
		case strings.HasPrefix(n, "exp_avg_sq."):
			moments[strings.TrimPrefix(n, "exp_avg_sq.")] += 2
		case strings.HasPrefix(n, "master."):
		default:
			return fmt.Errorf("%s: %s is not an optimizer tensor (exp_avg.*, exp_avg_sq.*, master.*)", where, n)
		}
	}
	if len(moments) == 0 {
		return fmt.Errorf("%s: no optimizer tensors", where)
	}
	var weights map[string]bool
	if !adapter {
		w, err := modelWeightNames(dir)
		if err != nil {
			return err
		}
		weights = w
	}
	params := make([]string, 0, len(moments))
	for p := range moments {
		params = append(params, p)
	}
	sort.Strings(params)
	for _, p := range params {
		if moments[p] != 3 {
			return fmt.Errorf("%s: %s has only one of exp_avg and exp_avg_sq", where, p)
		}
		if weights != nil && !weights[p] {
			return fmt.Errorf("%s: optimizer state for %s, which is not a weight of the model in %s", where, p, dir)
		}
	}
	return nil
}

// modelWeightNames lists the tensors of a model folder: model.safetensors, or the shards its
// model.safetensors.index.json maps.
func modelWeightNames(dir string) (map[string]bool, error) {
	single := filepath.Join(dir, "model.safetensors")
	if RegularFile(single) {
		have, _, err := safetensorsHeader(single)
		return have, err
	}
	path := filepath.Join(dir, "model.safetensors.index.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]bool{}
	for t := range idx.WeightMap {
		out[t] = true
	}
	return out, nil
}

// maxHeader bounds a safetensors header read here (a 7B model's is well under 1 MB).
const maxHeader = 100 << 20

// safetensorsHeader reads the tensor names and the metadata of a safetensors file's header: an
// 8-byte little-endian length, then that many bytes of JSON whose keys other than __metadata__ are
// the tensors. A header that does not fit the file is an error that names the file and quotes none of
// its bytes.
func safetensorsHeader(path string) (map[string]bool, map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	var n uint64
	if err := binary.Read(f, binary.LittleEndian, &n); err != nil {
		return nil, nil, fmt.Errorf("%s: no safetensors header", path)
	}
	if n > maxHeader || n > uint64(st.Size())-8 {
		return nil, nil, fmt.Errorf("%s: not a safetensors file (its header length does not fit the file)", path)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, nil, fmt.Errorf("%s: header cut short", path)
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(b, &hdr); err != nil {
		return nil, nil, fmt.Errorf("%s: the header is not a JSON object", path)
	}
	out := map[string]bool{}
	for k := range hdr {
		if k != "__metadata__" {
			out[k] = true
		}
	}
	var meta map[string]string
	if raw, ok := hdr["__metadata__"]; ok {
		if err := json.Unmarshal(raw, &meta); err != nil {
			return nil, nil, fmt.Errorf("%s: the header's __metadata__ is not a string map", path)
		}
	}
	return out, meta, nil
}
