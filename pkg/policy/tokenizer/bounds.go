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
)

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
	line := 1
	tooDeep := func(what string) error {
		return &TemplateBoundsError{fmt.Sprintf("template %s nested more than %d deep at line %d", what, maxSourceDepth, line)}
	}
	blocks := 0
	for i := 0; i < len(src); i++ {
		c := src[i]
		if c == '\n' {
			line++
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
			line += strings.Count(src[i:i+2+end], "\n")
			i += 2 + end + 1
			continue
		case '{', '%':
		default:
			continue
		}
		stmt := src[i+1] == '%'
		// Inside the tag: brackets, strings, unary runs, until its closing }} or %}.
		j := i + 2
		depth, unary := 0, 0
		first := ""
		if stmt {
			k := j
			for k < len(src) && strings.IndexByte(" \t\r\n-+", src[k]) >= 0 {
				k++
			}
			e := k
			for e < len(src) && (src[e] == '_' || src[e] >= 'a' && src[e] <= 'z') {
				e++
			}
			first = src[k:e]
		}
		hasAssign := false
	tag:
		for ; j < len(src); j++ {
			switch d := src[j]; d {
			case '\n':
				line++
			case '\'', '"':
				for j++; j < len(src) && src[j] != d; j++ {
					if src[j] == '\\' {
						j++
					} else if src[j] == '\n' {
						line++
					}
				}
				unary = 0
			case '(', '[', '{':
				if depth++; depth > maxSourceDepth {
					return tooDeep("brackets")
				}
				unary = 0
			case ')', ']':
				depth = max(depth-1, 0) // a stray closer must not raise the bound for later nesting
			case '}':
				if depth == 0 && !stmt && j+1 < len(src) && src[j+1] == '}' {
					j++
					break tag
				}
				depth = max(depth-1, 0)
			case '%':
				if stmt && depth <= 0 && j+1 < len(src) && src[j+1] == '}' {
					j++
					break tag
				}
			case '=':
				if depth == 0 {
					hasAssign = true
				}
			case '-', '+', '~':
				if unary++; unary > maxUnaryRun {
					return &TemplateBoundsError{fmt.Sprintf("template: more than %d unary operators in a row at line %d", maxUnaryRun, line)}
				}
			case ' ', '\t', '\r':
			default:
				if d == 'n' && strings.HasPrefix(src[j:], "not") && (j+3 == len(src) || !isIdentByte(src[j+3])) && (j == 0 || !isIdentByte(src[j-1])) {
					if unary++; unary > maxUnaryRun {
						return &TemplateBoundsError{fmt.Sprintf("template: more than %d unary operators in a row at line %d", maxUnaryRun, line)}
					}
					j += 2
					continue
				}
				unary = 0
			}
		}
		if stmt {
			switch {
			case blockTags[first] || first == "set" && !hasAssign:
				if blocks++; blocks > maxSourceDepth {
					return tooDeep("blocks")
				}
			case strings.HasPrefix(first, "end"):
				blocks = max(blocks-1, 0)
			}
			if first == "raw" { // its text is not template code: skip to endraw
				end := strings.Index(src[j:], "endraw")
				if end < 0 {
					return nil
				}
				line += strings.Count(src[j:j+end], "\n")
				j += end
				blocks = max(blocks-1, 0)
			}
		}
		i = j
	}
	return nil
}

func isIdentByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
