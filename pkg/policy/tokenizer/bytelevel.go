package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// GPT-2's byte-to-unicode table: every byte is shown as one printable rune so
// that BPE vocabularies hold only visible characters. Printable Latin-1 bytes
// stand for themselves; the rest (controls, space, 0x7f-0xa0, 0xad) are moved
// to U+0100 and up, in byte order. Space becomes 'Ġ' (U+0120), '\n' 'Ċ' (U+010A).
var (
	byteToRune [256]rune
	runeToByte = make(map[rune]byte, 256)
	// byteToString caches string(byteToRune[b]).
	byteToString [256]string
)

func init() {
	n := 0
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)
		r := rune(b)
		if !printable {
			r = rune(256 + n)
			n++
		}
		byteToRune[b] = r
		runeToByte[r] = byte(b)
		byteToString[b] = string(r)
	}
}

// byteLevelEncode maps each byte of s to its rune in the byte-level alphabet.
func byteLevelEncode(s string) string {
	var sb strings.Builder
	sb.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		sb.WriteString(byteToString[s[i]])
	}
	return sb.String()
}

// appendByteLevelDecoded appends the bytes that token stands for. As in
// Hugging Face's ByteLevel decoder, a token with a rune outside the
// byte-level alphabet (an added token such as "<|im_end|>" whose every rune
// is printable ASCII maps through the table to itself; one with a space or a
// CJK rune does not) is taken as its raw UTF-8 bytes.
func appendByteLevelDecoded(dst []byte, token string) []byte {
	start := len(dst)
	for _, r := range token {
		b, ok := runeToByte[r]
		if !ok {
			return append(dst[:start], token...)
		}
		dst = append(dst, b)
	}
	return dst
}

// lossyUTF8 converts b to a string the way Rust's String::from_utf8_lossy
// does (and so Hugging Face's decoder): every maximal ill-formed subpart
// becomes one U+FFFD. A truncated 3-byte sequence "\xe4\xb8" gives one U+FFFD;
// two stray bytes "\xff\xfe" give two.
func lossyUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b) + 8)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || n > 1 {
			sb.Write(b[i : i+n])
			i += n
			continue
		}
		sb.WriteRune(utf8.RuneError)
		i += maximalSubpart(b[i:])
	}
	return sb.String()
}

// maximalSubpart returns the length of the longest prefix of b (at least 1)
// that starts like a well-formed UTF-8 sequence, for b not starting with one.
func maximalSubpart(b []byte) int {
	lead := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xbf) // allowed range of the second byte
	switch {
	case lead >= 0xc2 && lead <= 0xdf:
		need = 1
	case lead == 0xe0:
		need, lo = 2, 0xa0
	case lead >= 0xe1 && lead <= 0xec, lead == 0xee, lead == 0xef:
		need = 2
	case lead == 0xed:
		need, hi = 2, 0x9f
	case lead == 0xf0:
		need, lo = 3, 0x90
	case lead >= 0xf1 && lead <= 0xf3:
		need = 3
	case lead == 0xf4:
		need, hi = 3, 0x8f
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		c := b[n]
		if k == 0 && (c < lo || c > hi) || k > 0 && (c < 0x80 || c > 0xbf) {
			break
		}
		n++
	}
	return n
}
