package env

import (
	"strings"

	"github.com/drmas/drmas/pkg/env/answer"
)

// Tags the orchestras write and parse. A toy tokenizer adds each of them (see Tags) as one token.
const (
	TagSearchOpen  = "<search>"
	TagSearchClose = "</search>"
	TagAnswerOpen  = "<answer>"
	TagAnswerClose = "</answer>"
	TagVerifyOpen  = "<verify>"
	TagVerifyClose = "</verify>"
	TagInfoOpen    = "<information>"
	TagInfoClose   = "</information>"
	TagThinkOpen   = "<think>"
	TagThinkClose  = "</think>"
	// TagBoxedOpen opens a math answer; the matching close is a plain "}".
	TagBoxedOpen = `\boxed{`
)

// Verdicts the verifiers emit inside <verify></verify>.
const (
	VerdictApprove = "approve"
	VerdictReject  = "reject"
	VerdictYes     = "yes"
	VerdictNo      = "no"
)

// Tags returns every tag string the orchestras use, in a fixed order, for tokenizers that add them as
// single tokens.
func Tags() []string {
	return []string{
		TagSearchOpen, TagSearchClose, TagAnswerOpen, TagAnswerClose, TagVerifyOpen, TagVerifyClose,
		TagInfoOpen, TagInfoClose, TagThinkOpen, TagThinkClose, TagBoxedOpen,
	}
}

// Verdicts returns the verdict words, which toy tokenizers add as single tokens so that a decision
// is one sampled token.
func Verdicts() []string {
	return []string{VerdictApprove, VerdictReject, VerdictYes, VerdictNo}
}

// ExtractTag returns the trimmed content of the last complete <tag>...</tag> pair in s (tag is the
// bare name, e.g. "search"); ok is false when s holds no such pair.
func ExtractTag(s, tag string) (content string, ok bool) {
	open, close := "<"+tag+">", "</"+tag+">"
	end := strings.LastIndex(s, close)
	if end < 0 {
		return "", false
	}
	start := strings.LastIndex(s[:end], open)
	if start < 0 {
		return "", false
	}
	return strings.TrimSpace(s[start+len(open) : end]), true
}

// Parser reads an agent's response: content is what the orchestra acts on (a verdict, a query, an
// answer) and valid says whether the output had the required form.
type Parser func(response string) (content string, valid bool)

// TagParser parses the last <tag>...</tag> of a response. With values, the content (lowercased) must
// be one of them; without, it must be non-empty.
func TagParser(tag string, values ...string) Parser {
	return func(s string) (string, bool) {
		c, ok := ExtractTag(s, tag)
		if !ok {
			return "", false
		}
		if len(values) == 0 {
			return c, c != ""
		}
		c = strings.ToLower(c)
		for _, v := range values {
			if c == v {
				return c, true
			}
		}
		return c, false
	}
}

// BoxedParser parses the last \boxed{...} of a response; a response without one, or with an empty
// one, is invalid.
func BoxedParser(s string) (string, bool) {
	c, ok := answer.Boxed(s)
	c = strings.TrimSpace(c)
	return c, ok && c != ""
}

// parserFor returns the parser of a tag name as configs spell it: "boxed" for \boxed{}, otherwise the
// bare tag name, optionally restricted to values.
func parserFor(tag string, values ...string) Parser {
	if tag == "boxed" {
		return BoxedParser
	}
	return TagParser(tag, values...)
}
