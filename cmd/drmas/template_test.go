package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A model folder whose chat template nests 100,000 parentheses is refused at start-up, naming the
// file, within a second (before: Go's fatal stack overflow killed the process).
func TestDeepChatTemplateRefusedAtStartUp(t *testing.T) {
	dir, _ := toyModelDir(t)
	src := "{{ " + strings.Repeat("(", 100_000) + "1" + strings.Repeat(")", 100_000) + " }}"
	data, _ := json.Marshal(map[string]any{"chat_template": src})
	file := filepath.Join(dir, "tokenizer_config.json")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, _, err := execDrmas(t, "generate", "--model", dir, "--prompt", "hi", "--max-new-tokens", "1")
	if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "nested") {
		t.Fatalf("generate with a 100,000-deep chat template: %v, want an error naming %s", err, file)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("refused after %v", took)
	}
}
