package choice

import (
	"strings"
	"testing"
)

func TestSet(t *testing.T) {
	s := NewSet("colour")
	red := s.Add("red")
	s.Add("blue")
	if red != "red" || !s.Has("blue") || s.Has("green") {
		t.Fatalf("Add/Has: %v", s.Names())
	}
	if got := s.String(); got != "red, blue" {
		t.Fatalf("String = %q, want registration order", got)
	}
	if err := s.Check("red"); err != nil {
		t.Fatal(err)
	}
	err := s.Check("green")
	if err == nil || !strings.Contains(err.Error(), `unknown colour "green": want one of red, blue`) {
		t.Fatalf("Check(green) = %v", err)
	}
	names := s.Names()
	names[0] = "changed"
	if !s.Has("red") {
		t.Fatal("Names returned the set's own slice")
	}
}

func TestAddTwicePanics(t *testing.T) {
	s := NewSet("colour")
	s.Add("red")
	for _, name := range []string{"red", ""} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Add(%q) did not panic", name)
				}
			}()
			s.Add(name)
		}()
	}
}

func TestCovers(t *testing.T) {
	s := NewSet("colour")
	s.Add("red")
	s.Add("blue")
	s.Covers([]string{"blue", "red"})
	for _, impl := range [][]string{{"red"}, {"red", "blue", "green"}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Covers(%v) did not panic", impl)
				}
			}()
			s.Covers(impl)
		}()
	}
}
