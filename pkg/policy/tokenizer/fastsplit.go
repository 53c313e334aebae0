package tokenizer

import "unicode"

// Hand-written matchers for the three common pre-tokenizer patterns. They
// find the same matches as the regexes (the tests check both against
// Python's `regex` module and against each other on random text) at a
// fraction of regexp2's cost, which allocates per match.

// runeClass is how the patterns see a rune.
type runeClass uint8

const (
	classOther   runeClass = iota // [^\s\p{L}\p{N}]
	classLetter                   // \p{L}
	classNumber                   // \p{N}
	classSpace                    // \s other than \r and \n
	classNewline                  // \r or \n
)

var asciiClass [128]runeClass

func init() {
	for r := rune(0); r < 128; r++ {
		asciiClass[r] = classify(r)
	}
}

func classify(r rune) runeClass {
	switch {
	case r == '\r' || r == '\n':
		return classNewline
	case unicode.IsSpace(r): // White_Space, as regexp2's and Python's \s
		return classSpace
	case unicode.IsLetter(r):
		return classLetter
	case unicode.IsNumber(r):
		return classNumber
	default:
		return classOther
	}
}

func classOf(r rune) runeClass {
	if r >= 0 && r < 128 {
		return asciiClass[r]
	}
	return classify(r)
}

func isWhite(c runeClass) bool { return c == classSpace || c == classNewline }

// fastMatcher returns the match of a known pattern starting at rune i, as
// its end (exclusive), or i when none starts there.
type fastMatcher func(r []rune, cls []runeClass, i int) int

// fastMatchers maps the known patterns to their matchers.
var fastMatchers = map[string]fastMatcher{
	GPT2Pattern:   matchGPT2,
	Qwen2Pattern:  func(r []rune, cls []runeClass, i int) int { return matchSplitFamily(r, cls, i, 1) },
	Llama3Pattern: func(r []rune, cls []runeClass, i int) int { return matchSplitFamily(r, cls, i, 3) },
}

// contraction returns the length (2 or 3) of 's 't 're 've 'm 'll 'd at r[i:],
// or 0. With ignoreCase, letters compare under simple case folding, where
// 'ſ' (U+017F) is an 's', as in Python's regex (?i:...).
func contraction(r []rune, i int, ignoreCase bool) int {
	if r[i] != '\'' || i+1 >= len(r) {
		return 0
	}
	fold := func(c rune) rune {
		if !ignoreCase {
			return c
		}
		if c >= 'A' && c <= 'Z' {
			return c + ('a' - 'A')
		}
		if c == 'ſ' {
			return 's'
		}
		return c
	}
	switch fold(r[i+1]) {
	case 's', 't', 'm', 'd':
		return 2
	}
	if i+2 >= len(r) {
		return 0
	}
	switch string([]rune{fold(r[i+1]), fold(r[i+2])}) {
	case "re", "ve", "ll":
		return 3
	}
	return 0
}

// run returns the end of the run of runes of class c starting at i.
func run(cls []runeClass, i int, c runeClass) int {
	for i < len(cls) && cls[i] == c {
		i++
	}
	return i
}

// whiteEnd returns the end of the whitespace run starting at i.
func whiteEnd(cls []runeClass, i int) int {
	for i < len(cls) && isWhite(cls[i]) {
		i++
	}
	return i
}

// matchTrailingSpace matches \s+(?!\S)|\s+ at i, where cls[i] is white:
// a run of whitespace followed by a non-space leaves its last space for the
// next match (so " world" keeps its space), unless the run is one space.
func matchTrailingSpace(cls []runeClass, i int) int {
	e := whiteEnd(cls, i)
	if e < len(cls) && e-1 > i {
		return e - 1
	}
	return e
}

// matchSplitFamily matches the Qwen2 (maxDigits 1) and Llama 3 (maxDigits 3)
// pattern: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,n}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchSplitFamily(r []rune, cls []runeClass, i, maxDigits int) int {
	n := len(r)
	if k := contraction(r, i, true); k > 0 {
		return i + k
	}
	c := cls[i]
	switch {
	case c == classLetter:
		return run(cls, i, classLetter)
	case c != classNewline && c != classNumber && i+1 < n && cls[i+1] == classLetter:
		return run(cls, i+1, classLetter)
	case c == classNumber:
		e := i
		for e < n && e-i < maxDigits && cls[e] == classNumber {
			e++
		}
		return e
	}
	j := i
	if r[j] == ' ' && j+1 < n {
		j++
	}
	if cls[j] == classOther {
		e := run(cls, j, classOther)
		return run(cls, e, classNewline)
	}
	if !isWhite(c) {
		return i
	}
	// \s*[\r\n]+: the whitespace run up to and including its last newline.
	e := whiteEnd(cls, i)
	for k := e - 1; k >= i; k-- {
		if cls[k] == classNewline {
			return k + 1
		}
	}
	return matchTrailingSpace(cls, i)
}

// matchGPT2 matches GPT-2's pattern: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|
// ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func matchGPT2(r []rune, cls []runeClass, i int) int {
	if k := contraction(r, i, false); k > 0 {
		return i + k
	}
	j := i
	if r[j] == ' ' && j+1 < len(r) && !isWhite(cls[j+1]) {
		j++
	}
	if c := cls[j]; c != classSpace && c != classNewline {
		return run(cls, j, c)
	}
	return matchTrailingSpace(cls, i)
}

// fastSplit returns the matches of m in r, as rune index spans.
func fastSplit(m fastMatcher, r []rune) []span {
	cls := make([]runeClass, len(r))
	for i, x := range r {
		cls[i] = classOf(x)
	}
	var out []span
	for i := 0; i < len(r); {
		e := m(r, cls, i)
		if e == i { // no match here: the rune falls into a gap
			i++
			continue
		}
		out = append(out, span{i, e})
		i = e
	}
	return out
}
