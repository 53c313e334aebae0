package normalize

import "testing"

// AddPresetForTest is the one registration line a new preset adds to presets, made for the length of
// a test.
func AddPresetForTest(t *testing.T, name string, opts func() Options) {
	saved := presets
	presets = append(presets[:len(presets):len(presets)], struct {
		name string
		opts func() Options
	}{name, opts})
	t.Cleanup(func() { presets = saved })
}
