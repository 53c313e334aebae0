package main

import (
	"errors"
	"strings"
	"testing"
)

// Start-up values that would silently disable a guard are refused as bad input (exit 2), naming the
// flag: an API key of white space (before: every client got 401), from the flag or DRMAS_API_KEY,
// before the model loads; --device-memory NaN (before: it turned the memory check off).
func TestStartUpRefusesUnusableValues(t *testing.T) {
	for _, tc := range []struct {
		env  string
		args []string
		says string
	}{
		{"", []string{"serve", "--model", "no-such-folder", "--api-key", "   "}, "--api-key"},
		{"", []string{"serve", "--model", "no-such-folder", "--api-key", "key\n"}, "white space"},
		{" \t ", []string{"serve", "--model", "no-such-folder"}, "DRMAS_API_KEY"},
		{"", []string{"train", "--config", "../../configs/toy-math.yaml", "--dry-run", "--device-memory", "NaN"}, `--device-memory "NaN"`},
		{"", []string{"train", "--config", "../../configs/toy-math.yaml", "--dry-run", "--device-memory", "cpu=nanGB"}, "positive, finite"},
	} {
		t.Setenv("DRMAS_API_KEY", tc.env)
		_, _, err := execDrmas(t, tc.args...)
		var ue usageError
		if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%v (DRMAS_API_KEY %q): %v, want a usage error naming %s", tc.args, tc.env, err, tc.says)
		}
	}
}
