package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// Pre-tokenizer regexes of the common byte-level BPE families, as written in
// their tokenizer.json files.
const (
	// GPT2Pattern is the pattern of the ByteLevel pre-tokenizer with use_regex true.
	GPT2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// Qwen2Pattern is the Split pattern of Qwen2, Qwen2.5 and Qwen3.
	Qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// Llama3Pattern is the Split pattern of Llama 3, 3.1 and 3.2.
	Llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// splitBehavior is what a Split pre-tokenizer does with the text its pattern matches.
type splitBehavior int

const (
	splitIsolated           splitBehavior = iota // matches and gaps are separate pieces
	splitRemoved                                 // gaps are pieces, matches are dropped
	splitMergedWithPrevious                      // each match joins the piece before it
	splitMergedWithNext                          // each match joins the piece after it
)

var splitBehaviors = map[string]splitBehavior{
	"Isolated":           splitIsolated,
	"Removed":            splitRemoved,
	"MergedWithPrevious": splitMergedWithPrevious,
	"MergedWithNext":     splitMergedWithNext,
}

// splitter cuts text into pieces with a regex. regexp2 runs in its default
// (.NET) mode, which is the one that agrees with Python's `regex` and with
// Oniguruma on these patterns: \s is Unicode White_Space, \p{L} and \p{N} are
// Unicode categories, (?!...) works as written. The known patterns (GPT-2,
// Qwen2, Llama 3) run on hand-written matchers instead; the tests check both
// against Python's output.
type splitter struct {
	re       *regexp2.Regexp
	fast     fastMatcher // nil for other patterns
	behavior splitBehavior
}

// foldedContractions spells out the case-insensitive contractions of the
// Qwen2 and Llama 3 patterns: regexp2's (?i) misses that 'ſ' (U+017F) folds
// to 's', which Python's regex and Oniguruma match.
const (
	ignoreCaseContractions = `(?i:'s|'t|'re|'ve|'m|'ll|'d)`
	foldedContractions     = `(?:'[sSſ]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])`
)

func newSplitter(pattern string, behavior splitBehavior) (*splitter, error) {
	re, err := regexp2.Compile(strings.ReplaceAll(pattern, ignoreCaseContractions, foldedContractions), regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("compile pre-tokenizer regex %q: %w", pattern, err)
	}
	return &splitter{re: re, fast: fastMatchers[pattern], behavior: behavior}, nil
}

// span is a byte range [start, end) of a string.
type span struct{ start, end int }

// runeTable decodes s into runes and the byte offset of each rune (plus one
// final entry, len(s)). Each byte of an invalid UTF-8 sequence becomes its own
// utf8.RuneError rune, so byte offsets stay exact and no input byte is lost.
func runeTable(s string) ([]rune, []int) {
	runes := make([]rune, 0, len(s))
	offs := make([]int, 0, len(s)+1)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		runes = append(runes, r)
		offs = append(offs, i)
		i += n
	}
	offs = append(offs, len(s))
	return runes, offs
}

// split returns the byte spans of the pieces of s.
func (sp *splitter) split(s string) []span {
	runes, offs := runeTable(s)
	var matches []span
	if sp.fast != nil {
		matches = fastSplit(sp.fast, runes)
	} else {
		matches = sp.regexMatches(runes)
	}
	for i := range matches {
		matches[i] = span{offs[matches[i].start], offs[matches[i].end]}
	}
	return cutAt(len(s), matches, sp.behavior)
}

// regexMatches returns the non-empty matches of the regex in runes, as rune
// index spans.
func (sp *splitter) regexMatches(runes []rune) []span {
	var matches []span
	m, err := sp.re.FindRunesMatch(runes)
	for ; m != nil && err == nil; m, err = sp.re.FindNextMatch(m) {
		if m.Length > 0 {
			matches = append(matches, span{m.Index, m.Index + m.Length})
		}
	}
	if err != nil {
		// regexp2 fails only when a match timeout is set; none is.
		panic(fmt.Sprintf("pre-tokenizer regex: %v", err))
	}
	return matches
}

// cutAt turns the matches found in a string of length n into pieces the way
// Hugging Face's Split pre-tokenizer does for behavior b: first the string is
// cut into alternating gaps and matches, then matches are kept apart, dropped,
// or joined to the neighbouring gap.
func cutAt(n int, matches []span, b splitBehavior) []span {
	type piece struct {
		span
		match bool
	}
	pieces := make([]piece, 0, 2*len(matches)+1)
	last := 0
	for _, m := range matches {
		if m.start > last {
			pieces = append(pieces, piece{span{last, m.start}, false})
		}
		pieces = append(pieces, piece{m, true})
		last = m.end
	}
	if last < n {
		pieces = append(pieces, piece{span{last, n}, false})
	}

	out := make([]span, 0, len(pieces))
	switch b {
	case splitIsolated:
		for _, p := range pieces {
			out = append(out, p.span)
		}
	case splitRemoved:
		for _, p := range pieces {
			if !p.match {
				out = append(out, p.span)
			}
		}
	case splitMergedWithPrevious:
		prevMatch := false
		for _, p := range pieces {
			if p.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = p.end
			} else {
				out = append(out, p.span)
			}
			prevMatch = p.match
		}
	case splitMergedWithNext:
		// Walk backwards: a match joins the piece after it unless that piece
		// is itself a match.
		prevMatch := false
		for i := len(pieces) - 1; i >= 0; i-- {
			p := pieces[i]
			if p.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].start = p.start
			} else {
				out = append(out, p.span)
			}
			prevMatch = p.match
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	}
	return out
}
