package serve

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/policytest"
	"github.com/drmas/drmas/pkg/torch"
)

// secret is what the files outside the root hold: it must never come back in an answer, nor the
// number its first 8 bytes make as a safetensors header length, nor its first character.
const secret = "Zroot:$6$SECRET-HASH-0123456789abcdef:19000:0:99999:7:::\n"

// leaks says what of secret (or of the file's bytes) an answer's text carries, "" for nothing.
func leaks(msg string) string {
	n := binary.LittleEndian.Uint64([]byte(secret)[:8])
	switch {
	case strings.Contains(msg, "SECRET"):
		return "the file's text"
	case strings.Contains(msg, strconv.FormatUint(n, 10)):
		return "the header length its first 8 bytes make"
	case strings.Contains(msg, "'Z'"):
		return "its first character"
	}
	return ""
}

// copyDir copies the plain files of src into a new folder dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Every file a reload or an adapter load opens must resolve under the weights root: a folder under
// the root one of whose files (config.json, model.safetensors, a shard index or a shard, the
// tokenizer's, adapter_config.json, adapter_model.safetensors) links outside gets the same 403 as a
// folder outside the root, through every endpoint, and no answer quotes the target's bytes (before:
// the folder loaded, or the error quoted the file's first bytes as a header length or its first
// character). A link swapped in after update_config is caught when reload_weights opens the folder.
// Files under the root that are not what their names say are refused without quoting them either.
func TestFilesLinkedOutsideTheRootAreRefused(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	target := filepath.Join(outside, "shadow")
	if err := os.WriteFile(target, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	s, hs := toyServer(t, Options{WeightUpdates: true, WeightsRoot: root})
	url := hs.URL
	single, sharded, adapter := filepath.Join(outside, "single"), filepath.Join(outside, "sharded"), filepath.Join(outside, "adapter")
	if err := torch.Do(func() error {
		if err := s.pol.Save(single); err != nil {
			return err
		}
		return s.pol.Model.SaveSharded(sharded, 4096)
	}); err != nil {
		t.Fatal(err)
	}
	policytest.Adapter(t, s.pol.Model.Base(), adapter, "x", policy.LoRAConfig{Rank: 2, Alpha: 4, Targets: []string{"q_proj"}}, 3, 1)
	shards, _ := filepath.Glob(filepath.Join(sharded, "model-0*-of-*.safetensors"))
	if len(shards) < 2 {
		t.Fatalf("the sharded save wrote %d shards, want ≥ 2", len(shards))
	}
	if _, err := os.Stat(filepath.Join(single, "tokenizer.json")); err != nil {
		t.Fatalf("the saved policy has no tokenizer.json: %v", err)
	}

	reloads := func(dir string) map[string]any {
		return map[string]any{
			"/update_weights_from_disk": map[string]any{"model_path": dir},
			"/collective_rpc":           map[string]any{"method": "update_config", "kwargs": map[string]any{"overrides": map[string]any{"model_config": map[string]any{"model": dir}}}},
		}
	}
	loads := func(dir string) map[string]any {
		return map[string]any{
			"/v1/load_lora_adapter": map[string]any{"lora_name": "x", "lora_path": dir},
			"/load_lora_adapter":    map[string]any{"lora_name": "x", "lora_path": dir},
		}
	}
	for _, tc := range []struct {
		from, file string
		eps        func(string) map[string]any
	}{
		{single, "config.json", reloads},
		{single, "model.safetensors", reloads},
		{single, "tokenizer.json", reloads},
		{sharded, "model.safetensors.index.json", reloads},
		{sharded, filepath.Base(shards[1]), reloads},
		{adapter, policy.AdapterConfigFile, loads},
		{adapter, policy.AdapterWeightsFile, loads},
	} {
		dir := filepath.Join(root, "link-"+tc.file)
		copyDir(t, tc.from, dir)
		os.Remove(filepath.Join(dir, tc.file))
		if err := os.Symlink(target, filepath.Join(dir, tc.file)); err != nil {
			t.Fatal(err)
		}
		for ep, body := range tc.eps(dir) {
			code, r := call(t, url+ep, "", body)
			text := fmt.Sprint(r)
			if code != 403 || !strings.Contains(text, "weights root") {
				t.Errorf("%s with %s linked outside the root: HTTP %d %v, want 403", ep, tc.file, code, r)
			}
			if l := leaks(text); l != "" {
				t.Errorf("%s with %s linked outside the root: the answer quotes %s: %v", ep, tc.file, l, r)
			}
		}
	}

	// A link swapped in between update_config and reload_weights.
	late := filepath.Join(root, "late")
	copyDir(t, single, late)
	if code, r := call(t, url+"/collective_rpc", "", reloads(late)["/collective_rpc"]); code != 200 {
		t.Fatalf("update_config of a clean folder: HTTP %d %v", code, r)
	}
	os.Remove(filepath.Join(late, "model.safetensors"))
	os.Symlink(target, filepath.Join(late, "model.safetensors"))
	if code, r := call(t, url+"/collective_rpc", "", map[string]any{"method": "reload_weights"}); code != 403 || leaks(fmt.Sprint(r)) != "" {
		t.Errorf("reload_weights after a link was swapped in: HTTP %d %v, want 403 quoting nothing", code, r)
	}

	// Plain files under the root holding the secret where JSON or safetensors are expected.
	for _, tc := range []struct {
		from, file string
		eps        func(string) map[string]any
	}{
		{single, "config.json", reloads},
		{single, "model.safetensors", reloads},
		{sharded, "model.safetensors.index.json", reloads},
		{adapter, policy.AdapterConfigFile, loads},
		{adapter, policy.AdapterWeightsFile, loads},
	} {
		dir := filepath.Join(root, "plain-"+tc.file)
		copyDir(t, tc.from, dir)
		os.WriteFile(filepath.Join(dir, tc.file), []byte(secret), 0o644)
		for ep, body := range tc.eps(dir) {
			if ep == "/collective_rpc" {
				call(t, url+ep, "", body)
				ep, body = "/collective_rpc", map[string]any{"method": "reload_weights"}
			}
			code, r := call(t, url+ep, "", body)
			text := fmt.Sprint(r)
			if code == 200 && r["success"] != false && r["results"] == nil {
				t.Errorf("%s with %s not a real one: HTTP %d %v, want a refusal", ep, tc.file, code, r)
			}
			if l := leaks(text); l != "" {
				t.Errorf("%s with %s not a real one: the answer quotes %s: %v", ep, tc.file, l, r)
			} else if !strings.Contains(text, tc.file) {
				t.Errorf("%s with %s not a real one: the answer does not name the file: %v", ep, tc.file, r)
			}
		}
	}
}

// An adapter with a NaN weight is refused (as full-weight reloads are), by both load endpoints and
// at start-up; the server keeps serving without it.
func TestNaNAdapterRefused(t *testing.T) {
	root := t.TempDir()
	s, hs := toyServer(t, Options{WeightUpdates: true, WeightsRoot: root})
	dir := filepath.Join(root, "nan")
	a := policytest.Adapter(t, s.pol.Model.Base(), "", "nan", policy.LoRAConfig{Rank: 2, Alpha: 4, Targets: []string{"q_proj", "v_proj"}}, 3, 1)
	if err := torch.Do(func() error {
		if err := torch.NoGrad(func() error {
			a.Parameters()[1].T.MustFill_(ts.FloatScalar(math.NaN()))
			return nil
		}); err != nil {
			return err
		}
		return a.Save(dir)
	}); err != nil {
		t.Fatal(err)
	}
	code, r := call(t, hs.URL+"/v1/load_lora_adapter", "", map[string]any{"lora_name": "nan", "lora_path": dir})
	if code != 400 || !strings.Contains(fmt.Sprint(r), "NaN") {
		t.Errorf("vLLM load of a NaN adapter: HTTP %d %v, want 400 naming NaN", code, r)
	}
	code, r = call(t, hs.URL+"/load_lora_adapter", "", map[string]any{"lora_name": "nan", "lora_path": dir})
	if code != 400 || r["success"] != false || !strings.Contains(fmt.Sprint(r), "NaN") {
		t.Errorf("SGLang load of a NaN adapter: HTTP %d %v, want 400 naming NaN", code, r)
	}
	if code, r := call(t, hs.URL+"/v1/models/nan", "", nil); code != 404 {
		t.Errorf("the NaN adapter is listed: HTTP %d %v", code, r)
	}
	if _, err := New(s.pol, toyDir, Options{LoRAs: []LoRA{{Name: "nan", Path: dir}}}); err == nil || !strings.Contains(err.Error(), "NaN") {
		t.Errorf("--lora with a NaN adapter: %v, want a refusal naming NaN", err)
	}
}
