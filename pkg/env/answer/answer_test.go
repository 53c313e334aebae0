package answer

import (
	"math"
	"strings"
	"testing"
)

func TestBoxed(t *testing.T) {
	tests := []struct {
		in     string
		want   string
		wantOK bool
	}{
		{`The answer is $\boxed{42}$.`, "42", true},
		{`\boxed{1} then corrected: \boxed{2}`, "2", true},
		{`\boxed{\frac{1}{2}}`, `\frac{1}{2}`, true},
		{`\boxed{\{1, 2\}}`, `\{1, 2\}`, true}, // escaped braces still balance
		{`so \fbox{7}`, "7", true},
		{`\boxed{3} and \fbox{4}`, "4", true},
		{`\fbox{4} and \boxed{3}`, "3", true},
		{`$\boxed 5$`, "5", true},
		{`\boxed {x+1}`, "x+1", true},
		{`\boxed{\text{(A)}}`, `\text{(A)}`, true},
		{`no box here`, "", false},
		{`\boxed{unclosed`, "", false},
		{`\boxed{}`, "", true},
		{`\boxedfoo{1}`, "", false},           // a different command
		{`\boxed{9} \boxedfoo{1}`, "9", true}, // skip the longer command name
		{`The final answer is \boxed{\dfrac{3}{4}}.`, `\dfrac{3}{4}`, true},
	}
	for _, tt := range tests {
		got, ok := Boxed(tt.in)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("Boxed(%q) = (%q, %v), want (%q, %v)", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestNormalizeNumber(t *testing.T) {
	tests := []struct {
		in     string
		want   float64
		wantOK bool
	}{
		{"42", 42, true},
		{" 42 ", 42, true},
		{"-7", -7, true},
		{"\u22127", -7, true},
		{"+3", 3, true},
		{"3.50", 3.5, true},
		{".5", 0.5, true},
		{"18.", 18, true},
		{"1,000", 1000, true},
		{"1,234,567.5", 1234567.5, true},
		{"1{,}000", 1000, true},
		{`10\!000`, 10000, true},
		{"$18", 18, true},
		{`\$18.00`, 18, true},
		{"$1,200.", 1200, true},
		{"50%", 50, true},
		{`12.5\%`, 12.5, true},
		{"3/4", 0.75, true},
		{"-3/4", -0.75, true},
		{`\frac{1}{2}`, 0.5, true},
		{`\dfrac{3}{4}`, 0.75, true},
		{`\tfrac{-1}{4}`, -0.25, true},
		{`-\frac{2}{8}`, -0.25, true},
		{`\frac12`, 0.5, true},
		{`{7}`, 7, true},
		{"1e3", 1000, true},
		{"1,2", 0, false}, // a list, not a thousands separator
		{"12,34", 0, false},
		{"1/0", 0, false},
		{`\frac{x}{2}`, 0, false},
		{`\sqrt{2}`, 0, false},
		{"inf", 0, false},
		{"NaN", 0, false},
		{"0x10", 0, false},
		{"1e999", 0, false},
		{"five", 0, false},
		{"", 0, false},
		{"(1,2)", 0, false},
		{"1/2/3", 0, false},
	}
	for _, tt := range tests {
		got, ok := NormalizeNumber(tt.in)
		if ok != tt.wantOK || (ok && math.Abs(got-tt.want) > 1e-12) {
			t.Errorf("NormalizeNumber(%q) = (%v, %v), want (%v, %v)", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestMathEqual(t *testing.T) {
	tests := []struct {
		pred, gold string
		want       bool
	}{
		// GSM8K style: plain integers, predictions decorated.
		{"72", "72", true},
		{"$72.00", "72", true},
		{"1,000", "1000", true},
		{"72.", "72", true},
		{"73", "72", false},
		{"-5", "5", false},
		// MATH style.
		{`\frac{1}{2}`, "0.5", true},
		{`\dfrac{1}{2}`, `\frac{1}{2}`, true},
		{"1/2", `\frac12`, true},
		{`\frac{1}{3}`, "0.3333333333", true}, // within 1e-6 relative
		{`\frac{1}{3}`, "0.333", false},
		{"1000000", "1000000.5", true}, // 5e-7 relative
		{"1000", "1000.5", false},
		{"0", "0", true},
		{"0", "0.0000001", false},
		{`\left( 1, 2 \right)`, "(1,2)", true},
		{`(1, 2)`, "(2,1)", false},
		{`x^2 + 1`, `x^2+1`, true},
		{`\text{(A)}`, "(A)", true},
		{`5\text{ cm}`, "5cm", true},
		{`$\sqrt{2}$`, `\sqrt{2}`, true},
		{`\sqrt{2}.`, `\sqrt{2}`, true},
		{`\sqrt{3}`, `\sqrt{2}`, false},
		{`\text{Monday}`, `\text{ Monday }`, true},
		{"", "", false}, // an empty prediction never matches
		{"", "0", false},
	}
	for _, tt := range tests {
		if got := MathEqual(tt.pred, tt.gold); got != tt.want {
			t.Errorf("MathEqual(%q, %q) = %v, want %v", tt.pred, tt.gold, got, tt.want)
		}
	}
}

func TestGSM8KGold(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{"Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72", false},
		{"The total is 1,200 dollars.\n#### 1,200", "1200", false},
		{"She owes -5.\n####   -5  \n", "-5", false},
		{"#### 3\nthen again #### 4", "4", false},
		{"no marker 72", "", true},
		{"#### ", "", true},
	}
	for _, tt := range tests {
		got, err := GSM8KGold(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("GSM8KGold(%q) = (%q, %v), want (%q, err=%v)", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
	if _, err := GSM8KGold("no marker"); err == nil || !strings.Contains(err.Error(), "####") {
		t.Errorf("error should mention the missing marker, got %v", err)
	}
}

func TestGSM8KEndToEnd(t *testing.T) {
	gold, err := GSM8KGold("Step one.\n#### 1,080")
	if err != nil {
		t.Fatal(err)
	}
	pred, ok := Boxed(`So she earns $\boxed{\$1,080}$ in total.`)
	if !ok || !MathEqual(pred, gold) {
		t.Errorf("pred %q (ok=%v) should equal gold %q", pred, ok, gold)
	}
}

func TestNormalizeQA(t *testing.T) {
	tests := []struct{ in, want string }{
		{"The Eiffel Tower", "eiffel tower"},
		{"  an   apple, a pear!  ", "apple pear"},
		{"Theater", "theater"}, // articles only as whole words
		{"anchor a-team", "anchor ateam"},
		{"the_the", "thethe"}, // underscore is punctuation, removed before articles
		{"U.S.A.", "usa"},
		{"Paris (France)", "paris france"},
		{"Café the Ünïcode", "café ünïcode"},
		{"A", ""},
		{"«the» answer", "« » answer"}, // non-ASCII punctuation is kept, as in Python
		{"don't", "dont"},
		{"\tNew\nYork\u00a0City", "new york city"},
	}
	for _, tt := range tests {
		if got := NormalizeQA(tt.in); got != tt.want {
			t.Errorf("NormalizeQA(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestExactMatch(t *testing.T) {
	golds := []string{"Barack Obama", "Obama"}
	tests := []struct {
		pred string
		want bool
	}{
		{"barack obama", true},
		{"Obama.", true},
		{"the obama", true},
		{"Michelle Obama", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := ExactMatch(tt.pred, golds); got != tt.want {
			t.Errorf("ExactMatch(%q, %q) = %v, want %v", tt.pred, golds, got, tt.want)
		}
	}
	if ExactMatch("anything", nil) {
		t.Error("no golds must never match")
	}
}

// MathDecide decides a match, and a mismatch only between numbers; QADecide only a match.
func TestDecide(t *testing.T) {
	for _, c := range []struct {
		pred           string
		golds          []string
		equal, decided bool
	}{
		{"4", []string{"4"}, true, true},
		{"4.0", []string{"4"}, true, true},
		{"5", []string{"4"}, false, true},
		{`\frac{1}{2}`, []string{"0.5"}, true, true},
		{`\frac{\sqrt{2}}{2}`, []string{`\frac{1}{\sqrt{2}}`}, false, false}, // equal, but not to the rule
		{"x + 1", []string{"4"}, false, false},
		{"5", []string{`\sqrt{2}`}, false, false},
		{"5", []string{"4", "four"}, false, false},
		{`\text{(A)}`, []string{"(A)"}, true, true},
		{"5", nil, false, false},
	} {
		if e, d := MathDecide(c.pred, c.golds); e != c.equal || d != c.decided {
			t.Errorf("MathDecide(%q, %q) = %v, %v; want %v, %v", c.pred, c.golds, e, d, c.equal, c.decided)
		}
	}
	if e, d := QADecide("The Eiffel Tower", []string{"eiffel tower"}); !e || !d {
		t.Errorf("QADecide match: %v %v", e, d)
	}
	if e, d := QADecide("Eiffel's tower", []string{"eiffel tower"}); e || d {
		t.Errorf("QADecide mismatch: %v %v", e, d)
	}
}
