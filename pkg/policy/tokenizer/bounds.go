package tokenizer

import (
	"fmt"
	"strings"
)

// Bounds on a chat template's source, checked before gonja parses it. gonja's parser recurses once
// per nesting level (a parenthesis, a bracket, a block inside a block), some ten frames deep each:
// 100,000 nested parentheses overflowed Go's stack, which is fatal (no recover), and a 4.4 MB
// nested template took 77 s to parse. Real templates are a few kilobytes with blocks nested a few
// levels deep (the test models': 0.4–6.7 KB, at most 6 levels of blocks, Mistral Small 3.1's);
// at the bounds, gonja parses the worst shapes tried in about half a second.
const (
	maxSourceBytes = 256 << 10 // a template's source
	maxSourceDepth = 64        // brackets nested inside a tag; blocks nested in blocks
	maxUnaryRun    = 64        // unary operators in a row (not not not ..., - - - ...): each one nests
	// maxTagOperators bounds the operators of one tag ({{ }} or {% %}): binary and unary operators,
	// attributes, subscripts, calls, filters, comparisons and the keyword operators. gonja's tree for a
	// chain (1+1+…, x.a.a…, a|f|f…) is as deep as the chain is long, and rendering one that fails took
	// time growing faster than its square (x.a… of 2,000 links: 4 s a render). Real templates' tags
	// have at most a few dozen (Mistral Small 3.1's, Qwen2.5's: 23, 18).
	maxTagOperators = 256
)

// operatorWords are the keyword operators a tag's operators count.
var operatorWords = map[string]bool{"and": true, "or": true, "not": true, "in": true, "is": true, "if": true, "else": true}

// TemplateBoundsError is a chat template refused before it is parsed, for its size or nesting.
type TemplateBoundsError struct{ Msg string }

func (e *TemplateBoundsError) Error() string { return e.Msg }

// blockTags are the statements that open a block closed by end<name>.
var blockTags = map[string]bool{"if": true, "for": true, "macro": true, "call": true, "filter": true,
	"block": true, "raw": true, "with": true, "autoescape": true}

// checkTemplateBounds refuses a source larger than maxSourceBytes, or nesting deeper than
// maxSourceDepth (brackets inside {{ }} and {% %}, and blocks inside blocks), or with more than
// maxUnaryRun unary operators in a row, in one pass over the text.
func checkTemplateBounds(src string) error {
	if len(src) > maxSourceBytes {
		return &TemplateBoundsError{fmt.Sprintf("template source of %d bytes: more than the %d allowed", len(src), maxSourceBytes)}
	}
	s := &boundsScan{src: src, line: 1}
	for i := 0; i < len(src); i++ {
		c := src[i]
		if c == '\n' {
			s.line++
		}
		if c != '{' || i+1 >= len(src) {
			continue
		}
		switch src[i+1] {
		case '#': // a comment: skip to its end
			end := strings.Index(src[i+2:], "#}")
			if end < 0 {
				return nil // unterminated: gonja's error says so
			}
			s.line += strings.Count(src[i:i+2+end], "\n")
			i += 2 + end + 1
			continue
		case '{', '%':
		default:
			continue
		}
		j, stop, err := s.tag(i)
		if err != nil || stop {
			return err
		}
		i = j
	}
	return nil
}

// boundsScan is checkTemplateBounds' pass over a source: the line it is at (for the messages) and
// the blocks open.
type boundsScan struct {
	src    string
	line   int
	blocks int
}

// tooDeep is the error of nesting (of what) past maxSourceDepth at the current line.
func (s *boundsScan) tooDeep(what string) error {
	return &TemplateBoundsError{fmt.Sprintf("template %s nested more than %d deep at line %d", what, maxSourceDepth, s.line)}
}

// tooManyUnary is the error of a run of unary operators past maxUnaryRun at the current line.
func (s *boundsScan) tooManyUnary() error {
	return &TemplateBoundsError{fmt.Sprintf("template: more than %d unary operators in a row at line %d", maxUnaryRun, s.line)}
}

// tag checks the tag that opens at i ({{ or {%) and returns where it ends (its last byte, or past
// the end of a raw block's text); stop says the rest need not be checked (an unterminated raw block:
// gonja's error says so).
func (s *boundsScan) tag(i int) (end int, stop bool, err error) {
	stmt := s.src[i+1] == '%'
	first := ""
	if stmt {
		first = statementName(s.src, i+2)
	}
	j, hasAssign, err := s.tagBody(i+2, stmt)
	if err != nil || !stmt {
		return j, false, err
	}
	switch {
	case blockTags[first] || first == "set" && !hasAssign:
		if s.blocks++; s.blocks > maxSourceDepth {
			return j, false, s.tooDeep("blocks")
		}
	case strings.HasPrefix(first, "end"):
		s.blocks = max(s.blocks-1, 0)
	}
	if first == "raw" { // its text is not template code: skip to endraw
		end := strings.Index(s.src[j:], "endraw")
		if end < 0 {
			return j, true, nil
		}
		s.line += strings.Count(s.src[j:j+end], "\n")
		j += end
		s.blocks = max(s.blocks-1, 0)
	}
	return j, false, nil
}

// statementName is the name of the statement whose tag's text starts at k ("if", "endfor", "set"),
// after white space and white-space control.
func statementName(src string, k int) string {
	for k < len(src) && strings.IndexByte(" \t\r\n-+", src[k]) >= 0 {
		k++
	}
	e := k
	for e < len(src) && (src[e] == '_' || src[e] >= 'a' && src[e] <= 'z') {
		e++
	}
	return src[k:e]
}

// tooManyOperators is the error of a tag with more than maxTagOperators operators.
func (s *boundsScan) tooManyOperators() error {
	return &TemplateBoundsError{fmt.Sprintf("template: more than %d operators in one tag at line %d (a chain that long takes quadratic time to render; real templates' tags have a few dozen)", maxTagOperators, s.line)}
}

// tagBody scans a tag's text from j to its closing }} or %} (a statement's, when stmt), checking its
// brackets' depth, its runs of unary operators and its number of operators; strings are skipped. It
// returns the index of the closing delimiter's last byte and whether an = stands outside brackets (a
// set with a value).
func (s *boundsScan) tagBody(j int, stmt bool) (int, bool, error) {
	src := s.src
	depth, unary, ops := 0, 0, 0
	hasAssign := false
	for ; j < len(src); j++ {
		if d := src[j]; strings.IndexByte("([{.|+-*/%~=<>!", d) >= 0 || isIdentByte(d) && (j == 0 || !isIdentByte(src[j-1])) && operatorWords[identAt(src, j)] {
			if ops++; ops > maxTagOperators {
				return j, hasAssign, s.tooManyOperators()
			}
		}
		switch d := src[j]; d {
		case '\n':
			s.line++
		case '\'', '"':
			for j++; j < len(src) && src[j] != d; j++ {
				if src[j] == '\\' {
					j++
				} else if src[j] == '\n' {
					s.line++
				}
			}
			unary = 0
		case '(', '[', '{':
			if depth++; depth > maxSourceDepth {
				return j, hasAssign, s.tooDeep("brackets")
			}
			unary = 0
		case ')', ']':
			depth = max(depth-1, 0) // a stray closer must not raise the bound for later nesting
		case '}':
			if depth == 0 && !stmt && j+1 < len(src) && src[j+1] == '}' {
				return j + 1, hasAssign, nil
			}
			depth = max(depth-1, 0)
		case '%':
			if stmt && depth <= 0 && j+1 < len(src) && src[j+1] == '}' {
				return j + 1, hasAssign, nil
			}
		case '=':
			if depth == 0 {
				hasAssign = true
			}
		case '-', '+', '~':
			if unary++; unary > maxUnaryRun {
				return j, hasAssign, s.tooManyUnary()
			}
		case ' ', '\t', '\r':
		default:
			if d == 'n' && strings.HasPrefix(src[j:], "not") && (j+3 == len(src) || !isIdentByte(src[j+3])) && (j == 0 || !isIdentByte(src[j-1])) {
				if unary++; unary > maxUnaryRun {
					return j, hasAssign, s.tooManyUnary()
				}
				j += 2
				continue
			}
			unary = 0
		}
	}
	return j, hasAssign, nil
}

// identAt is the identifier (letters, digits, _) starting at j.
func identAt(src string, j int) string {
	e := j
	for e < len(src) && isIdentByte(src[e]) {
		e++
	}
	return src[j:e]
}

// isIdentByte says whether c can be part of an identifier.
func isIdentByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
