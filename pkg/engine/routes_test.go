package engine

import (
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/llm"
)

// SGLang's meta_info.routed_experts is read for the tokens a forward saw (the prompt and the
// response but the last); a payload covering the last token too is cut to them; a missing one names
// the server flag, a wrong length the counts.
func TestSGLangRoutes(t *testing.T) {
	shape := llm.RouteShape{Layers: 2, TopK: 2}
	ids := func(tokens int) *string {
		r := &llm.Routes{Layers: 2, TopK: 2}
		for i := range tokens * 4 {
			r.IDs = append(r.IDs, int16(i%3))
		}
		s := r.Base64()
		return &s
	}
	for _, tokens := range []int{5, 6} {
		r, err := sglangRoutes(ids(tokens), shape, 5)
		if err != nil || r.Tokens() != 5 || r.IDs[19] != 19%3 {
			t.Fatalf("%d tokens given: %v, %v", tokens, r, err)
		}
	}
	if _, err := sglangRoutes(nil, shape, 5); err == nil || !strings.Contains(err.Error(), "--enable-return-routed-experts") {
		t.Fatalf("missing: %v", err)
	}
	if _, err := sglangRoutes(ids(3), shape, 5); err == nil || !strings.Contains(err.Error(), "covers 3 tokens, want 5") {
		t.Fatalf("short: %v", err)
	}
	bad := "AAAA"
	if _, err := sglangRoutes(&bad, shape, 1); err == nil {
		t.Fatal("3 bytes of a token of 16: accepted")
	}
}
