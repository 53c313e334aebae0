package main

import (
	"slices"
	"strings"
	"testing"
)

// The root command lists every command once, each with a short line, a long help and examples
// that call it.
func TestRootCommands(t *testing.T) {
	want := []string{"advantages", "bench", "estimators", "eval", "export", "generate", "inspect-grads", "plot",
		"roundtrip", "serve", "train", "version"}
	var got []string
	for _, c := range newRootCmd().Commands() {
		got = append(got, c.Name())
		if c.Short == "" {
			t.Errorf("%s: no Short", c.Name())
		}
		if !strings.Contains(c.Example, "drmas "+c.Name()) {
			t.Errorf("%s: no example calls it:\n%s", c.Name(), c.Example)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("commands %v, want %v", got, want)
	}
}

// drmas --help lists every command.
func TestRootHelp(t *testing.T) {
	out, _, err := execDrmas(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range newRootCmd().Commands() {
		if !strings.Contains(out, "\n  "+c.Name()+" ") {
			t.Errorf("--help does not list %s:\n%s", c.Name(), out)
		}
	}
}
